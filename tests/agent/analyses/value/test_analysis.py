"""The value analysis: the what-if's and correlation's counters in a store, GPU-seconds and prices out."""

from __future__ import annotations

import pytest

from kvscope.agent.analyses.correlation import metrics as cm
from kvscope.agent.analyses.value import metrics as m
from kvscope.agent.analyses.value.analysis import SPEC, ValueAnalysis
from kvscope.agent.analyses.value.curve import GIB
from kvscope.agent.analyses.value.options import ValueOptions
from kvscope.agent.analyses.whatif import metrics as wm
from kvscope.agent.core import contract
from kvscope.agent.core.catalogue import AGENT_METRICS, Catalogue
from kvscope.agent.core.readings import HistogramSample, Reading, Sample
from kvscope.agent.core.store import Store

E = ("vllm", "gpt-oss-120b", "0")
TIB = 1024 * GIB


def make_store() -> Store:
    return Store(Catalogue([*AGENT_METRICS, *contract.CONTRACT_METRICS, *cm.METRICS, *wm.METRICS, *SPEC.metrics]))


def readings(hours: float) -> list[Reading]:
    """After `hours` at a steady rate: the what-if predicts 100 GPU-s/h saved today, 130 with G4 doubled and 60
    with it halved, over 1,000 requests an hour; G4 served 10M tokens/h and saved 90 GPU-s/h (lost 10)."""
    def ttft(scenario: str) -> HistogramSample:
        n = 1000 * hours
        return HistogramSample(wm.TTFT, (*E, scenario, "high"), ((float("inf"), n),), 0.5 * n, n)

    out: list[Reading] = [Sample(wm.PREFILL_SAVED, (*E, s, "high"), v * hours)
                          for s, v in (("today", 100.0), ("G4x2", 130.0), ("G4x0.5", 60.0))]
    out.append(Sample(wm.PREFILL_LOST, (*E, "today", "high"), 0.0))
    out.extend(Sample(wm.CAPACITY_BYTES, (*E, s, "G4"), size)
               for s, size in (("today", TIB), ("G4x2", 2 * TIB), ("G4x0.5", TIB / 2)))
    out.extend([ttft("today"), Sample(cm.TIER_SAVED, (*E, "G4", "high"), 100.0 * hours),
                Sample(cm.TIER_LOST, (*E, "G4", "high"), 10.0 * hours),
                Sample(contract.KV_HIT_TOKENS, (*E, "G4"), 10e6 * hours),
                Sample(contract.KV_TRANSFER_BYTES, (*E, "G4", "G2"), 10e6 * 36_864 * hours),
                Sample(cm.TOKEN_BYTES, E, 36_864.0), Sample(cm.TIER_BANDWIDTH, (*E, "G4"), 10e9),
                Sample(cm.COST_A, E, 4.136e-5), Sample(cm.COST_B, E, 1.584e-9),
                Sample(cm.BREAKEVEN_TOKENS, E, 130_000.0)])
    return out


def run(options: ValueOptions) -> dict[tuple[str, tuple[str, ...]], float]:
    store, now = make_store(), [0.0]
    analysis = ValueAnalysis(options, store, lambda: now[0])
    store.ingest("sources", readings(0.0), now[0])
    analysis.run()
    now[0] = 1800.0
    store.ingest("sources", readings(0.5), now[0])
    out = analysis.run()
    assert store.ingest("value", out, now[0]).rejected == 0  # catalogued, with the catalogue's labels
    return {(r.name, r.labels): r.value for r in out if isinstance(r, Sample)}


def test_marginal_gpu_seconds_of_the_next_and_last_step_and_no_cost_without_prices() -> None:
    got = run(ValueOptions(gpus_per_engine=2.0))
    assert got[(m.MARGINAL, (*E, "G4", "next", "high"))] == pytest.approx(2 * 30.0)
    assert got[(m.MARGINAL, (*E, "G4", "last", "high"))] == pytest.approx(2 * 40.0)
    assert got[(m.MARGINAL_STEP, (*E, "G4", "next"))] == TIB
    assert got[(m.MARGINAL_STEP, (*E, "G4", "last"))] == TIB / 2
    assert got[(m.MARGINAL_REQUESTS, E)] == pytest.approx(500)  # half an hour at 1,000/h
    assert got[(m.ENGINE_GPUS, E)] == 2.0
    assert not any(name in (m.TIER_VALUE, m.TIER_COST, m.TOKEN_COST, m.BREAKEVEN_SIZE) for name, _ in got)


def test_with_prices_value_cost_per_token_and_break_even() -> None:
    # GPU 2/h; G4 0.1 per TiB-hour (73 per TiB-month), G4 -> G2 at 0.001 per GB
    options = ValueOptions(gpu_hour=2.0, tier_gib_month={"G4": 73.0 / 1024}, transfer_gb={"G4->G2": 0.001})
    got = run(options)
    assert got[(m.TIER_VALUE, (*E, "G4"))] == pytest.approx(90.0 / 3600 * 2.0)
    moved = 10e6 * 36_864 / 1e9 * 0.001  # GB per hour x price
    assert got[(m.TIER_COST, (*E, "G4"))] == pytest.approx(0.1 + moved)
    assert got[(m.TOKEN_COST, (*E, "G4"))] == pytest.approx(36_864 / 10e9 * 2 / 3600 + (0.1 + moved) / 10e6)
    assert got[(m.RECOMPUTE_TOKEN_COST, E)] == pytest.approx((4.136e-5 + 1.584e-9 * 130_000) * 2 / 3600)
    # value less storage cost per hour: 0.5 TiB 0.0333 − 0.05, 1 TiB 0.0556 − 0.1, 2 TiB 0.0722 − 0.2
    assert got[(m.BREAKEVEN_SIZE, (*E, "G4"))] == TIB / 2
    assert got[(m.BREAKEVEN_BEYOND, (*E, "G4"))] == 0.0


def test_options_say_what_is_wrong() -> None:
    for bad, words in ((ValueOptions(gpus_per_engine=0), "gpus_per_engine"),
                       (ValueOptions(gpu_hour=1, tier_gib_month={"G5": 1.0}), "unknown tier"),
                       (ValueOptions(gpu_hour=1, transfer_gb={"G4": 1.0}), "SRC->DST"),
                       (ValueOptions(tier_gib_month={"G4": 1.0}), "need gpu_hour")):
        with pytest.raises(ValueError, match=words):
            bad.validate("analyses.value")
    ValueOptions(gpu_hour=2.0, tier_gib_month={"G4": 0.05}, transfer_gb={"G4->G2": 0.01}).validate("analyses.value")
