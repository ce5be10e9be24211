"""LMCache lmcache:* → contract: hits unattributed unless configured, milliseconds, workers as shards, usage per
backend. Expected numbers come from tests/fixtures/lmcache/make_pages.py."""

from __future__ import annotations

from typing import Any

import pytest

from kvscope.agent.app.wiring import build_catalogue, components
from kvscope.agent.config.settings import ConfigError, load_config
from kvscope.collectors.engines.discovery import DISCOVERED, DiscoveryCollector, DiscoveryOptions
from kvscope.collectors.engines.lmcache import SPEC, LmcacheCollector, LmcacheOptions
from kvscope.collectors.engines.vllm_metrics import VllmMetricsCollector, VllmOptions
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

PAGES = fixture_module("lmcache")
NODE = str(FIXTURES / "dynamo" / "node" / "proc")
BASE = ("lmcache", PAGES.MODEL, "0")
ON_VLLM, REMOTE = "on-vllm-0.20-page.prom", "internal-api-tp2-remote.prom"


def collect(name: str, **options: Any) -> Readings:
    body = page("lmcache", name)
    return as_dict(LmcacheCollector(LmcacheOptions(urls=["http://l/metrics"], **options), NODE,
                                    lambda *_: body).collect())


def test_on_vllms_page_hits_unattributed_and_engine_totals_left_to_vllm() -> None:
    r, v = collect(ON_VLLM), PAGES.ON_VLLM
    assert value(r, "kvscope_kv_hit_tokens_total", *BASE, "unattributed") == v["hit"]
    assert value(r, "kvscope_connector_hit_tokens_total", *BASE) == v["hit"]
    assert value(r, "kvscope_connector_lookup_tokens_total", *BASE) == v["requested"]
    assert not series(r, "kvscope_kv_lookup_tokens_total") and not series(r, "kvscope_prompt_tokens_total")
    # LMCache's hits are vLLM's connector hits, and its requested tokens what vLLM's GPU cache missed
    body = page("lmcache", ON_VLLM)
    vllm = as_dict(VllmMetricsCollector(VllmOptions(urls=["http://v/metrics"]), fetch=lambda *_: body).collect())
    hits = {labels[3]: value(vllm, "kvscope_kv_hit_tokens_total", *labels)
            for labels in series(vllm, "kvscope_kv_hit_tokens_total")}
    assert hits["unattributed"] == v["hit"] and hits["G1"] == v["vllm_hit"]


def test_engine_totals_and_a_configured_hit_tier() -> None:
    r, v = collect(ON_VLLM, engine_totals=True, hit_tier="G2"), PAGES.ON_VLLM
    assert value(r, "kvscope_kv_lookup_tokens_total", *BASE) == value(r, "kvscope_prompt_tokens_total", *BASE) == (
        v["prompt"])
    assert {labels[3]: value(r, "kvscope_kv_hit_tokens_total", *labels)
            for labels in series(r, "kvscope_kv_hit_tokens_total")} == {"G1": v["vllm_hit"], "G2": v["hit"]}


def test_internal_api_page_two_workers_remote_backend() -> None:
    r, v = collect(REMOTE), PAGES.REMOTE
    assert value(r, "kvscope_kv_hit_tokens_total", *BASE, "unattributed") == v["hit"]  # not twice: workers are shards
    assert value(r, "kvscope_kv_transfer_bytes_total", *BASE, "G4", "G2") == sum(v["remote_read_bytes"])
    assert value(r, "kvscope_kv_transfer_bytes_total", *BASE, "G2", "G4") == sum(v["remote_write_bytes"])
    # milliseconds on LMCache's page, seconds in kvscope's
    assert value(r, "kvscope_kv_transfer_seconds_total", *BASE, "G4", "G2") == pytest.approx(
        2 * sum(v["remote_get_ms"]) / 1000)
    assert value(r, "kvscope_kv_transfer_seconds_total", *BASE, "G2", "G4") == pytest.approx(
        2 * sum(v["remote_put_ms"]) / 1000)
    assert value(r, "kvscope_tier_used_bytes", *BASE, "G2") == sum(v["local_cpu_bytes"])
    assert value(r, "kvscope_tier_used_bytes", *BASE, "G3") == 0
    assert value(r, "kvscope_tier_used_bytes", *BASE, "G4") == sum(v["remote_bytes"])
    assert value(r, "kvscope_engine_hit_ratio", *BASE, "all", "lmcache:retrieve_hit_rate") == v["retrieve_hit_rate"]
    load = histogram(r, "kvscope_kv_load_seconds", *BASE)
    assert load.count == len(v["retrieve_s"]) and load.sum == pytest.approx(sum(v["retrieve_s"]))
    assert histogram(r, "kvscope_kv_store_seconds", *BASE).count == len(v["store_s"])


def test_local_disk_on_a_network_file_system_and_remote_tier() -> None:
    r = collect(REMOTE, local_disk_dir="/mnt/kv pool/lmcache", remote_tier="G3")
    assert ("lmcache", "lmcache_local_disk", "G4", "/mnt/kv pool/lmcache", "/mnt/kv pool", "nfs", "mount_type") in (
        series(r, "kvscope_tier_placement_info"))
    assert {labels[3] for labels in series(r, "kvscope_tier_used_bytes")} == {"G2", "G3", "G4"}
    assert value(r, "kvscope_kv_transfer_bytes_total", *BASE, "G3", "G2") == sum(PAGES.REMOTE["remote_read_bytes"])


def test_served_over_http_and_catalogued() -> None:
    catalogue = build_catalogue()
    with serving(page("lmcache", REMOTE)) as (server,):
        r = as_dict(LmcacheCollector(LmcacheOptions(urls=[server.url()], engine_totals=True)).collect())
    assert value(r, "kvscope_scrape_target_up", "lmcache", server.url()) == 1
    for name, labels in r:
        spec = catalogue.get(name)
        assert spec is not None and len(spec.labels) == len(labels), name


def test_registered_disabled_and_checked() -> None:
    assert components().collectors["lmcache"] is SPEC and not SPEC.enabled_by_default
    with pytest.raises(ConfigError, match="hit_tier"):
        load_config('[collectors.lmcache]\nenabled = true\nurls = ["http://h:7000/metrics"]\nhit_tier = "G1"\n',
                    components(), environ={})


def test_golden_exposition_of_the_internal_api_page() -> None:
    with serving(page("lmcache", REMOTE)) as (server,):
        collector = LmcacheCollector(LmcacheOptions(urls=[server.url()]), NODE)
        text = exposition({"lmcache": SPEC}, {"lmcache": collector}, {server.url(): "TARGET"})
    assert_golden(FIXTURES / "lmcache" / "expected-internal-api-tp2-remote.txt", text)


MP = "mp-server-two-tenants-fs.prom"


def test_mp_server_lookups_and_hits_summed_over_tenants() -> None:
    """lmcache_mp_lookup_{requested,hit}_tokens (L1 and L2 together) by cache_salt: summed into the connector's
    lookups and hits; the hits unattributed (no L1/L2 split) unless hit_tier says."""
    r, v = collect(MP), PAGES.MP
    assert value(r, "kvscope_connector_lookup_tokens_total", *BASE) == sum(v["requested"].values())
    assert value(r, "kvscope_connector_hit_tokens_total", *BASE) == sum(v["hit"].values())
    assert value(r, "kvscope_kv_hit_tokens_total", *BASE, "unattributed") == sum(v["hit"].values())
    # the one L2 adapter on the page is fs (G3): its unlabelled prefetch chunk counters are G3's
    assert value(r, "kvscope_connector_tier_lookup_blocks_total", *BASE, "G3") == v["l2_lookup_chunks"]
    assert value(r, "kvscope_connector_tier_hit_blocks_total", *BASE, "G3") == v["l2_hit_chunks"]


def test_mp_server_usage_and_throughput_per_tier() -> None:
    """L1 is the MP server's CPU memory (G2); L2 by l2_name (fs G3 by default, l2_tiers overrides); GB/s as 1e9."""
    r, v = collect(MP), PAGES.MP
    assert value(r, "kvscope_tier_used_bytes", *BASE, "G2") == v["l1_bytes"]
    assert value(r, "kvscope_tier_used_bytes", *BASE, "G3") == v["l2_bytes"]
    links = {("G1", "G2"): "store_gbs", ("G2", "G1"): "load_gbs", ("G2", "G3"): "l2_store_gbs",
             ("G3", "G2"): "l2_load_gbs"}
    for link, key in links.items():
        bw = histogram(r, "kvscope_kv_transfer_bandwidth_bytes_per_second", *BASE, *link)
        assert bw.count == len(v[key]) and bw.sum == pytest.approx(sum(v[key]) * 1e9, rel=1e-12), link
        assert [e for e, _ in bw.buckets][:2] == [0.1e9, 0.5e9]
    shared = collect(MP, l2_tiers={"fs": "G4"})
    assert value(shared, "kvscope_tier_used_bytes", *BASE, "G4") == v["l2_bytes"]
    assert histogram(shared, "kvscope_kv_transfer_bandwidth_bytes_per_second", *BASE, "G4", "G2").count == 2


@pytest.mark.parametrize(("metric", "tier", "key"), [
    ("kvscope_kv_block_lifetime_seconds", "G2", "lifetime_s"),
    ("kvscope_kv_block_idle_before_evict_seconds", "G2", "idle_s"),
    ("kvscope_kv_block_reuse_gap_seconds", "G2", "reuse_gap_s"),
    ("kvscope_kv_block_lifetime_seconds", "G1", "gpu_lifetime_s"),
    ("kvscope_kv_block_idle_before_evict_seconds", "G1", "gpu_idle_s"),
    ("kvscope_kv_block_reuse_gap_seconds", "G1", "gpu_reuse_gap_s")])
def test_mp_server_chunk_lifecycle_as_lmcache_measures_it(metric: str, tier: str, key: str) -> None:
    """Series without model_name (the L1 chunk histograms) take the page's one model."""
    h = histogram(collect(MP), metric, *BASE, tier)
    assert h.count == len(PAGES.MP[key]) and h.sum == pytest.approx(sum(PAGES.MP[key]), rel=1e-12)


def test_mp_page_served_over_http_is_identified_and_catalogued() -> None:
    catalogue = build_catalogue()
    with serving(page("lmcache", MP)) as (server,):
        r = as_dict(LmcacheCollector(LmcacheOptions(urls=[server.url()])).collect())
        found = DiscoveryCollector(DiscoveryOptions(candidates=[server.url()])).collect()
    assert value(r, "kvscope_scrape_target_up", "lmcache", server.url()) == 1
    assert value(r, "kvscope_scrape_malformed_lines_total", "lmcache", server.url()) == 0
    for name, labels in r:
        spec = catalogue.get(name)
        assert spec is not None and len(spec.labels) == len(labels), name
    assert {x.labels[0] for x in found if x.name == DISCOVERED} == {"lmcache"}
