"""LMCache lmcache:* → contract: hits unattributed unless configured, milliseconds, workers as shards, usage per
backend. Expected numbers come from tests/fixtures/lmcache/make_pages.py."""

from __future__ import annotations

from typing import Any

import pytest

from kvscope.agent.app.wiring import build_catalogue, components
from kvscope.agent.config.settings import ConfigError, load_config
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
