"""The vllm collector against slow, hung and odd targets (real HTTP servers on 127.0.0.1), and engine
histograms through an engine restart. Expected values come from the fixture pages' inputs
(fixtures/vllm/make_pages.py), not from the collector."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kvscope.agent.app.wiring import build_catalogue
from kvscope.agent.core.pipeline import Components
from kvscope.agent.core.readings import HistogramSample, Reading, Sample
from kvscope.agent.core.store import Store
from kvscope.agent.runtime.scheduler import Scheduler, collector_job
from kvscope.collectors.engines.vllm_metrics import SPEC, VllmMetricsCollector, VllmOptions
from kvscope.collectors.scrape.fetch import Page, ScrapeError, http_fetch
from testkit.paths import FIXTURES

pytestmark = pytest.mark.integration
HERE = FIXTURES / "vllm"
DP2, RESTART = "v0.33.0-cpu-offload-dp2.prom", "v0.33.0-cpu-offload-dp2-restart.prom"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def page(name: str) -> bytes:
    return (HERE / name).read_bytes()


class RawServer:
    """A listening socket whose answer the test writes byte by byte: a page at full speed, a trickle, or
    nothing at all. One thread per connection; `close()` ends them."""

    def __init__(self, body: bytes = b"", trickle: float = 0.0, trickle_headers: bool = False,
                 hang: bool = False, length: int | None = None) -> None:
        self.body, self.trickle, self.trickle_headers, self.hang = body, trickle, trickle_headers, hang
        self.length = len(body) if length is None else length
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/metrics"
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)  # the request
                if self.hang:
                    self._stop.wait(30)
                    return
                head = (f"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                        f"Content-Length: {self.length}\r\n\r\n").encode()
                self._send(conn, head, self.trickle if self.trickle_headers else 0.0)
                self._send(conn, self.body, self.trickle)
                self._stop.wait(30)  # keep the connection open: the client decides when it has enough
            except OSError:
                pass

    def _send(self, conn: socket.socket, data: bytes, every: float) -> None:
        if not every:
            conn.sendall(data)
            return
        for i in range(len(data)):
            if self._stop.wait(every):
                return
            conn.sendall(data[i : i + 1])

    def close(self) -> None:
        self._stop.set()
        self._sock.close()


@pytest.fixture
def servers() -> Iterator[list[RawServer]]:
    made: list[RawServer] = []
    yield made
    for srv in made:
        srv.close()


def _by_target(readings: list[Reading], name: str) -> dict[str, Any]:
    return {r.labels[1] if len(r.labels) == 2 else (r.labels[1], r.labels[2]): r.value
            for r in readings if isinstance(r, Sample) and r.name == name}


@pytest.mark.parametrize("where", ["body", "headers"])
def test_a_trickling_target_is_cut_off_at_its_whole_request_deadline(servers: list[RawServer], where: str) -> None:
    """A target sending one byte every 50 ms (a page of 8 KB would take 7 minutes) used to keep the read
    waiting for its 64 KiB chunk, checking the deadline only between chunks."""
    srv = RawServer(b"vllm:num_requests_running 1\n" * 300, trickle=0.05, trickle_headers=where == "headers")
    servers.append(srv)
    outcome: list[BaseException | Page] = []

    def fetch() -> None:
        try:
            outcome.append(http_fetch(srv.url, 0.5, 1 << 20))
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=fetch, daemon=True)
    start = time.monotonic()
    worker.start()
    worker.join(2.0)
    assert outcome, "http_fetch was still reading 2 s into a 0.5 s deadline"
    assert isinstance(outcome[0], ScrapeError) and outcome[0].kind == "timeout"
    assert time.monotonic() - start < 1.0


def test_a_trickling_target_does_not_hold_up_the_collector(servers: list[RawServer]) -> None:
    slow = RawServer(b"vllm:num_requests_running 1\n" * 300, trickle=0.05)
    servers.append(slow)
    collector = VllmMetricsCollector(VllmOptions(urls=[slow.url], scrape_timeout_seconds=0.5))
    done: list[list[Reading]] = []
    worker = threading.Thread(target=lambda: done.append(collector.collect()), daemon=True)
    worker.start()
    worker.join(2.0)  # the deadline is 0.5 s; the old collector was still reading after 30 s
    assert done, "collect() did not return"
    assert _by_target(done[0], "kvscope_scrape_target_up") == {slow.url: 0.0}
    assert _by_target(done[0], "kvscope_scrape_errors_total")[(slow.url, "timeout")] == 1


def test_hung_targets_cost_neither_the_healthy_ones_series_nor_the_collectors_health(
        servers: list[RawServer]) -> None:
    """Three hung targets at a 0.5 s deadline took 1.5 s one after another: past a 1.2 s collector timeout,
    so the healthy target's series left /metrics and collector_up was 0, with no error on any target."""
    healthy = RawServer(page(DP2))
    hung = [RawServer(hang=True) for _ in range(3)]
    servers.extend([healthy, *hung])
    urls = [h.url for h in hung] + [healthy.url]
    store = Store(build_catalogue(Components({"vllm": SPEC}, {})))
    collector = VllmMetricsCollector(VllmOptions(urls=urls, scrape_timeout_seconds=0.5))
    scheduler = Scheduler(store, [collector_job("vllm", collector, 60.0, 1.2)])
    scheduler.start()
    try:
        deadline = time.monotonic() + 10
        while store.value("kvscope_collector_runs_total", ("vllm",)) != 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert store.values("kvscope_collector_up") == {("vllm",): 1.0}
        assert store.values("kvscope_kv_lookup_tokens_total")[("vllm", MODEL, "0")] > 0
        errors = store.values("kvscope_scrape_errors_total")
        for h in hung:
            assert errors[("vllm", h.url, "timeout")] == 1
        assert store.values("kvscope_scrape_target_up")[("vllm", healthy.url)] == 1.0
    finally:
        scheduler.stop(timeout=2)


def test_a_request_still_running_is_not_repeated_and_its_late_answer_is_dropped() -> None:
    release = threading.Event()
    calls: list[float] = []

    def stuck(url: str, timeout: float, max_bytes: int) -> Page:  # a fetcher that ignores its deadline
        calls.append(time.monotonic())
        release.wait(10)
        return Page(page(DP2), framed=True)

    collector = VllmMetricsCollector(VllmOptions(urls=["http://t/metrics"], scrape_timeout_seconds=0.1),
                                     fetch=stuck)
    for _ in range(2):
        readings = collector.collect()
        assert _by_target(readings, "kvscope_scrape_target_up") == {"http://t/metrics": 0.0}
    assert len(calls) == 1 and not any(r.name.startswith("kvscope_kv_") for r in readings)
    release.set()
    time.sleep(0.1)
    readings = collector.collect()  # the late answer is dropped; a fresh request answers at once now
    assert len(calls) == 2
    assert _by_target(readings, "kvscope_scrape_errors_total")[("http://t/metrics", "timeout")] == 2
    assert any(r.name == "kvscope_kv_lookup_tokens_total" for r in readings)


def test_a_page_without_its_final_newline_is_read_whole_when_content_length_matched(
        servers: list[RawServer]) -> None:
    """Many pages in the wild end without a newline; with a Content-Length that was met, the last line is
    whole. It used to fail the whole page as truncated."""
    body = page(DP2) + b'vllm:num_requests_running{engine="0",model_name="last-line"} 7.0'
    srv = RawServer(body)
    servers.append(srv)
    collector = VllmMetricsCollector(VllmOptions(urls=[srv.url]))
    readings = collector.collect()
    assert _by_target(readings, "kvscope_scrape_target_up") == {srv.url: 1.0}
    assert sum(_by_target(readings, "kvscope_scrape_errors_total").values()) == 0
    running = {r.labels: r.value for r in readings if isinstance(r, Sample) and r.name == "kvscope_requests_running"}
    assert running[("vllm", "last-line", "0")] == 7.0


def test_a_histogram_with_only_sum_and_count_is_dropped_and_counted() -> None:
    text = (b'vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 3.0\n'
            b'vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.6\n'
            b'vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 0.2\n'
            b'vllm:prompt_tokens_total{engine="0",model_name="m"} 12.0\n')
    collector = VllmMetricsCollector(VllmOptions(urls=["http://t/metrics"]), fetch=lambda *_: Page(text, True))
    readings = collector.collect()
    assert not [r for r in readings if isinstance(r, HistogramSample)]
    assert _by_target(readings, "kvscope_scrape_malformed_lines_total") == {"http://t/metrics": 2.0}


def _without(body: bytes, *families: str) -> bytes:
    return b"".join(line for line in body.splitlines(keepends=True)
                    if not line.lstrip(b"# HELPTYPE").startswith(tuple(f.encode() for f in families)))


def test_engine_histograms_and_capacities_stay_exported_through_a_restart() -> None:
    """A restarted engine shows its histograms again only after it serves a request (and its offload
    config once the connector reports): until then the last readings stand, and the totals go on."""
    pages = [page(DP2)]
    store = Store(build_catalogue(Components({"vllm": SPEC}, {})))
    collector = VllmMetricsCollector(VllmOptions(urls=["http://t/metrics"]),
                                     fetch=lambda *_: Page(pages[0], framed=True))
    store.ingest("vllm", collector.collect(), now=1.0)
    base = ("vllm", MODEL, "0")
    ttft_before = store.histogram("kvscope_ttft_seconds", base)
    capacity = store.values("kvscope_tier_capacity_bytes")[(*base, "G2")]
    pages[0] = _without(page(RESTART), "vllm:time_to_first_token_seconds", "vllm:request_queue_time_seconds",
                        "vllm:request_prefill_time_seconds", "vllm:kv_offload_config_info")
    assert b"time_to_first_token" not in pages[0] and b"prefix_cache_queries" in pages[0]
    store.ingest("vllm", collector.collect(), now=2.0)
    for name in ("kvscope_ttft_seconds", "kvscope_queue_time_seconds", "kvscope_prefill_time_seconds"):
        assert base in store.values(name), f"{name} left the exposition in the gap"
    assert store.histogram("kvscope_ttft_seconds", base) == ttft_before
    assert store.values("kvscope_tier_capacity_bytes")[(*base, "G2")] == capacity
    pages[0] = page(RESTART)  # the restarted engine has served requests: its histograms are back
    store.ingest("vllm", collector.collect(), now=3.0)
    restarted = Store(build_catalogue(Components({"vllm": SPEC}, {})))
    restarted.ingest("vllm", VllmMetricsCollector(VllmOptions(urls=["x"]), fetch=lambda *_: Page(
        page(RESTART), framed=True)).collect(), now=0.0)
    assert store.histogram("kvscope_ttft_seconds", base)[3] == (
        ttft_before[3] + restarted.histogram("kvscope_ttft_seconds", base)[3])
    # an engine that leaves the page takes its held series with it
    pages[0] = _without(page(RESTART), "vllm:")
    store.ingest("vllm", collector.collect(), now=4.0)
    assert base not in store.values("kvscope_ttft_seconds")


def test_a_restart_that_reaches_the_same_totals_is_still_counted() -> None:
    """An engine that, restarted, served as much between two scrapes as before shows the same totals: no
    counter went back. Its process_start_time_seconds moved, so the page counts from zero again (a live
    vLLM in make e2e: 8 requests, restart, 8 requests, and the TTFT count stayed at 8 before this)."""
    pages: list[bytes | None] = [page(DP2)]

    def fetch(*_: object) -> Page:
        if pages[0] is None:
            raise ScrapeError("connect", "[Errno 111] Connection refused")
        return Page(pages[0], framed=True)

    store = Store(build_catalogue(Components({"vllm": SPEC}, {})))
    collector = VllmMetricsCollector(VllmOptions(urls=["http://t/metrics"]), fetch=fetch)
    base = ("vllm", MODEL, "0")
    store.ingest("vllm", collector.collect(), now=1.0)
    lookups, ttft = store.values("kvscope_kv_lookup_tokens_total")[base], store.histogram("kvscope_ttft_seconds", base)
    assert lookups > 0 and ttft[3] > 0 and base in store.values("kvscope_kv_cache_usage_ratio")
    store.ingest("vllm", collector.collect(), now=2.0)  # the same page again: nothing grew
    assert store.values("kvscope_kv_lookup_tokens_total")[base] == lookups
    pages[0] = None  # restarting: down for longer than the store's stale_after (5 collections)
    for now in range(3, 13):
        store.ingest("vllm", collector.collect(), now=float(now))
    assert store.values("kvscope_kv_lookup_tokens_total")[base] == lookups  # the totals stayed
    assert store.histogram("kvscope_ttft_seconds", base) == ttft
    assert base not in store.values("kvscope_kv_cache_usage_ratio")  # a down engine's gauges do not
    started = page(DP2).replace(b"process_start_time_seconds 1.79605655e+09",
                                b"process_start_time_seconds 1.79605755e+09")
    assert started != page(DP2)
    pages[0] = started
    store.ingest("vllm", collector.collect(), now=13.0)
    assert store.values("kvscope_kv_lookup_tokens_total")[base] == 2 * lookups
    after = store.histogram("kvscope_ttft_seconds", base)
    assert after[3] == 2 * ttft[3] and after[2] == pytest.approx(2 * ttft[2])
    assert store.values("kvscope_source_resets_total")[("vllm",)] > 0
    store.ingest("vllm", collector.collect(), now=14.0)  # the new life's same page: counted once
    assert store.values("kvscope_kv_lookup_tokens_total")[base] == 2 * lookups
    # a page without a start time (vLLM's multiprocess mode) is read as before: decreases are the resets
    bare = VllmMetricsCollector(VllmOptions(urls=["http://t/metrics"]), fetch=lambda *_: Page(
        _without(page(DP2), "process_start_time_seconds"), framed=True))
    assert bare.collect() and not bare._started


def test_the_other_engine_adapters_scrape_in_parallel_and_read_pages_whole(servers: list[RawServer]) -> None:
    """SGLang, LMCache and Dynamo share PageScraper: three hung targets cost one deadline there too, and
    a page whose Content-Length was met counts even without its final newline."""
    from kvscope.collectors.engines.sglang import SglangCollector, SglangOptions

    fixture = HERE.parent / "sglang" / "v0.5.10.post1-tp2.prom"
    healthy = RawServer(fixture.read_bytes().rstrip(b"\n"))
    hung = [RawServer(hang=True) for _ in range(3)]
    servers.extend([healthy, *hung])
    collector = SglangCollector(SglangOptions(urls=[h.url for h in hung] + [healthy.url], scrape_timeout_seconds=0.5))
    start = time.monotonic()
    readings = collector.collect()
    assert time.monotonic() - start < 1.0  # one after another this took 1.5 s
    up = _by_target(readings, "kvscope_scrape_target_up")
    assert up[healthy.url] == 1.0 and [up[h.url] for h in hung] == [0.0] * 3
    errors = _by_target(readings, "kvscope_scrape_errors_total")
    assert [errors[(h.url, "timeout")] for h in hung] == [1] * 3 and errors[(healthy.url, "truncated")] == 0
    assert any(r.name == "kvscope_kv_lookup_tokens_total" for r in readings)
