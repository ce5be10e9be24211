"""SGLang /metrics → contract: both prefixes, hits per tier with and without `cache_source`, HiCache moves,
tp_rank shards. Expected numbers come from tests/fixtures/sglang/make_pages.py."""

from __future__ import annotations

from typing import Any

import pytest

from kvscope.agent.app.wiring import build_catalogue, components
from kvscope.agent.config.settings import ConfigError, load_config
from kvscope.collectors.engines.sglang import SPEC, SglangCollector, SglangOptions
from kvscope.collectors.engines.sglang_backends import backend_key
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


CURRENT = "hicache-nixl-current-tp1.prom"


@pytest.mark.parametrize(("spelled", "backend"), [
    ("storage_HiCacheNixl", "nixl"), ("HiCacheNixl", "nixl"), ("nixl", "nixl"), ("NIXL", "nixl"),
    ("storage_HiCacheFile", "file"), ("storage_MooncakeStore", "mooncake"), ("mooncake", "mooncake"),
    ("storage_HiCacheHF3FS", "hf3fs"), ("storage_AibrixKVCacheStorage", "aibrix"), ("storage_EICStorage", "eic"),
    ("storage_KVCCStore", "kvcc"), ("storage_unknown", "unknown"), ("storage_AcmeStore", "acmestore")])
def test_a_backend_is_one_name_however_sglang_spells_it(spelled: str, backend: str) -> None:
    """cache_source carries the class (type(backend).__name__), storage_backend the --hicache-storage-backend flag."""
    assert backend_key(spelled) == backend


def test_current_page_places_class_named_storage_hits_and_flag_named_moves_in_one_tier() -> None:
    """storage_HiCacheNixl hits and storage_backend="nixl" moves are NIXL's (G4): nothing left unattributed."""
    r, v = collect(CURRENT, kv_bytes_per_token=PAGES.BYTES_PER_TOKEN), PAGES.CURRENT
    c = v["cached"]
    assert hits(r) == {"G1": c["device"], "G2": c["host"], "G4": c["storage"]}
    tokens = {labels[3:]: value(r, "kvscope_kv_transfer_tokens_total", *labels)
              for labels in series(r, "kvscope_kv_transfer_tokens_total")}
    assert tokens == {("G2", "G1"): v["load_back_tokens"], ("G1", "G2"): v["backup_tokens"],
                      ("G4", "G2"): v["prefetched"], ("G2", "G4"): v["backuped"]}
    assert not series(r, "kvscope_engine_unmapped_values_total")


def test_every_series_of_a_target_carries_its_model() -> None:
    """SGLang's storage and radix-cache series have no model_name: they take the one the page's other series
    name, so transfers and hits of one engine share a model label."""
    r = collect(CURRENT, kv_bytes_per_token=PAGES.BYTES_PER_TOKEN)
    engine_series = [labels for name, labels in r if not name.startswith("kvscope_scrape_")
                     and name != "kvscope_tier_placement_info"]
    assert engine_series and {labels[1] for labels in engine_series} == {PAGES.MODEL}


def test_host_link_seconds_from_the_duration_histograms_give_its_bandwidth() -> None:
    """kvscope_kv_transfer_seconds_total is the histograms' _sum; bytes over seconds is the link's bandwidth
    while it moved, as SGLang's HELP text says to compute it."""
    r, v = collect(CURRENT), PAGES.CURRENT
    load_s, backup_s = sum(v["load_back_seconds"]), sum(v["backup_seconds"])
    assert value(r, "kvscope_kv_transfer_seconds_total", *BASE, "G2", "G1") == pytest.approx(load_s, rel=1e-12)
    assert value(r, "kvscope_kv_transfer_seconds_total", *BASE, "G1", "G2") == pytest.approx(backup_s, rel=1e-12)
    moved = value(r, "kvscope_kv_transfer_bytes_total", *BASE, "G2", "G1")  # the engine's own byte counter
    assert moved / value(r, "kvscope_kv_transfer_seconds_total", *BASE, "G2", "G1") == pytest.approx(
        v["load_back_tokens"] * PAGES.BYTES_PER_TOKEN / load_s)
    assert value(r, "kvscope_kv_evicted_tokens_total", *BASE, "G1") == v["evicted"]


def unknown_backend_page() -> bytes:
    return page("sglang", CURRENT).replace(b"HiCacheNixl", b"AcmeKV").replace(b'"nixl"', b'"acme"')


def test_a_backend_the_table_does_not_know_is_named_once_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    body = unknown_backend_page()
    collector = SglangCollector(SglangOptions(urls=["http://s/metrics"]), NODE, lambda *_: body)
    with caplog.at_level("WARNING", logger="kvscope.collectors.engines.sglang"):
        first, second = as_dict(collector.collect()), as_dict(collector.collect())
    warned = [rec.getMessage() for rec in caplog.records if "storage backend" in rec.getMessage()]
    assert len(warned) == 2 and "'acme'" in warned[0] + warned[1] and "'acmekv'" in warned[0] + warned[1]
    assert value(first, "kvscope_engine_unmapped_values_total", "sglang", "storage_backend", "acme") == 1
    assert value(second, "kvscope_engine_unmapped_values_total", "sglang", "storage_backend", "acme") == 2
    assert hits(second)["unattributed"] == PAGES.CURRENT["cached"]["storage"]


def test_a_configured_backend_is_placed_by_its_class_or_flag_name(caplog: pytest.LogCaptureFixture) -> None:
    body = unknown_backend_page()
    opts = SglangOptions(urls=["http://s/metrics"], storage_backend_tiers={"AcmeKV": "G4", "acme": "G4"})
    with caplog.at_level("WARNING", logger="kvscope.collectors.engines.sglang"):
        r = as_dict(SglangCollector(opts, NODE, lambda *_: body).collect())
    assert hits(r)["G4"] == PAGES.CURRENT["cached"]["storage"] and "unattributed" not in hits(r)
    assert not caplog.records and not series(r, "kvscope_engine_unmapped_values_total")
