"""Pages a live Dynamo 1.6.1 served (tests/fixtures/dynamo/live-1.6.1/, README there) through the `dynamo` and
`vllm` adapters and engine autodetection, over real HTTP. Every expected figure is read off the page's text."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from kvscope.agent.core.pipeline import CollectorContext
from kvscope.collectors.engines.discovery import DISCOVERED, DiscoveryCollector, DiscoveryOptions, identify
from kvscope.collectors.engines.dynamo_frontend import DynamoCollector, DynamoOptions
from kvscope.collectors.engines.vllm_metrics import VllmMetricsCollector, VllmOptions
from kvscope.collectors.scrape.exposition import ExpositionScanner
from testkit.engine_pages import PageServer, as_dict, histogram, page, series, serving, value
from testkit.paths import FIXTURES

LIVE = "live-1.6.1"
NODE = str(FIXTURES / "dynamo" / "node" / "proc")  # a mount table, for the KVBM adapter autodetection could build
DYNAMO = ("dynamo", "tiny", "0")
VLLM = ("vllm", "tiny", "0")


def served(name: str, metric: str, **labels: str) -> float:
    """The sum of a page's samples named `metric` with these labels."""
    text = page("dynamo", f"{LIVE}/{name}").decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == metric and all(s.labels.get(k) == v for k, v in labels.items()))


def collect(collector: type[DynamoCollector] | type[VllmMetricsCollector], name: str) -> dict[
        tuple[str, tuple[str, ...]], object]:
    with serving(page("dynamo", f"{LIVE}/{name}")) as (server,):
        if collector is DynamoCollector:
            return as_dict(DynamoCollector(DynamoOptions(urls=[server.url()])).collect())
        return as_dict(VllmMetricsCollector(VllmOptions(urls=[server.url()])).collect())


def engine_series(readings: dict[tuple[str, tuple[str, ...]], object]) -> set[str]:
    return {name for name, _ in readings if not name.startswith("kvscope_scrape_")}


def test_frontend_page() -> None:
    r = collect(DynamoCollector, "frontend.prom")
    ttft = histogram(r, "kvscope_ttft_seconds", *DYNAMO)
    assert ttft.count == served("frontend.prom", "dynamo_frontend_time_to_first_token_seconds_count") == 12
    assert ttft.sum == served("frontend.prom", "dynamo_frontend_time_to_first_token_seconds_sum")
    assert value(r, "kvscope_prompt_tokens_total", *DYNAMO) == served(
        "frontend.prom", "dynamo_frontend_input_sequence_tokens_sum") == 7681
    assert value(r, "kvscope_requests_finished_total", *DYNAMO, "success") == served(
        "frontend.prom", "dynamo_frontend_requests_total", status="success") == 12
    # the router's predicted overlap: the frontend's cached tokens are its router's selected cached prefix tokens
    assert value(r, "kvscope_kv_cached_tokens_total", *DYNAMO) == served(
        "frontend.prom", "dynamo_component_router_kv_selected_cached_prefix_tokens_total") == 3808
    # one worker's G1: 64 blocks of 32 tokens (each of the two workers has as many)
    assert value(r, "kvscope_tier_capacity_tokens", *DYNAMO, "G1") == 64 * 32
    # no kv_hit_rate gauge on this frontend, and none made up
    assert engine_series(r) == {"kvscope_ttft_seconds", "kvscope_prompt_tokens_total",
                                "kvscope_requests_finished_total", "kvscope_kv_cached_tokens_total",
                                "kvscope_tier_capacity_tokens"}


def test_worker_pages_are_read_by_the_vllm_adapter_alone() -> None:
    """1.6.1's workers serve no dynamo_component_* KV gauges; the mocker's vLLM-named lines are the vLLM adapter's."""
    for name in ("worker-1.prom", "worker-2.prom"):
        assert not engine_series(collect(DynamoCollector, name))
        r = collect(VllmMetricsCollector, name)
        ttft = histogram(r, "kvscope_ttft_seconds", *VLLM)
        assert ttft.count == served(name, "vllm:time_to_first_token_seconds_count") > 0
        assert value(r, "kvscope_kv_cache_usage_ratio", *VLLM) == served(name, "vllm:kv_cache_usage_perc")
    assert served("worker-1.prom", "vllm:time_to_first_token_seconds_count") + served(
        "worker-2.prom", "vllm:time_to_first_token_seconds_count") == 12  # the router split the 12 requests


def test_autodetection_identifies_each_page_by_its_names() -> None:
    def kinds(name: str) -> set[str]:
        return identify(ExpositionScanner(("vllm:", "sglang:", "sglang_", "lmcache:", "kvbm_", "dynamo_")).scan(
            page("dynamo", f"{LIVE}/{name}").decode()))

    assert kinds("frontend.prom") == kinds("frontend-idle.prom") == {"dynamo"}
    assert kinds("worker-1.prom") == kinds("worker-2.prom") == {"dynamo", "vllm"}
    assert kinds("worker-1-idle.prom") == {"dynamo"}  # the vLLM-named lines come with the first request


def test_an_idle_workers_page_is_probed_again_soon_until_its_engine_lines_appear() -> None:
    """A Dynamo worker page without its engine's lines (as at start, before its first request) is probed again
    after awaiting_engine_reprobe_seconds, not after the slow interval; once they are there, the slow one."""
    now = [0.0]
    with PageServer({"/metrics": page("dynamo", f"{LIVE}/worker-1-idle.prom")}) as worker:
        options = DiscoveryOptions(candidates=[worker.url()], reprobe_interval_seconds=300,
                                   awaiting_engine_reprobe_seconds=10, probe_timeout_seconds=1)
        collector = DiscoveryCollector(options, CollectorContext(proc_root=NODE), clock=lambda: now[0])
        assert series(as_dict(collector.collect()), DISCOVERED) == {("dynamo", worker.url())}
        worker.routes["/metrics"] = page("dynamo", f"{LIVE}/worker-1.prom")  # its first requests were served
        now[0] = 9.0
        assert series(as_dict(collector.collect()), DISCOVERED) == {("dynamo", worker.url())}
        now[0] = 10.0
        found = as_dict(collector.collect())
        assert series(found, DISCOVERED) == {("dynamo", worker.url()), ("vllm", worker.url())}
        usage = served("worker-1.prom", "vllm:kv_cache_usage_perc")
        assert value(found, "kvscope_kv_cache_usage_ratio", *VLLM) == usage
        worker.routes["/metrics"] = page("dynamo", f"{LIVE}/worker-1-idle.prom")
        now[0] = 299.0  # the slow interval now: no probe sees the change
        assert ("vllm", worker.url()) in series(as_dict(collector.collect()), DISCOVERED)
