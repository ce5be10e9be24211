"""Served share per tenant from LMCache's MP server (cache_salt on lmcache_mp_lookup_{requested,hit}_tokens),
scraped over real HTTP: 1,000 salts make at most tenants_top_n + 1 tenant series per collection, and every
token counted shows in exactly one series. Pages are written with prometheus_client under the names and labels
of LMCache's mp_observability docs (model_name, cache_salt), as tests/fixtures/lmcache/make_pages.py does."""

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
from kvscope.collectors.engines.lmcache import NAME, LmcacheCollector, LmcacheOptions
from testkit.engine_pages import PageServer, page

MODEL = "meta-llama/Llama-3.1-8B"
TENANTS, TOP_N, MAX_TRACKED = 1000, 10, 100
CHUNK = 256  # LMCache counts chunk-aligned tokens
LOOKUPS, HITS = "kvscope_tenant_kv_lookup_tokens_total", "kvscope_tenant_kv_hit_tokens_total"
LAB = ("lmcache", MODEL, "0")

Values = dict[tuple[str, tuple[str, ...]], float]


def chunks_of(tenant: int) -> int:
    return 1 + 1000 // (tenant + 1)  # tenant-0 the busiest (1,001 chunks), the long tail 1 or 2


def mp_page(rows: list[tuple[str, float, float]]) -> bytes:
    """(cache_salt, requested tokens, hit tokens) per series, cumulative, in this order on the page."""
    reg, p = CollectorRegistry(), "lmcache_mp_"
    requested = Counter(p + "lookup_requested_tokens", "Tokens requested by lookups.", ["model_name", "cache_salt"],
                        registry=reg)
    hit = Counter(p + "lookup_hit_tokens", "Tokens served from L1 or L2.", ["model_name", "cache_salt"], registry=reg)
    for salt, asked, found in rows:
        requested.labels(MODEL, salt).inc(asked)
        hit.labels(MODEL, salt).inc(found)
    return generate_latest(reg)


def thousand(rounds: int) -> list[tuple[str, float, float]]:
    """After `rounds` equal rounds: each tenant asked for its chunks and found half of them; plus unsalted lookups."""
    rows = [(f"tenant-{i}", rounds * chunks_of(i) * CHUNK, rounds * chunks_of(i) * CHUNK / 2) for i in range(TENANTS)]
    return [*rows, ("", rounds * 5 * CHUNK, 0.0)]


def collect(collector: LmcacheCollector) -> Values:
    readings = list(collector.collect())
    assert Store(build_catalogue()).ingest(NAME, readings, time.time()).rejected == 0
    return {(r.name, r.labels): r.value for r in readings if isinstance(r, Sample)}


def tenant_series(values: Values) -> Values:
    return {key: value for key, value in values.items() if key[0] in (LOOKUPS, HITS)}


def scraper(server: PageServer, **options: Any) -> LmcacheCollector:
    return LmcacheCollector(LmcacheOptions(urls=[server.url()], hit_tier="G2", **options))


def test_a_thousand_cache_salts_make_top_n_plus_other_series() -> None:
    with PageServer({"/metrics": mp_page(thousand(1))}) as server:
        collector = scraper(server, tenants_top_n=TOP_N, tenants_max_tracked=MAX_TRACKED)
        first = tenant_series(collect(collector))
        server.routes["/metrics"] = mp_page(thousand(2))
        v = collect(collector)
    second = tenant_series(v)
    last = {**first, **second}  # every tenant series ever exported: its last value

    for series in (first, second):
        tenants = {labels[3] for _, labels in series}
        assert len(tenants) <= TOP_N + 1 and "other" in tenants
        assert len(series) <= 2 * (TOP_N + 1)
    assert {labels[3] for _, labels in second} == {f"tenant-{i}" for i in range(TOP_N)} | {"other"}
    assert {labels[4] for name, labels in second if name == HITS} == {"G2"}
    busiest = chunks_of(0) * CHUNK
    assert second[(LOOKUPS, (*LAB, "tenant-0"))] == 2 * busiest
    assert second[(HITS, (*LAB, "tenant-0", "G2"))] == busiest  # tenant-0's served share: 50 %
    # nothing lost, nothing counted twice: the last values of all series add up to the page's totals
    page = thousand(2)
    assert sum(value for (name, _), value in last.items() if name == LOOKUPS) == sum(r[1] for r in page)
    assert sum(value for (name, _), value in last.items() if name == HITS) == sum(r[2] for r in page)
    # memory: 100 tenants remembered at each collection and 100 more taken in between two; the other salts
    # (tenant-200 on, and the unsalted lookups, in both rounds) counted for "other" without being kept
    assert v[("kvscope_tenants_forgotten_total", LAB)] == 2 * MAX_TRACKED
    late = (sum(chunks_of(t) for t in range(200, TENANTS)) + 5) * CHUNK
    assert v[("kvscope_tenant_unranked_lookup_tokens_total", LAB)] == 2 * late
    assert v[("kvscope_tenants_folded", LAB)] == MAX_TRACKED - TOP_N


def test_tenant_mode_off_by_default() -> None:
    with PageServer({"/metrics": mp_page([("a", 512, 256), ("", 256, 0)])}) as server:
        v = collect(scraper(server))
    assert not tenant_series(v) and ("kvscope_tenants_folded", LAB) not in v
    assert v[("kvscope_connector_lookup_tokens_total", LAB)] == 768  # summed over salts, as before


def test_unsalted_long_salts_and_a_restarted_server() -> None:
    long_salt = "s" * 129
    with PageServer({"/metrics": mp_page([("a", 512, 256), ("", 256, 0), (long_salt, 1024, 512)])}) as server:
        collector = scraper(server, tenants_top_n=5)
        v = collect(collector)
        assert v[(LOOKUPS, (*LAB, "a"))] == 512 and v[(HITS, (*LAB, "a", "G2"))] == 256
        assert v[(LOOKUPS, (*LAB, "base"))] == 256  # no cache_salt: tenant base
        assert v[(LOOKUPS, (*LAB, "other"))] == 1024 and v[(HITS, (*LAB, "other", "G2"))] == 512
        assert v[("kvscope_tenant_odd_name_lookup_tokens_total", LAB)] == 1024
        # the MP server restarted: its counters began again, and what they count now is new
        server.routes["/metrics"] = mp_page([("a", 256, 256)])
        v = collect(collector)
    assert v[(LOOKUPS, (*LAB, "a"))] == 768 and v[(HITS, (*LAB, "a", "G2"))] == 512


@pytest.mark.parametrize(("options", "message"), [
    ("tenants_top_n = -1", "tenants_top_n: must be >= 0"),
    ("tenants_top_n = 20\ntenants_max_tracked = 10", "tenants_max_tracked: must be >= tenants_top_n (20)")])
def test_tenant_options_are_checked(options: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(f'[collectors.lmcache]\nenabled = true\nurls = ["http://l/metrics"]\n{options}\n', components(),
                    environ={})


def test_captured_mp_page_unsalted_lookups_are_tenant_base() -> None:
    """LMCache's MP server as captured (tests/fixtures/lmcache/captured/README.md): cache_salt="" → tenant base,
    with the page's own 960 requested and 640 hit tokens."""
    body = page("lmcache", "captured/mp-server-issue-3640-cpu-smoke.prom")
    with PageServer({"/metrics": body}) as server:
        v = collect(scraper(server, tenants_top_n=TOP_N))
    opt = ("lmcache", "facebook/opt-125m", "0")
    assert tenant_series(v) == {(LOOKUPS, (*opt, "base")): 960, (HITS, (*opt, "base", "G2")): 640}
