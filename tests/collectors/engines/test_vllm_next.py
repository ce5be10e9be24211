"""The vLLM adapter on the pages issue 13 brings (tests/fixtures/vllm-next/, tests/fixtures/dynamo/): what it
does today, and — marked xfail(strict) until the adapter changes listed in docs/engines.md land — what it
must do: preemptions, tiering labels named by class, NIXL transfers."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from kvscope.collectors.engines.vllm_metrics import VllmMetricsCollector, VllmOptions
from testkit.engine_pages import Readings, as_dict, fixture_module, histogram, page, series, value

VLLM = fixture_module("vllm")
NEXT = fixture_module("vllm-next")
SEEDS = fixture_module("dynamo")
PENDING = "vllm adapter change pending"


def collect(folder: str, name: str, **options: Any) -> Readings:
    body = page(folder, name)
    return as_dict(VllmMetricsCollector(VllmOptions(urls=["http://t/metrics"], **options),
                                        fetch=lambda *_: body).collect())


def test_vllm_0_14_1_under_dynamo_degrades_to_what_it_has() -> None:
    """No by-source hits and no offload families: G1 hits, connector hits unattributed, computed tokens from
    the per-request histogram's sum, TTFT, G1 capacity."""
    r = collect("dynamo", "worker-0.9.0-vllm-0.14.1.prom")
    s, b = SEEDS.SEEDS, ("vllm", SEEDS.MODEL, "0")
    assert value(r, "kvscope_kv_lookup_tokens_total", *b) == s["requests"] * s["prompt_tokens"]
    assert value(r, "kvscope_kv_hit_tokens_total", *b, "G1") == 0
    assert value(r, "kvscope_kv_hit_tokens_total", *b, "unattributed") == s["matched_tokens"]
    assert value(r, "kvscope_kv_computed_tokens_total", *b) == s["requests"] * s["prompt_tokens"] - s["matched_tokens"]
    assert histogram(r, "kvscope_ttft_seconds", *b).count == 2 * len(SEEDS.FRONTEND["ttft"])
    assert value(r, "kvscope_tier_capacity_tokens", *b, "G1") == 37_710 * 16
    assert not series(r, "kvscope_kv_transfer_bytes_total")


def test_preemptions_on_every_version_that_has_them() -> None:
    for folder, name, expected in (("dynamo", "worker-0.9.0-vllm-0.14.1.prom", 2.0),
                                   ("vllm", "v0.14.1-dp1.prom", VLLM.engine_values(0, 1.0)["preemptions"]),
                                   ("vllm", "v0.33.0-cpu-offload-dp2.prom", VLLM.engine_values(0, 1.0)["preemptions"])):
        r = collect(folder, name)
        model = SEEDS.MODEL if folder == "dynamo" else VLLM.MODEL
        assert value(r, "kvscope_preemptions_total", "vllm", model, "0") == expected, name


def test_tiering_labels_named_by_class(caplog: pytest.LogCaptureFixture) -> None:
    """`<index>:<type>` labels beyond `0:primary`/`1:fs`: a file-system tier manager class at index 1 is G3,
    a shared one G4; one no rule knows is unattributed with one log line naming it; config overrides."""
    v, b = VLLM.engine_values(0, 1.0), ("vllm", VLLM.MODEL, "0")
    body = page("vllm-next", "v0.33.0-tiering-classnames-dp1.prom")
    collector = VllmMetricsCollector(VllmOptions(urls=["http://t/metrics"]), fetch=lambda *_: body)
    with caplog.at_level(logging.WARNING):
        r = as_dict(collector.collect())
        collector.collect()  # the same unknown label again: still one line
    assert value(r, "kvscope_kv_transfer_bytes_total", *b, "G3", "G2") == v["load_bytes"] // 2
    assert value(r, "kvscope_kv_transfer_bytes_total", *b, "G2", "G3") == v["store_bytes"] // 2
    assert value(r, "kvscope_kv_transfer_bytes_total", *b, "G4", "G2") == v["load_bytes"] // 3
    assert value(r, "kvscope_kv_transfer_bytes_total", *b, "unattributed", "G2") == v["load_bytes"] // 4
    assert len([m for m in caplog.messages if "3:MysteryTierManager" in m]) == 1
    r = collect("vllm-next", "v0.33.0-tiering-classnames-dp1.prom",
                tiering_tiers={"1:StripedFileSystemTierManager": "G4"})
    assert value(r, "kvscope_kv_transfer_bytes_total", *b, "G4", "G2") == v["load_bytes"] // 2 + v["load_bytes"] // 3


def test_nixl_transfers_of_disaggregated_prefill() -> None:
    """vllm:nixl_* on a decode instance: KV pulled from the prefill peer's GPU (proposed contract metrics
    kvscope_kv_peer_transfer_{bytes,seconds}_total and kvscope_kv_peer_transfer_failures_total{kind})."""
    r = collect("vllm-next", "v0.14.1-nixl-decode-dp1.prom")
    b, n = ("vllm", VLLM.MODEL, "0"), NEXT.NIXL
    assert value(r, "kvscope_kv_peer_transfer_bytes_total", *b) == sum(n["bytes"])
    assert value(r, "kvscope_kv_peer_transfer_seconds_total", *b) == pytest.approx(sum(n["xfer"]))
    assert value(r, "kvscope_kv_peer_transfer_failures_total", *b, "transfer") == n["failed_transfers"]
    assert value(r, "kvscope_kv_peer_transfer_failures_total", *b, "notification") == n["failed_notifications"]
