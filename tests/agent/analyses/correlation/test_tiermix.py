"""Saved prefill time by tier: the engine counters' mix of hits and fetch seconds, and the split it gives."""

from __future__ import annotations

import pytest

from kvscope.agent.analyses.correlation import metrics as m
from kvscope.agent.analyses.correlation.analysis import CorrelationEngine
from kvscope.agent.analyses.correlation.options import CorrelationOptions
from kvscope.agent.analyses.correlation.tiermix import MIX_WAIT_SECONDS, TierMix, fetch_seconds_by_tier
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
    mix.close_window()
    assert mix.token_shares() == {"G1": 0.25, "G2": 0.25, "G4": 0.5}
    shares = mix.fetch_shares()
    assert shares["G4"] == pytest.approx((1.0 + 0.6) / 1.8)
    assert shares["G2"] == pytest.approx(0.2 / 1.8)
    split = mix.split(4000, avoided=10.0, fetch=1.8)
    assert split == pytest.approx({"G1": 2.5, "G2": 2.5 - 0.2, "G4": 5.0 - 1.6})
    assert sum(split.values()) == pytest.approx(10.0 - 1.8)  # adds up to the request's saved seconds


def test_requests_draw_the_hits_counted_around_them_not_the_long_run_mix() -> None:
    mix = TierMix()
    mix.add_hits("G1", 1000)
    assert mix.split(1000, 1.0, 0.0) == {"G1": 1.0}  # a G1 minute
    mix.add_hits("G4", 1000)
    assert mix.split(1000, 1.0, 0.0) == {"G4": 1.0}  # then a G4 one: not half G1 as the mix since the start
    assert mix.token_shares() == {"G1": 0.5, "G4": 0.5}


def test_a_request_ahead_of_its_hits_waits_for_them_then_falls_back_to_the_mix() -> None:
    mix = TierMix()
    mix.add_hits("G1", 500)
    mix.add_request(500, 1.0, 0.0, "high", now=0.0)
    mix.add_request(800, 2.0, 0.0, "high", now=1.0)  # its hits are not counted yet
    assert mix.settle(now=2.0) == [("high", {"G1": 1.0})]
    mix.add_hits("G3", 800)
    assert mix.settle(now=3.0) == [("high", pytest.approx({"G3": 2.0}))]
    mix.add_request(100, 1.0, 0.0, "low", now=4.0)
    assert mix.settle(now=4.0 + MIX_WAIT_SECONDS - 1) == []
    (late,) = mix.settle(now=4.0 + MIX_WAIT_SECONDS)  # never counted: the decayed mix's shares
    assert late[1] == pytest.approx({"G1": 500 / 1300, "G3": 800 / 1300})


def test_untimed_links_follow_the_token_shares_below_g1_and_nothing_seen_is_unattributed() -> None:
    mix = TierMix()
    mix.add_hits("G2", 300)
    mix.add_hits("G3", 100)
    assert mix.fetch_shares() == {"G2": 0.75, "G3": 0.25}
    assert fetch_seconds_by_tier({("G4", "G1"): 2.0}, {("G4", "G1"): 1e9}) == {"G4": 2.0}
    assert TierMix().split(10, 1.5, 0.5) == {"unattributed": 1.0}  # no counter placed it: not guessed


def test_untimed_fetch_follows_the_tiers_each_request_read_not_the_mix() -> None:
    """No link seconds (vLLM 0.14.1 + KVBM): a request that drew its hits from G4 only fetched from G4, one that
    drew from G2 only from G2, whatever the run's mix; one that drew only G1 hits falls back to the mix."""
    mix = TierMix()
    mix.add_hits("G2", 3000)
    mix.add_hits("G4", 1000)
    assert mix.split(4000, 1.0, 0.0) == pytest.approx({"G2": 0.75, "G4": 0.25})  # the pool drawn empty
    mix.add_hits("G4", 500)
    assert mix.split(500, 1.0, 0.2) == pytest.approx({"G4": 0.8})  # all its fetch from G4, not the mix's 30 %
    mix.add_hits("G2", 500)
    assert mix.split(500, 1.0, 0.2) == pytest.approx({"G2": 0.8})
    mix.add_hits("G1", 500)
    assert mix.fetch_shares() == pytest.approx({"G2": 0.7, "G4": 0.3})
    assert mix.split(500, 1.0, 0.2) == pytest.approx({"G1": 1.0, "G2": -0.14, "G4": -0.06})


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


def test_a_g2_that_serves_nothing_of_its_own_owns_none_of_the_last_hop() -> None:
    """G4's blocks relayed through G2, whose two hops a window counted apart (less into G2 than out of it):
    without G2 hits the whole G2 -> G1 time is G4's."""
    links = {("G4", "G2"): 1.0, ("G2", "G1"): 0.5}
    moved = {("G4", "G2"): 1e9, ("G2", "G1"): 2e9}
    assert fetch_seconds_by_tier(links, moved, g2_serves=False) == {"G4": 1.5}
    assert fetch_seconds_by_tier(links, moved, g2_serves=True) == {"G4": 1.25, "G2": 0.25}
    mix = TierMix()
    mix.add_hits("G4", 100)
    mix.add_onboard("G4", "G2", 1e9, 1.0)
    mix.add_onboard("G2", "G1", 2e9, 0.5)
    mix.close_window()
    assert mix.fetch_shares() == {"G4": 1.0}


def test_a_window_with_only_the_last_hop_of_a_relay_gives_it_to_the_tiers_relayed_before() -> None:
    """The window that counts G2 -> G1 may count none of the G4 -> G2 bytes it relays (the scrape fell between
    the hops): a G2 that serves no hits still owns none of it, the tiers that filled G2 before do."""
    assert fetch_seconds_by_tier({("G2", "G1"): 0.5}, {("G2", "G1"): 1e9}, g2_serves=False,
                                 relayed_before={"G4": 3e9, "G3": 1e9}) == {"G4": 0.375, "G3": 0.125}
    mix = TierMix()
    mix.add_hits("G4", 100)
    mix.add_onboard("G4", "G2", 1e9, 1.0)
    mix.close_window()
    mix.add_onboard("G2", "G1", 1e9, 0.5)  # the next window: only the last hop
    mix.close_window()
    assert mix.fetch_shares() == {"G4": 1.0}
    assert fetch_seconds_by_tier({("G2", "G1"): 0.5}, {("G2", "G1"): 1e9}, g2_serves=True,
                                 relayed_before={"G4": 3e9}) == {"G2": 0.5}  # G2 serving hits: its own
