"""SGLang /metrics → contract: both prefixes, hits per tier with and without `cache_source`, HiCache moves,
tp_rank shards. Expected numbers come from tests/fixtures/sglang/make_pages.py."""

from __future__ import annotations

from typing import Any

import pytest

from kvscope.agent.app.wiring import build_catalogue, components
from kvscope.agent.config.settings import ConfigError, load_config
from kvscope.collectors.engines.sglang import SPEC, SglangCollector, SglangOptions
from testkit.engine_pages import (
    FIXTURES,
    Readings,
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

PAGES = fixture_module("sglang")
NODE = str(FIXTURES / "dynamo" / "node" / "proc")
BASE = ("sglang", PAGES.MODEL, "0")
UNDERSCORE, COLON, PLAIN = "hicache-hf3fs-underscore-tp2.prom", "hicache-file-colon-tp2.prom", "v0.5.10.post1-tp2.prom"


def collect(name: str, **options: Any) -> Readings:
    body = page("sglang", name)
    return as_dict(SglangCollector(SglangOptions(urls=["http://s/metrics"], **options), NODE,
                                   lambda *_: body).collect())


def hits(r: Readings) -> dict[str, float]:
    return {labels[3]: value(r, "kvscope_kv_hit_tokens_total", *labels)
            for labels in series(r, "kvscope_kv_hit_tokens_total")}


def test_0_5_10_page_without_cache_source_is_g1_when_hicache_is_off() -> None:
    r, v = collect(PLAIN), PAGES.PLAIN
    assert hits(r) == {"G1": v["cached"]}
    assert value(r, "kvscope_kv_lookup_tokens_total", *BASE) == value(r, "kvscope_prompt_tokens_total", *BASE) == (
        v["prompt"])
    ttft = histogram(r, "kvscope_ttft_seconds", *BASE)
    assert [e for e, _ in ttft.buckets] == [*map(float, PAGES.TTFT), float("inf")] and ttft.count == len(v["ttft"])
    # tp_rank 0 and 1 report the same requests: gauges and the queue histogram from the lowest shard only
    assert value(r, "kvscope_kv_cache_usage_ratio", *BASE) == v["usage"][0]
    assert value(r, "kvscope_engine_hit_ratio", *BASE, "all", "sglang:cache_hit_rate") == v["hit_rate"][0]
    assert value(r, "kvscope_tier_capacity_tokens", *BASE, "G1") == v["max_tokens"]
    assert histogram(r, "kvscope_queue_time_seconds", *BASE).count == len(v["queue"])
    assert value(r, "kvscope_requests_running", *BASE) == v["running"]


def test_unsplit_hits_with_hicache_on_are_unattributed() -> None:
    """Without cache_source, a page that shows HiCache series cannot say which tier served a hit."""
    text = page("sglang", PLAIN) + page("sglang", COLON).replace(b"sglang:cached_tokens_total{", b"x_cached{")
    r = as_dict(SglangCollector(SglangOptions(urls=["http://s/metrics"]), NODE, lambda *_: text).collect())
    assert hits(r) == {"unattributed": PAGES.PLAIN["cached"]}
    forced = as_dict(SglangCollector(SglangOptions(urls=["http://s/metrics"], unsplit_hits_tier="G1"), NODE,
                                     lambda *_: text).collect())
    assert hits(forced) == {"G1": PAGES.PLAIN["cached"]}


@pytest.mark.parametrize(("name", "storage"), [(UNDERSCORE, "G4"), (COLON, "G3")])
def test_hicache_page_both_prefixes(name: str, storage: str) -> None:
    """`sglang_` and `sglang:` read alike; storage_hf3fs (3FS, distributed) is G4, the file backend G3 unless
    its directory sits on a network file system."""
    r, v = collect(name, kv_bytes_per_token=PAGES.BYTES_PER_TOKEN), PAGES.HICACHE
    c = v["cached"]
    assert hits(r) == {"G1": c["device"], "G2": c["host"], storage: c["storage"]}
    assert value(r, "kvscope_kv_computed_tokens_total", *BASE) == v["compute"]
    assert value(r, "kvscope_preemptions_total", *BASE) == v["retracted"]
    tokens = {labels[3:]: value(r, "kvscope_kv_transfer_tokens_total", *labels)
              for labels in series(r, "kvscope_kv_transfer_tokens_total")}
    assert tokens == {("G2", "G1"): v["load_back_tokens"], ("G1", "G2"): v["backup_tokens"],
                      (storage, "G2"): v["prefetched"], ("G2", storage): v["backuped"]}  # pool="swa" left out
    bpt = PAGES.BYTES_PER_TOKEN
    assert value(r, "kvscope_kv_transfer_bytes_total", *BASE, "G2", "G1") == v["load_back_tokens"] * bpt
    assert value(r, "kvscope_kv_transfer_bytes_total", *BASE, storage, "G2") == v["prefetched"] * bpt
    assert value(r, "kvscope_tier_capacity_tokens", *BASE, "G2") == v["host_total"]
    assert value(r, "kvscope_tier_used_tokens", *BASE, "G2") == v["host_used"]
    bw = histogram(r, "kvscope_kv_transfer_bandwidth_bytes_per_second", *BASE, storage, "G2")
    assert [e for e, _ in bw.buckets][:3] == [0.1e9, 0.5e9, 1e9] and bw.sum == pytest.approx(
        sum(v["prefetch_gbps"]) * 1e9)


def test_native_bytes_win_over_tokens_and_shards_are_summed() -> None:
    """load_back_bytes_total is per TP shard (each moves its slice): summed; tokens × kv_bytes_per_token is
    only for links without the engine's own byte counter."""
    r = collect(UNDERSCORE, kv_bytes_per_token=1)
    v = PAGES.HICACHE
    assert value(r, "kvscope_kv_transfer_bytes_total", *BASE, "G2", "G1") == v["load_back_tokens"] * 147_456
    assert value(r, "kvscope_kv_transfer_bytes_total", *BASE, "G4", "G2") == v["prefetched"]
    no_geometry = collect(UNDERSCORE)
    assert {labels[3:] for labels in series(no_geometry, "kvscope_kv_transfer_bytes_total")} == {
        ("G2", "G1"), ("G1", "G2")}


def test_file_backend_on_a_network_file_system_is_g4() -> None:
    r = collect(COLON, file_storage_dir="/kvbm/sglang")  # the Storage Scale bind mount of the node fixture
    assert hits(r)["G4"] == PAGES.HICACHE["cached"]["storage"]
    assert ("sglang", "sglang_hicache_file", "G4", "/kvbm/sglang", "/kvbm", "gpfs", "mount_type") in series(
        r, "kvscope_tier_placement_info")
    overridden = collect(COLON, storage_backend_tiers={"file": "G4"})
    assert hits(overridden)["G4"] == PAGES.HICACHE["cached"]["storage"]


def test_served_over_http_and_catalogued() -> None:
    catalogue = build_catalogue()
    with serving(page("sglang", UNDERSCORE), page("sglang", PLAIN)) as servers:
        opts = SglangOptions(urls=[s.url() for s in servers], kv_bytes_per_token=PAGES.BYTES_PER_TOKEN)
        readings = SglangCollector(opts).collect()
    r = as_dict(readings)
    assert all(value(r, "kvscope_scrape_target_up", "sglang", s.url()) == 1 for s in servers)
    for name, labels in r:
        spec = catalogue.get(name)
        assert spec is not None and len(spec.labels) == len(labels), name
    errors = {labels[1]: value(r, "kvscope_scrape_errors_total", *labels) for labels in series(
        r, "kvscope_scrape_errors_total") if labels[2] == "duplicate_series"}
    assert errors[servers[1].url()] == 1  # both pages serve the same model and dp rank: the second is dropped


def test_registered_disabled_and_checked() -> None:
    assert components().collectors["sglang"] is SPEC and not SPEC.enabled_by_default
    with pytest.raises(ConfigError, match=r"storage_backend_tiers\.hf3fs"):
        load_config('[collectors.sglang]\nenabled = true\nurls = ["http://h:30000/metrics"]\n'
                    'storage_backend_tiers = { hf3fs = "G9" }\n', components(), environ={})


def test_golden_exposition_of_the_hicache_page() -> None:
    with serving(page("sglang", UNDERSCORE)) as (server,):
        opts = SglangOptions(urls=[server.url()], kv_bytes_per_token=PAGES.BYTES_PER_TOKEN)
        text = exposition({"sglang": SPEC}, {"sglang": SglangCollector(opts, NODE)}, {server.url(): "TARGET"})
    assert_golden(FIXTURES / "sglang" / "expected-hicache-hf3fs-underscore-tp2.txt", text)
