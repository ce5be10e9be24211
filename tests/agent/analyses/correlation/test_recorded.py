"""The correlation analysis on windows recorded from a real run (tests/fixtures/correlation/windows/).

seeds_g4.json is what kvscope's vLLM collector read from the reference engine's /metrics after each of
12 requests of the seeds' G4 test (gpt-oss-120b's geometry; 4 prompts of 2,048 tokens, each recomputed
once and fetched from G4 twice), with the engine's truth per request (scripts/record_correlation_windows.py
made it). Replayed into a store and the analysis on the recorded wall clock, the aggregate attribution
must account for every TTFT second and split it as the engine's truth does, within the self-test's
tolerance for shares (kvscope selftest, ±5 points).
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from kvscope.agent.analyses.correlation import metrics as m
from kvscope.agent.analyses.correlation.analysis import CorrelationEngine
from kvscope.agent.analyses.correlation.options import CorrelationOptions
from kvscope.agent.app.wiring import build_catalogue
from kvscope.agent.core import contract
from kvscope.agent.core.readings import HistogramSample, Reading, Sample
from kvscope.agent.core.store import Store
from kvscope.agent.tools.selftest.checks import SHARE_PP
from testkit.paths import FIXTURES

RECORDING = json.loads((FIXTURES / "correlation" / "windows" / "seeds_g4.json").read_text())
COMPONENTS = ("frontend", "queue", "fetch", "offload", "prefill", "other")


def reading(r: dict[str, Any]) -> Reading:
    if "buckets" in r:
        return HistogramSample(r["name"], tuple(r["labels"]), tuple((b, n) for b, n in r["buckets"]), r["sum"],
                               r["count"])
    return Sample(r["name"], tuple(r["labels"]), r["value"])


def replay(windows: list[dict[str, Any]]) -> tuple[Store, dict[str, float]]:
    """Each window into the store as the vllm collector's collection, then one run of the analysis; the
    attributed seconds per component (summed over engines) after the last."""
    store = Store(build_catalogue())
    now = [0.0]
    analysis = CorrelationEngine(CorrelationOptions(), store, None, None, lambda: now[0])
    out: list[Reading] = []
    for window in windows:
        now[0] = window["wall"]
        store.ingest("vllm", [reading(r) for r in window["readings"]], now[0])
        out = analysis.run()
        store.ingest("correlation", out, now[0])
    parts = {c: 0.0 for c in COMPONENTS}
    for r in out:
        if r.name == m.TTFT_ATTRIBUTED and isinstance(r, Sample):
            parts[r.labels[3]] += r.value
    return store, parts


def truth_parts() -> dict[str, float]:
    out = {c: 0.0 for c in COMPONENTS}
    for t in RECORDING["truth"]:
        # recorded before the truth split frontend (arrival -> queued) out of other: split it the same way
        inside = t["prefill_s"] - sum(t["fetch_s"].values()) - t["offload_s"] - t["prefill_compute_s"]
        for c, seconds in zip(COMPONENTS, (t["ttft_s"] - t["queue_s"] - t["prefill_s"], t["queue_s"],
                                           sum(t["fetch_s"].values()), t["offload_s"], t["prefill_compute_s"],
                                           inside), strict=True):
            out[c] += seconds
    return out


def test_the_recording_is_what_it_says() -> None:
    assert len(RECORDING["windows"]) == 13 and len(RECORDING["truth"]) == 12
    fetched = [t for t in RECORDING["truth"] if t["fetch_s"]]
    assert len(fetched) == 8 and all(set(t["fetch_s"]) == {"G4"} for t in fetched)
    names = {r["name"] for r in RECORDING["windows"][-1]["readings"]}
    assert {contract.TTFT_SECONDS, contract.KV_TRANSFER_SECONDS, contract.KV_HIT_TOKENS} <= names


def test_every_ttft_second_is_attributed_once() -> None:
    store, parts = replay(RECORDING["windows"])
    (labels,) = store.values(contract.TTFT_SECONDS)
    _, _, ttft_sum, count = store.histogram(contract.TTFT_SECONDS, labels)
    assert count == 12
    assert sum(parts.values()) == pytest.approx(ttft_sum, rel=1e-9)
    assert ttft_sum == pytest.approx(sum(t["ttft_s"] for t in RECORDING["truth"]), rel=1e-3)


def test_the_split_is_the_engines_truth() -> None:
    _, parts = replay(RECORDING["windows"])
    truth = truth_parts()
    total, truth_total = sum(parts.values()), sum(truth.values())
    for c in COMPONENTS:
        share, truth_share = 100 * parts[c] / total, 100 * truth[c] / truth_total
        assert abs(share - truth_share) <= SHARE_PP, (c, share, truth_share)
    assert parts["fetch"] == pytest.approx(truth["fetch"], rel=0.01)  # the engine's own transfer timer
    assert parts["queue"] == pytest.approx(truth["queue"], rel=0.01)  # and its own queue histogram


def test_a_counter_reset_in_the_middle_changes_nothing() -> None:
    """The engine restarts after the 6th request (its counters start again from zero, and the store says
    so): what the analysis attributes over the whole run is what it attributed without the restart."""
    windows = RECORDING["windows"]
    cut = 6
    base = {(r["name"], tuple(r["labels"])): r for r in windows[cut]["readings"]}

    def minus(r: dict[str, Any]) -> dict[str, Any]:
        before = base.get((r["name"], tuple(r["labels"])))
        gauge = "value" in r and not r["name"].endswith("_total")
        if before is None or gauge:
            return r
        if "buckets" in r:
            return {**r, "buckets": [[b, n - p] for (b, n), (_, p) in zip(r["buckets"], before["buckets"],
                                                                         strict=True)],
                    "sum": r["sum"] - before["sum"], "count": r["count"] - before["count"]}
        return {**r, "value": r["value"] - before["value"]}

    restarted = [*windows[:cut + 1],
                 {"wall": windows[cut]["wall"] + 1e-3, "readings": []},  # the engine is down for one scrape
                 *({**w, "readings": [minus(r) for r in w["readings"]]} for w in windows[cut + 1:])]
    _, straight = replay(windows)
    _, with_restart = replay(restarted)
    for c in COMPONENTS:
        assert with_restart[c] == pytest.approx(straight[c], rel=1e-9, abs=1e-12), c
    assert not math.isclose(sum(straight.values()), 0.0)
