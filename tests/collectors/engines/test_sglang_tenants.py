"""Served share per tenant from SGLang's own counters, where SGLang labels requests: started with
`--tokenizer-metrics-allowed-custom-labels tenant`, a request's `x-custom-labels: {"tenant": ...}` header puts
`tenant` on `sglang:prompt_tokens_total` and `sglang:cached_tokens_total{cache_source}` (SGLang
python/sglang/srt/observability/metrics_collector.py TokenizerMetricsCollector, commit
44cedc2b9c7dd31d9acae4498ea4fa0d3665feed; the labels from RequestMetricsRecorder / TokenizerManager). Pages are
written with prometheus_client under those names and label sets, scraped over real HTTP: 1,000 tenants make at
most tenants_top_n + 1 tenant series per metric, every token counted shows in exactly one."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from kvscope.agent.app.wiring import build_catalogue, components
from kvscope.agent.config.settings import ConfigError, load_config
from kvscope.agent.core.readings import Sample
from kvscope.agent.core.store import Store
from kvscope.collectors.engines.sglang import NAME, SglangCollector, SglangOptions
from testkit.engine_pages import PageServer

MODEL = "Qwen/Qwen3-8B"
TENANTS, TOP_N, MAX_TRACKED = 1000, 10, 100
LOOKUPS, HITS = "kvscope_tenant_kv_lookup_tokens_total", "kvscope_tenant_kv_hit_tokens_total"
LAB = ("sglang", MODEL, "0")
SOURCES = {"device": "G1", "host": "G2", "storage_HiCacheNixl": "G4"}  # nixl: G4 in kvscope's table

Values = dict[tuple[str, tuple[str, ...]], float]
Row = tuple[str, float, dict[str, float]]  # tenant, prompt tokens, cached tokens by cache_source


def tokens_of(tenant: int) -> int:
    return 64 * (1 + 1000 // (tenant + 1))  # tenant-0 the busiest, the long tail 64 or 128 tokens


def sglang_page(rows: list[Row]) -> bytes:
    """As SGLang's tokenizer process exposes them (cumulative), with `tenant` allowed as a custom label."""
    reg = CollectorRegistry()
    labels = ["model_name", "engine_type", "tenant"]
    prompt = Counter("sglang:prompt_tokens", "Number of prefill tokens processed.", labels, registry=reg)
    cached = Counter("sglang:cached_tokens", "Number of cached prompt tokens by source (device/host/storage).",
                     [*labels, "cache_source"], registry=reg)
    for tenant, asked, by_source in rows:
        prompt.labels(MODEL, "unified", tenant).inc(asked)
        for source, tokens in by_source.items():
            cached.labels(MODEL, "unified", tenant, source).inc(tokens)
    return generate_latest(reg)


def thousand(rounds: int) -> list[Row]:
    """Each tenant's prompts: a quarter from G1, a quarter from host memory, a quarter from storage, per round;
    plus requests without the header (tenant "")."""
    rows: list[Row] = [(f"tenant-{i}", rounds * tokens_of(i),
                        {s: rounds * tokens_of(i) / 4 for s in SOURCES}) for i in range(TENANTS)]
    return [*rows, ("", rounds * 320.0, {"device": rounds * 64.0})]


def collect(collector: SglangCollector) -> Values:
    readings = list(collector.collect())
    assert Store(build_catalogue()).ingest(NAME, readings, time.time()).rejected == 0
    return {(r.name, r.labels): r.value for r in readings if isinstance(r, Sample)}


def tenant_series(values: Values) -> Values:
    return {key: value for key, value in values.items() if key[0] in (LOOKUPS, HITS)}


def scraper(server: PageServer, **options: Any) -> SglangCollector:
    return SglangCollector(SglangOptions(urls=[server.url()], **options))


def test_a_thousand_request_label_tenants_make_top_n_plus_other_series() -> None:
    with PageServer({"/metrics": sglang_page(thousand(1))}) as server:
        collector = scraper(server, tenant_label="tenant", tenants_top_n=TOP_N, tenants_max_tracked=MAX_TRACKED)
        first = tenant_series(collect(collector))
        server.routes["/metrics"] = sglang_page(thousand(2))
        v = collect(collector)
    second = tenant_series(v)
    last = {**first, **second}

    for series in (first, second):
        tenants = {labels[3] for _, labels in series}
        assert len(tenants) <= TOP_N + 1 and "other" in tenants
        assert len(series) <= (1 + len(SOURCES)) * (TOP_N + 1)  # lookups and a hit series per tier
    assert {labels[3] for _, labels in second} == {f"tenant-{i}" for i in range(TOP_N)} | {"other"}
    for source, tier in SOURCES.items():  # tenant-0: a quarter of its prompt tokens from each tier
        assert second[(HITS, (*LAB, "tenant-0", tier))] == 2 * tokens_of(0) / 4, source
    assert second[(LOOKUPS, (*LAB, "tenant-0"))] == 2 * tokens_of(0)
    page = thousand(2)
    assert sum(value for (name, _), value in last.items() if name == LOOKUPS) == sum(r[1] for r in page)
    for tier in ("G1", "G2", "G4"):
        source = next(s for s, t in SOURCES.items() if t == tier)
        assert sum(value for (name, labels), value in last.items() if name == HITS and labels[4] == tier) == sum(
            r[2].get(source, 0.0) for r in page), tier
    assert v[("kvscope_tenants_forgotten_total", LAB)] == 2 * MAX_TRACKED
    late = sum(tokens_of(t) for t in range(200, TENANTS)) + 320
    assert v[("kvscope_tenant_unranked_lookup_tokens_total", LAB)] == 2 * late
    assert v[("kvscope_tenants_folded", LAB)] == MAX_TRACKED - TOP_N
    # the engine's own series sum over the request label, as without it
    assert v[("kvscope_kv_lookup_tokens_total", LAB)] == sum(r[1] for r in page)
    assert v[("kvscope_kv_hit_tokens_total", (*LAB, "G2"))] == sum(r[2].get("host", 0.0) for r in page)


def test_tenant_mode_off_by_default() -> None:
    with PageServer({"/metrics": sglang_page([("a", 512, {"device": 256})])}) as server:
        v = collect(scraper(server, tenant_label="tenant"))
    assert not tenant_series(v) and ("kvscope_tenants_folded", LAB) not in v


@pytest.mark.parametrize(("options", "message"), [
    ("tenants_top_n = 5", "tenants_top_n: needs tenant_label"),
    ('tenant_label = "tenant"\ntenants_top_n = -1', "tenants_top_n: must be >= 0"),
    ('tenant_label = "tenant"\ntenants_top_n = 20\ntenants_max_tracked = 10',
     "tenants_max_tracked: must be >= tenants_top_n (20)")])
def test_tenant_options_are_checked(options: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(f'[collectors.sglang]\nenabled = true\nurls = ["http://s/metrics"]\n{options}\n', components(),
                    environ={})
