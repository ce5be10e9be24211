"""Dynamo frontend and worker /metrics → contract; the worker page's vllm:* and KVBM lines are left to the
vllm and dynamo_kvbm adapters. Expected numbers come from tests/fixtures/dynamo/make_pages.py."""

from __future__ import annotations

import pytest

from kvscope.agent.app.wiring import build_catalogue, components
from kvscope.agent.config.settings import ConfigError, load_config
from kvscope.collectors.engines.dynamo_frontend import SPEC, DynamoCollector, DynamoOptions
from testkit.engine_pages import (
    FIXTURES,
    as_dict,
    assert_golden,
    exposition,
    fixture_module,
    histogram,
    page,
    series,
    serving,
    value,
)

PAGES = fixture_module("dynamo")
MODEL = PAGES.MODEL
BASE = ("dynamo", MODEL, "0")


def collect(*names: str) -> dict[tuple[str, tuple[str, ...]], object]:
    with serving(*(page("dynamo", n) for n in names)) as servers:
        return as_dict(DynamoCollector(DynamoOptions(urls=[s.url() for s in servers])).collect())


def test_frontend_page() -> None:
    r = collect("frontend-0.9.0.prom")
    f = PAGES.FRONTEND
    ttft = histogram(r, "kvscope_ttft_seconds", *BASE)
    assert [edge for edge, _ in ttft.buckets] == [*map(float, PAGES.TTFT_EDGES), float("inf")]
    assert ttft.count == len(f["ttft"]) and ttft.sum == pytest.approx(sum(f["ttft"]))
    assert ttft.buckets[9] == (1.0, sum(1 for x in f["ttft"] if x <= 1))
    assert value(r, "kvscope_prompt_tokens_total", *BASE) == sum(f["input_tokens"])
    assert value(r, "kvscope_requests_finished_total", *BASE, "success") == f["requests_success"]
    assert value(r, "kvscope_requests_finished_total", *BASE, "error") == f["requests_error"]
    assert value(r, "kvscope_tier_capacity_tokens", *BASE, "G1") == 37_710 * 16


def test_worker_page_reads_only_dynamo_series() -> None:
    """The worker's vllm:* lines are the vLLM adapter's: nothing here comes from them (no hits, no lookups)."""
    r = collect("worker-0.9.0-vllm-0.14.1.prom")
    assert value(r, "kvscope_kv_cache_usage_ratio", *BASE) == 0.125
    engine = {name for name, _ in r if not name.startswith("kvscope_scrape_")}
    assert engine == {"kvscope_kv_cache_usage_ratio"}


def test_kvbm_namespace_is_left_to_the_kvbm_adapter() -> None:
    r = collect("worker-legacy-kvbm.prom")
    assert not {name for name, _ in r if not name.startswith("kvscope_scrape_")}
    assert value(r, "kvscope_scrape_target_up", "dynamo", next(iter(series(r, "kvscope_scrape_target_up")))[1]) == 1


def test_frontend_and_worker_together_and_catalogued() -> None:
    r = collect("frontend-0.9.0.prom", "worker-0.9.0-vllm-0.14.1.prom")
    catalogue = build_catalogue()
    for name, labels in r:
        spec = catalogue.get(name)
        assert spec is not None and len(spec.labels) == len(labels), name
    assert ("kvscope_ttft_seconds", BASE) in r and ("kvscope_kv_cache_usage_ratio", BASE) in r


def test_registered_disabled_and_needs_urls() -> None:
    assert components().collectors["dynamo"] is SPEC and not SPEC.enabled_by_default
    with pytest.raises(ConfigError, match="no URL"):
        load_config("[collectors.dynamo]\nenabled = true\n", components(), environ={})


def test_golden_exposition_of_the_frontend_page() -> None:
    with serving(page("dynamo", "frontend-0.9.0.prom")) as (server,):
        text = exposition({"dynamo": SPEC}, {"dynamo": DynamoCollector(DynamoOptions(urls=[server.url()]))},
                          {server.url(): "TARGET"})
    assert_golden(FIXTURES / "dynamo" / "expected-frontend-0.9.0.txt", text)


def test_router_predicted_hit_rate_is_a_histogram_beside_the_engines_hits() -> None:
    """dynamo_component_router_kv_hit_rate (per routed request) → kvscope_router_predicted_hit_ratio, Dynamo's
    linear 0.05 edges kept; the frontend's other series are unchanged by it."""
    r = collect("frontend-router-kv-hit-rate.prom")
    predicted = histogram(r, "kvscope_router_predicted_hit_ratio", *BASE)
    assert predicted.count == len(PAGES.ROUTER_PREDICTED)
    assert predicted.sum == pytest.approx(sum(PAGES.ROUTER_PREDICTED), rel=1e-12)
    assert [edge for edge, _ in predicted.buckets] == [*PAGES.ROUTER_EDGES, float("inf")]
    assert dict(predicted.buckets)[0.5] == sum(1 for x in PAGES.ROUTER_PREDICTED if x <= 0.5)
    plain = collect("frontend-0.9.0.prom")
    assert {k for k in r if k[0] != "kvscope_router_predicted_hit_ratio" and "scrape" not in k[0]} == {
        k for k in plain if "scrape" not in k[0]}
