"""vLLM /metrics → contract: normalisation arithmetic, precedence, HTTP failures, resets, golden output.

Expected numbers come from the inputs the fixture pages were built from (fixtures/vllm/make_pages.py,
`engine_values`), not from the collector's own output.
"""

from __future__ import annotations

import contextlib
import http.server
import importlib.util
import logging
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kvscope.agent.app.wiring import build_catalogue, components
from kvscope.agent.config.settings import ConfigError, load_config
from kvscope.agent.core.pipeline import Components
from kvscope.agent.core.readings import HistogramSample, Reading, Sample
from kvscope.agent.core.store import Store
from kvscope.collectors.engines.vllm_map import Normaliser
from kvscope.collectors.engines.vllm_metrics import SPEC, VllmMetricsCollector, VllmOptions
from kvscope.collectors.scrape.exposition import ExpositionScanner
from kvscope.collectors.scrape.fetch import Page
from kvscope.exporters.prometheus.exposition import TextRenderer
from testkit.environment import require_tool
from testkit.paths import FIXTURES

HERE = FIXTURES / "vllm"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DP2, RESTART = "v0.33.0-cpu-offload-dp2.prom", "v0.33.0-cpu-offload-dp2-restart.prom"


def _make_pages() -> Any:
    spec = importlib.util.spec_from_file_location("make_pages", HERE / "make_pages.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


INPUTS = _make_pages()


def page(name: str) -> bytes:
    return (HERE / name).read_bytes()


def collect(text: bytes | str, **options: Any) -> dict[tuple[str, tuple[str, ...]], Reading]:
    body = text.encode() if isinstance(text, str) else text
    collector = VllmMetricsCollector(VllmOptions(urls=["http://t/metrics"], **options), fetch=lambda *_: Page(body))
    return {(r.name, r.labels): r for r in collector.collect()}


def value(readings: dict[tuple[str, tuple[str, ...]], Reading], name: str, *labels: str) -> float:
    reading = readings[(name, labels)]
    assert isinstance(reading, Sample)
    return reading.value


def names(readings: dict[tuple[str, tuple[str, ...]], Reading], name: str) -> set[tuple[str, ...]]:
    return {labels for n, labels in readings if n == name}


def base(dp: int) -> tuple[str, str, str]:
    return ("vllm", MODEL, str(dp))


# -- normalisation on the fixture pages ---------------------------------------------------------


@pytest.mark.parametrize("dp", [0, 1])
def test_033_hits_per_tier_come_from_cached_by_source(dp: int) -> None:
    r, v = collect(page(DP2)), INPUTS.engine_values(dp, 1.0)
    b = base(dp)
    assert value(r, "kvscope_kv_lookup_tokens_total", *b) == v["queries"]
    cached = v["cached"]
    assert value(r, "kvscope_kv_hit_tokens_total", *b, "G1") == cached["device"]
    assert value(r, "kvscope_kv_hit_tokens_total", *b, "G2") == cached["host"]
    assert value(r, "kvscope_kv_hit_tokens_total", *b, "G3") == cached["disk"]
    assert value(r, "kvscope_kv_hit_tokens_total", *b, "unattributed") == cached["p2p"] + cached["external_unspecified"]
    # no double counting: all tiers add up to GPU hits + connector hits, as vLLM's own counters say
    hits = sum(value(r, "kvscope_kv_hit_tokens_total", *labels) for labels in names(r, "kvscope_kv_hit_tokens_total")
               if labels[:3] == b)
    assert hits == cached["device"] + v["external_hits"]
    assert value(r, "kvscope_kv_computed_tokens_total", *b) == v["prompt_by_source"]["local_compute"]
    assert value(r, "kvscope_prompt_tokens_total", *b) == v["queries"]


@pytest.mark.parametrize("dp", [0, 1])
def test_033_transfers_not_doubled_by_deprecated_names(dp: int) -> None:
    r, v = collect(page(DP2)), INPUTS.engine_values(dp, 1.0)
    b = base(dp)
    assert value(r, "kvscope_kv_transfer_bytes_total", *b, "G2", "G1") == v["load_bytes"]
    assert value(r, "kvscope_kv_transfer_bytes_total", *b, "G1", "G2") == v["store_bytes"]
    assert value(r, "kvscope_kv_transfer_seconds_total", *b, "G2", "G1") == v["load_time"]
    assert value(r, "kvscope_kv_transfer_seconds_total", *b, "G1", "G2") == v["store_time"]
    assert {labels[3:] for labels in names(r, "kvscope_kv_transfer_bytes_total")} == {("G2", "G1"), ("G1", "G2")}


def test_033_gauges_histograms_capacities() -> None:
    r, v = collect(page(DP2)), INPUTS.engine_values(1, 1.0)
    b = base(1)
    assert value(r, "kvscope_requests_running", *b) == v["running"]
    assert value(r, "kvscope_requests_waiting", *b) == v["waiting"]
    assert value(r, "kvscope_kv_cache_usage_ratio", *b) == v["usage"]
    assert value(r, "kvscope_requests_finished_total", *b, "stop") == v["success"]["stop"]
    ttft = r[("kvscope_ttft_seconds", b)]
    assert isinstance(ttft, HistogramSample)
    assert [edge for edge, _ in ttft.buckets] == [*INPUTS.TTFT, float("inf")]
    assert ttft.count == len(v["ttft"]) and ttft.sum == pytest.approx(sum(v["ttft"]))
    assert ttft.buckets[7] == (0.1, sum(1 for x in v["ttft"] if x <= 0.1))
    queue = r[("kvscope_queue_time_seconds", b)]
    assert isinstance(queue, HistogramSample) and queue.buckets[0] == (0.3, 3.0)
    assert isinstance(r[("kvscope_prefill_time_seconds", b)], HistogramSample)
    # cache_config_info carries no model_name: the model is taken from the engine's other series
    assert value(r, "kvscope_tier_capacity_tokens", *b, "G1") == 29000 * 16
    assert value(r, "kvscope_tier_capacity_bytes", *b, "G2") == 8 * 2**30
    assert value(r, "kvscope_tier_capacity_tokens", *b, "G2") == 2048 * 16 * 16


def test_020_uses_deprecated_transfer_names_and_external_hits_unattributed() -> None:
    r, v = collect(page("v0.20.0-cpu-offload-dp1.prom")), INPUTS.engine_values(0, 1.0)
    b = base(0)
    assert value(r, "kvscope_kv_transfer_bytes_total", *b, "G2", "G1") == v["load_bytes"]
    assert value(r, "kvscope_kv_transfer_bytes_total", *b, "G1", "G2") == v["store_bytes"]
    assert value(r, "kvscope_kv_transfer_seconds_total", *b, "G1", "G2") == v["store_time"]
    assert value(r, "kvscope_kv_hit_tokens_total", *b, "G1") == v["cached"]["device"]
    assert value(r, "kvscope_kv_hit_tokens_total", *b, "unattributed") == v["external_hits"]
    assert {labels[3] for labels in names(r, "kvscope_kv_hit_tokens_total")} == {"G1", "unattributed"}
    # computed tokens from the per-request histogram's sum (no prompt_tokens_by_source before 0.32)
    assert value(r, "kvscope_kv_computed_tokens_total", *b) == pytest.approx(v["prompt_by_source"]["local_compute"])


def test_014_page_has_no_offload_and_no_external_hits() -> None:
    r, v = collect(page("v0.14.1-dp1.prom")), INPUTS.engine_values(0, 1.0)
    b = base(0)
    assert value(r, "kvscope_kv_hit_tokens_total", *b, "G1") == v["cached"]["device"]
    assert names(r, "kvscope_kv_hit_tokens_total") == {(*b, "G1")}
    assert not names(r, "kvscope_kv_transfer_bytes_total")
    assert not names(r, "kvscope_tier_capacity_bytes")
    assert ("kvscope_ttft_seconds", b) in r


def test_011_aliases_do_not_double() -> None:
    r, v = collect(page("v0.11.0-dp1.prom")), INPUTS.engine_values(0, 1.0)
    b = base(0)
    assert value(r, "kvscope_kv_lookup_tokens_total", *b) == v["queries"]
    assert value(r, "kvscope_kv_hit_tokens_total", *b, "G1") == v["cached"]["device"]
    assert value(r, "kvscope_kv_cache_usage_ratio", *b) == v["usage"]


def test_alias_names_alone() -> None:
    text = ('vllm:gpu_prefix_cache_queries_total{engine="0",model_name="m"} 100.0\n'
            'vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 40.0\n'
            'vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 25.0\n'
            'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5\n')
    r = collect(text)
    assert value(r, "kvscope_kv_lookup_tokens_total", "vllm", "m", "0") == 100.0
    assert value(r, "kvscope_kv_hit_tokens_total", "vllm", "m", "0", "G1") == 40.0
    assert value(r, "kvscope_kv_hit_tokens_total", "vllm", "m", "0", "unattributed") == 25.0
    assert value(r, "kvscope_kv_cache_usage_ratio", "vllm", "m", "0") == 0.5


def test_by_source_wins_for_the_whole_hit_family() -> None:
    # vLLM creates a source's child on its first hit: here only device and host exist yet. The
    # connector's external hits (= host) must not reappear as unattributed.
    text = ('vllm:prefix_cache_hits_total{engine="0",model_name="m"} 40.0\n'
            'vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 25.0\n'
            'vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="device"} 40.0\n'
            'vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="host"} 25.0\n'
            'vllm:prefix_cache_hits_total{engine="1",model_name="m"} 7.0\n')
    r = collect(text)
    assert names(r, "kvscope_kv_hit_tokens_total") == {("vllm", "m", "0", "G1"), ("vllm", "m", "0", "G2"),
                                                       ("vllm", "m", "1", "G1")}
    assert value(r, "kvscope_kv_hit_tokens_total", "vllm", "m", "0", "G2") == 25.0
    assert value(r, "kvscope_kv_hit_tokens_total", "vllm", "m", "1", "G1") == 7.0  # other engine: fallback


def test_tiering_page_maps_tiers_and_leaves_primary_to_load_store() -> None:
    r, v = collect(page("v0.33.0-tiering-dp1.prom")), INPUTS.engine_values(0, 1.0)
    b = base(0)
    links = {labels[3:] for labels in names(r, "kvscope_kv_transfer_bytes_total")}
    assert links == {("G2", "G1"), ("G1", "G2"), ("G3", "G2"), ("G2", "G3"), ("G4", "G2"), ("G2", "G4")}
    assert value(r, "kvscope_kv_transfer_bytes_total", *b, "G2", "G1") == v["load_bytes"]  # not + tiering primary
    assert value(r, "kvscope_kv_transfer_bytes_total", *b, "G3", "G2") == v["load_bytes"] // 2  # tier 1:fs
    assert value(r, "kvscope_kv_transfer_bytes_total", *b, "G2", "G4") == v["store_bytes"] // 3  # tier 2:obj
    assert value(r, "kvscope_kv_transfer_seconds_total", *b, "G4", "G2") == round(v["load_time"] * 3, 4)


def test_tiering_primary_used_without_load_store_and_tables_configurable() -> None:
    text = ('vllm:kv_offload_tiering_read_bytes_total{engine="0",model_name="m",tier="0:primary"} 100.0\n'
            'vllm:kv_offload_tiering_read_bytes_total{engine="0",model_name="m",tier="1:fs"} 10.0\n'
            'vllm:kv_offload_tiering_read_bytes_total{engine="0",model_name="m",tier="2:kvcr"} 3.0\n'
            'vllm:kv_offload_tiering_write_bytes_total{engine="0",model_name="m",tier="0:primary"} 50.0\n'
            'vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="p2p"} 9.0\n'
            'vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="disk"} 4.0\n')
    r = collect(text)
    b = ("vllm", "m", "0")
    assert value(r, "kvscope_kv_transfer_bytes_total", *b, "G2", "G1") == 100.0
    assert value(r, "kvscope_kv_transfer_bytes_total", *b, "G1", "G2") == 50.0
    assert value(r, "kvscope_kv_transfer_bytes_total", *b, "G3", "G2") == 10.0
    assert value(r, "kvscope_kv_transfer_bytes_total", *b, "unattributed", "G2") == 3.0
    assert value(r, "kvscope_kv_hit_tokens_total", *b, "unattributed") == 9.0
    r = collect(text, engine="reference", tiering_tiers={"2:kvcr": "G4", "1:fs": "G4"},
                cache_hit_source_tiers={"p2p": "G4"})
    b = ("reference", "m", "0")
    assert value(r, "kvscope_kv_transfer_bytes_total", *b, "G4", "G2") == 13.0  # both tiers mapped to G4, summed
    assert value(r, "kvscope_kv_hit_tokens_total", *b, "G4") == 9.0
    assert value(r, "kvscope_kv_hit_tokens_total", *b, "G3") == 4.0  # default entries kept


def test_unusable_samples_are_dropped_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    text = ('vllm:prefix_cache_queries_total{engine="0",model_name="m"} NaN\n'
            'vllm:prompt_tokens_total{engine="0",model_name="m"} 12.0\n'
            'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 1.0\n'
            'vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 1.0\n'
            'vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.05\n'
            'vllm:request_queue_time_seconds_bucket{engine="0",le="0.3",model_name="m"} 3.0\n'
            'vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} 2.0\n'
            'vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 0.4\n'
            'vllm:num_requests_running{engine="0",model_name="m"} two\n')
    body = text.encode()
    collector = VllmMetricsCollector(VllmOptions(urls=["http://t/metrics"]), fetch=lambda *_: Page(body))
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            r = {(x.name, x.labels): x for x in collector.collect()}
    assert value(r, "kvscope_prompt_tokens_total", "vllm", "m", "0") == 12.0
    assert ("kvscope_kv_lookup_tokens_total", ("vllm", "m", "0")) not in r
    assert ("kvscope_ttft_seconds", ("vllm", "m", "0")) not in r  # no +Inf bucket
    assert ("kvscope_queue_time_seconds", ("vllm", "m", "0")) not in r  # counts go down
    assert value(r, "kvscope_scrape_malformed_lines_total", "vllm", "http://t/metrics") == 3 * 4
    assert value(r, "kvscope_scrape_target_up", "vllm", "http://t/metrics") == 1.0
    assert len([m for m in caplog.messages if "malformed" in m]) == 1  # logged once, not per scrape


def test_normaliser_is_pure_over_a_scan() -> None:
    scanned = ExpositionScanner(("vllm:",)).scan(page(DP2).decode())
    normaliser = Normaliser("vllm", {}, {})
    first = normaliser.normalise(scanned).readings
    assert normaliser.normalise(scanned).readings == first


# -- configuration and registration -------------------------------------------------------------


def test_registered_disabled_and_needs_urls() -> None:
    specs = components()
    assert specs.collectors["vllm"] is SPEC and not SPEC.enabled_by_default
    assert not load_config(None, specs).collectors["vllm"][0].enabled
    with pytest.raises(ConfigError, match=r"collectors\.vllm: urls: .*no URL"):
        load_config("[collectors.vllm]\nenabled = true\n", specs)
    with pytest.raises(ConfigError, match="urls"):
        load_config(None, specs, environ={"KVSCOPE_COLLECTORS__VLLM__ENABLED": "true"})
    config = load_config('[collectors.vllm]\nenabled = true\nurls = ["http://127.0.0.1:8000/metrics"]\n', specs)
    assert config.collectors["vllm"][1].urls == ["http://127.0.0.1:8000/metrics"]


@pytest.mark.parametrize(("extra", "message"), [
    ('urls = ["127.0.0.1:8000"]', "not an http"),
    ('urls = ["http://u:p@127.0.0.1:8000/metrics"]', "credentials"),
    ('urls = ["http://a/metrics", "http://a/metrics"]', "twice"),
    ('urls = ["http://a/metrics"]\nscrape_timeout_seconds = 0', "scrape_timeout_seconds"),
    ('urls = ["http://a/metrics"]\nmax_response_bytes = 10', "max_response_bytes"),
    ('urls = ["http://a/metrics"]\ncache_hit_source_tiers = { host = "G9" }', "cache_hit_source_tiers.host"),
    ('urls = ["http://a/metrics"]\ntiering_tiers = { "1:fs" = "G1" }', "below G1"),
])
def test_bad_options_are_config_errors(extra: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(f"[collectors.vllm]\nenabled = true\n{extra}\n", components())


def test_every_reading_is_catalogued() -> None:
    catalogue = build_catalogue()
    for name in ("v0.33.0-tiering-dp1.prom", DP2, "v0.11.0-dp1.prom"):
        for reading in collect(page(name)).values():
            spec = catalogue.get(reading.name)
            assert spec is not None, reading.name
            assert len(spec.labels) == len(reading.labels), reading.name
            assert (spec.type == "histogram") == isinstance(reading, HistogramSample)


# -- HTTP: a real server on 127.0.0.1 -----------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        behaviour: dict[str, Any] = self.server.behaviour  # type: ignore[attr-defined]
        body: bytes = behaviour.get("body", b"")
        if behaviour.get("sleep"):
            time.sleep(behaviour["sleep"])
        status = behaviour.get("status", 200)
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        if not behaviour.get("no_length"):  # without it, HTTP/1.0's end of body is the end of the connection
            self.send_header("Content-Length", str(len(body) + behaviour.get("short", 0)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up (too_large)
            self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, dict[str, Any]]]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    srv.behaviour = {"body": page(DP2)}  # type: ignore[attr-defined]
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/metrics", srv.behaviour  # type: ignore[attr-defined]
    finally:
        srv.shutdown()
        srv.server_close()


def _errors(readings: list[Reading], url: str) -> dict[str, float]:
    return {r.labels[2]: r.value for r in readings
            if isinstance(r, Sample) and r.name == "kvscope_scrape_errors_total" and r.labels[1] == url}


def _up(readings: list[Reading], url: str) -> float:
    return next(r.value for r in readings
                if isinstance(r, Sample) and r.name == "kvscope_scrape_target_up" and r.labels[1] == url)


@pytest.mark.parametrize(("behaviour", "kind"), [
    ({"status": 500}, "http_status"),
    ({"body": b"vllm:a 1\n" * 200, "max": 1024}, "too_large"),
    ({"body": page(DP2)[:-30], "no_length": True}, "truncated"),  # ends mid-line, and HTTP cannot tell
    ({"short": 100}, "truncated"),  # Content-Length promises more than arrives
    ({"sleep": 1.0}, "timeout"),
])
def test_failing_target(server: tuple[str, dict[str, Any]], behaviour: dict[str, Any], kind: str) -> None:
    url, state = server
    state.update(behaviour)
    options = VllmOptions(urls=[url], scrape_timeout_seconds=0.3, max_response_bytes=behaviour.get("max", 1 << 20))
    collector = VllmMetricsCollector(options)
    readings = collector.collect()
    assert _up(readings, url) == 0.0
    errors = _errors(readings, url)
    assert errors[kind] == 1 and sum(errors.values()) == 1
    assert not [r for r in readings if r.name.startswith("kvscope_kv_")]


def test_one_target_down_others_kept(server: tuple[str, dict[str, Any]], caplog: pytest.LogCaptureFixture) -> None:
    url, _ = server
    srv = http.server.HTTPServer(("127.0.0.1", 0), _Handler)
    dead = f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    srv.server_close()  # nothing listens there now
    collector = VllmMetricsCollector(VllmOptions(urls=[dead, url], scrape_timeout_seconds=1.0))
    with caplog.at_level(logging.WARNING):
        collector.collect()
        readings = collector.collect()
    assert _up(readings, dead) == 0.0 and _up(readings, url) == 1.0
    assert _errors(readings, dead)["connect"] == 2
    assert any(r.name == "kvscope_kv_hit_tokens_total" for r in readings)
    assert len([m for m in caplog.messages if dead in m]) == 1  # the outage is logged once


def test_two_targets_same_series_second_dropped(server: tuple[str, dict[str, Any]]) -> None:
    url, _ = server
    collector = VllmMetricsCollector(VllmOptions(urls=[url, url + "?again"]))
    readings = collector.collect()
    keys = [(r.name, r.labels) for r in readings]
    assert len(keys) == len(set(keys))
    assert _errors(readings, url + "?again")["duplicate_series"] == 1
    assert _errors(readings, url)["duplicate_series"] == 0


# -- through the store: restarts and the golden exposition --------------------------------------


def _render(store: Store, url: str) -> str:
    text = TextRenderer(store).render().decode()
    return text.replace(url, "http://TARGET/metrics")


def _golden(name: str, text: str) -> None:
    path = HERE / name
    if os.environ.get("KVSCOPE_REGEN_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs; see tests/fixtures/vllm/README.md to regenerate"


def test_golden_exposition_and_engine_restart(server: tuple[str, dict[str, Any]]) -> None:
    url, state = server
    store = Store(build_catalogue(Components({"vllm": SPEC}, {})))
    collector = VllmMetricsCollector(VllmOptions(urls=[url]))
    store.ingest("vllm", collector.collect(), now=1.0)
    _golden("expected-v0.33.0-dp2.txt", _render(store, url))
    before = store.value("kvscope_kv_hit_tokens_total", (*base(0), "G1"))

    state["body"] = page(RESTART)  # both engines restarted: every counter went down
    store.ingest("vllm", collector.collect(), now=2.0)
    _golden("expected-v0.33.0-dp2-after-restart.txt", _render(store, url))
    after, restarted = INPUTS.engine_values(0, 1.0), INPUTS.engine_values(0, 0.25)
    assert before == after["cached"]["device"]
    assert store.value("kvscope_kv_hit_tokens_total", (*base(0), "G1")) == (
        after["cached"]["device"] + restarted["cached"]["device"])
    assert store.value("kvscope_kv_transfer_bytes_total", (*base(0), "G1", "G2")) == (
        after["store_bytes"] + restarted["store_bytes"])
    _, _, _, ttft_count = store.histogram("kvscope_ttft_seconds", base(0))
    assert ttft_count == len(after["ttft"]) + len(restarted["ttft"])
    resets = store.value("kvscope_source_resets_total", ("vllm",))
    assert resets is not None and resets > 20


def test_golden_exposition_passes_promtool() -> None:
    promtool = require_tool("promtool")
    done = subprocess.run([promtool, "check", "metrics"], input=(HERE / "expected-v0.33.0-dp2.txt").read_bytes(),
                          capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
