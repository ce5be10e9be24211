"""Saved prefill time by tier: the engine counters' mix of hits and fetch seconds, and the split it gives."""

from __future__ import annotations

import pytest

from kvscope.agent.analyses.correlation import metrics as m
from kvscope.agent.analyses.correlation.analysis import CorrelationEngine
from kvscope.agent.analyses.correlation.options import CorrelationOptions
from kvscope.agent.analyses.correlation.tiermix import TierMix
from kvscope.agent.core import contract
from kvscope.agent.core.catalogue import AGENT_METRICS, Catalogue
from kvscope.agent.core.readings import HistogramSample, Reading, Sample
from kvscope.agent.core.records import RecordBuffer, RequestRecord
from kvscope.agent.core.store import Store

E = ("reference", "gpt-oss-120b", "0")
A, B = 4.14e-5, 1.58e-9  # the seeds' cost model


def compute(n: float) -> float:
    return A * n + B * n * n


def test_g4_read_through_host_memory_owns_its_share_of_the_last_hop() -> None:
    mix = TierMix()
    mix.add_hits("G1", 1000)
    mix.add_hits("G2", 1000)
    mix.add_hits("G4", 2000)
    mix.add_onboard("G4", "G2", 3e9, 1.0)  # G4's blocks land in G2 ...
    mix.add_onboard("G2", "G1", 4e9, 0.8)  # ... then cross G2 -> G1 with G2's own (3 of 4 GB are G4's)
    assert mix.token_shares() == {"G1": 0.25, "G2": 0.25, "G4": 0.5}
    shares = mix.fetch_shares()
    assert shares["G4"] == pytest.approx((1.0 + 0.6) / 1.8)
    assert shares["G2"] == pytest.approx(0.2 / 1.8)
    split = mix.split(avoided=10.0, fetch=1.8)
    assert split == pytest.approx({"G1": 2.5, "G2": 2.5 - 0.2, "G4": 5.0 - 1.6})
    assert sum(split.values()) == pytest.approx(10.0 - 1.8)  # adds up to the request's saved seconds


def test_untimed_links_follow_the_token_shares_below_g1_and_decay_ages_the_mix() -> None:
    mix = TierMix()
    mix.add_hits("G2", 300)
    mix.add_hits("G3", 100)
    assert mix.fetch_shares() == {"G2": 0.75, "G3": 0.25}
    mix.decay(0.5)
    mix.add_hits("G3", 200)  # the workload moved to G3
    assert mix.token_shares() == {"G2": pytest.approx(150 / 400), "G3": pytest.approx(250 / 400)}
    assert TierMix().split(1.0, 0.5) == {"unattributed": -0.5}  # fetched, no tier seen: not guessed


def engine_series(hits: dict[str, float], g4_bytes: float, g4_seconds: float, n: int, ttft: float) -> list[Reading]:
    def hist(name: str, total: float) -> HistogramSample:
        return HistogramSample(name, E, ((float("inf"), n),), total, n)

    out: list[Reading] = [hist(contract.TTFT_SECONDS, ttft), hist(contract.QUEUE_SECONDS, 0.0),
                          hist(contract.PREFILL_SECONDS, ttft),
                          Sample(contract.KV_TRANSFER_BYTES, (*E, "G4", "G1"), g4_bytes),
                          Sample(contract.KV_TRANSFER_SECONDS, (*E, "G4", "G1"), g4_seconds)]
    out.extend(Sample(contract.KV_HIT_TOKENS, (*E, tier), tokens) for tier, tokens in hits.items())
    return out


def test_requests_saved_seconds_land_on_the_tiers_that_served_them() -> None:
    """Two warm 100k-token requests, half their reuse from G1, half from G4 (fetch 0.5 s each); at the seeds'
    cost they each avoid compute(100k) − compute(10k after 90k)."""
    store = Store(Catalogue([*AGENT_METRICS, *contract.CONTRACT_METRICS, *m.METRICS]))
    buffer, now = RecordBuffer(), [1000.0]
    engine = CorrelationEngine(CorrelationOptions(prefill_a=A, prefill_b=B, fit_min_samples=1000), store, buffer,
                               None, lambda: now[0])
    store.ingest("reference", engine_series({"G1": 90_000, "G4": 90_000}, 90_000 * 36_864.0, 1.0, 2, 4.0), now[0])
    engine.run()  # the mix: what the counters say served the reuse
    new = 10_000
    prefill = A * new + B * new * (2 * 90_000 + new)
    buffer.put([RequestRecord(f"r{i}", *E, arrival=990.0 + i, ttft=0.5 + prefill, prompt_tokens=100_000,
                              cached_tokens=90_000, queue=0.0, prefill=0.5 + prefill, fetch_seconds=0.5)
                for i in range(2)])
    now[0] += 1
    out = {(r.name, r.labels): r.value for r in engine.run() if isinstance(r, Sample)}
    avoided = compute(100_000) - prefill
    saved = {tier: out[(m.TIER_SAVED, (*E, tier, "low"))] for tier in ("G1", "G4")}
    assert saved["G1"] == pytest.approx(2 * avoided / 2)
    assert saved["G4"] == pytest.approx(2 * (avoided / 2 - 0.5))
    assert out[(m.TIER_LOST, (*E, "G4", "low"))] == 0.0
    assert sum(saved.values()) == pytest.approx(out[(m.PREFILL_SAVED, (*E, "low"))])
