"""vLLM 0.33's newer families on the contract: eviction and reuse as the engine measures them, waiting requests by
reason, the CPU offload tier's space pinned by transfers, tier lookup delays and failed jobs per link. Expected
numbers come from tests/fixtures/vllm-newer/make_pages.py (VALUES)."""

from __future__ import annotations

import math

from kvscope.agent.app.wiring import build_catalogue
from kvscope.agent.core.store import Store
from kvscope.collectors.engines.vllm_metrics import NAME, VllmMetricsCollector, VllmOptions
from testkit.engine_pages import Readings, as_dict, fixture_module, histogram, page, value

NEWER = fixture_module("vllm-newer")
V = NEWER.VALUES
B = ("vllm", NEWER.MODEL, "0")


def collect(tiering_tiers: dict[str, str] | None = None) -> Readings:
    body = page("vllm-newer", "v0.33.0-newer-families-dp1.prom")
    options = VllmOptions(urls=["http://t/metrics"], tiering_tiers=tiering_tiers or {})
    return as_dict(VllmMetricsCollector(options, fetch=lambda *_: body).collect())


def cumulative(observations: list[float], edges: tuple[float, ...]) -> list[float]:
    return [float(sum(1 for x in observations if x <= e)) for e in (*edges, math.inf)]


def test_waiting_by_reason_adds_up_to_waiting() -> None:
    r = collect()
    for reason, n in V["waiting"].items():
        assert value(r, "kvscope_requests_waiting_by_reason", *B, reason) == n
    assert value(r, "kvscope_requests_waiting", *B) == sum(V["waiting"].values())


def test_block_lifetime_idle_and_reuse_gap_are_g1_histograms_with_vllms_buckets() -> None:
    r = collect()
    for key, metric in (("lifetime", "kvscope_kv_block_lifetime_seconds"),
                        ("idle", "kvscope_kv_block_idle_before_evict_seconds"),
                        ("reuse_gap", "kvscope_kv_block_reuse_gap_seconds")):
        h = histogram(r, metric, *B, "G1")
        assert [e for e, _ in h.buckets] == [*NEWER.RESIDENCY, math.inf]
        assert [n for _, n in h.buckets] == cumulative(V[key], NEWER.RESIDENCY)
        assert h.count == len(V[key]) and math.isclose(h.sum, sum(V[key]))


def test_cpu_offload_usage_is_pinned_space_not_fullness() -> None:
    r = collect()
    assert value(r, "kvscope_tier_transfer_pinned_ratio", *B, "G2") == V["cpu_usage"]
    assert ("kvscope_tier_used_bytes", (*B, "G2")) not in r  # pinned by transfers is not resident


def test_lookup_delays_per_tier_and_mode() -> None:
    r = collect()
    tiers = {"0:primary": "G2", "1:fs": "G3", "2:obj": "G4"}
    for key, mode, edges in (("lookup_sync", "sync", NEWER.LOOKUP_SYNC), ("lookup_async", "async", NEWER.LOOKUP_ASYNC)):
        for label, observations in V[key].items():
            h = histogram(r, "kvscope_tier_lookup_delay_seconds", *B, tiers[label], mode)
            assert [n for _, n in h.buckets] == cumulative(observations, edges)
            assert h.count == len(observations)


def test_two_tiers_taken_as_one_add_their_lookup_histograms() -> None:
    """`1:fs` configured as G4 beside `2:obj` (G4 by default): one G4 series, bucket by bucket the sum."""
    r = collect(tiering_tiers={"1:fs": "G4"})
    h = histogram(r, "kvscope_tier_lookup_delay_seconds", *B, "G4", "sync")
    both = V["lookup_sync"]["1:fs"] + V["lookup_sync"]["2:obj"]
    assert [n for _, n in h.buckets] == cumulative(both, NEWER.LOOKUP_SYNC)
    assert h.count == len(both) and math.isclose(h.sum, sum(both))


def test_failed_jobs_per_link() -> None:
    r = collect()
    assert value(r, "kvscope_kv_transfer_failed_jobs_total", *B, "G3", "G2") == V["promotion_failures"]["1:fs"]
    assert value(r, "kvscope_kv_transfer_failed_jobs_total", *B, "G4", "G2") == V["promotion_failures"]["2:obj"]
    assert value(r, "kvscope_kv_transfer_failed_jobs_total", *B, "G2", "G3") == V["cascade_failures"]["1:fs"]
    assert value(r, "kvscope_kv_transfer_failed_jobs_total", *B, "G2", "G4") == V["cascade_failures"]["2:obj"]


def test_everything_read_is_catalogued() -> None:
    body = page("vllm-newer", "v0.33.0-newer-families-dp1.prom")
    readings = VllmMetricsCollector(VllmOptions(urls=["http://t/metrics"]), fetch=lambda *_: body).collect()
    assert Store(build_catalogue()).ingest(NAME, readings, 0.0).rejected == 0
