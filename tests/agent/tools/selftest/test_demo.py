"""`kvscope demo`: a small run of both experiments writes a report and a chart whose figures are the engine's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvscope.agent.tools.selftest.demo import run_demo
from kvscope.agent.tools.selftest.plans import DemoPlan


@pytest.mark.integration
def test_small_demo_tells_both_headlines_from_the_engines_own_figures(tmp_path: Path) -> None:
    lines: list[str] = []
    plan = DemoPlan(lengths=(512, 1024, 2048), requests=8, prompts=2, concurrency=2, prompt_tokens=1024)
    result = run_demo(plan, tmp_path / "out", lines.append)
    assert result.passed, result.figures["selftest"]
    assert result.report.exists() and result.chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result.chart.stat().st_size > 20_000  # a drawn figure, not an empty canvas
    # every engine's and agent's /metrics was announced while running: 4 engines (sweep x 2, shared x 2)
    assert sum("/metrics: http://127.0.0.1:" in line for line in lines) == 8

    sweep_recompute, sweep_cache, shared_cache, shared_recompute = result.captures
    assert sweep_cache.config.geometry.bytes_per_token == 36_864 and not sweep_cache.config.g1_retain
    # headline 1, recomputed here from the engines' own records: the longest prompt, recompute over warm TTFT
    recompute = max(sweep_recompute.truths, key=lambda t: t.prompt_tokens)
    warm = max((t for t in sweep_cache.truths if t.tokens_by_tier), key=lambda t: t.prompt_tokens)
    assert recompute.prompt_tokens == warm.prompt_tokens == 2048
    speedup = recompute.ttft_s / warm.ttft_s
    headline = next(line for line in lines if line.startswith("headline 1:"))
    assert f"{speedup:.1f}× sooner" in headline and f"({recompute.ttft_s:.2f} s → {warm.ttft_s:.2f} s)" in headline
    assert speedup > 1  # the fetch from G4 beat recomputing
    # headline 2: requests over wall time, cache against recompute (the driver's clock: the engine's last finish
    # is before it, the first arrival after its start)
    figures = json.loads((tmp_path / "out" / "figures.json").read_text())
    t = figures["throughput"]
    assert t["requests"] == 8 and len(shared_cache.truths) == len(shared_recompute.truths) == 8
    span = max(x.finished_ts for x in shared_cache.truths) - min(x.arrival_ts for x in shared_cache.truths)
    assert span <= t["cache_seconds"] < span + 0.5
    rps = re.search(r"(\d+\.\d+) → (\d+\.\d+) requests/s", next(x for x in lines if x.startswith("headline 2:")))
    assert rps is not None and float(rps[2]) == pytest.approx(8 / t["cache_seconds"], abs=0.005)
    assert float(rps[1]) == pytest.approx(8 / t["recompute_seconds"], abs=0.005)
    # the report defines each headline in a sentence and says what the numbers do not show
    report = result.report.read_text()
    assert "*Speed-up* =" in report and "*Throughput* =" in report and "## What these numbers do not show" in report
    # the split per length is the agent's, next to the truth's, and sums to the TTFT
    point = figures["sweep"]["points"][-1]
    assert sum(point["split"]["warm"].values()) == pytest.approx(point["warm_s"], rel=1e-6)
    assert point["split"]["warm_truth"]["fetch"] == pytest.approx(warm.fetch_total_s)
    # headline 3: G4's saved GPU time per hour, the agent's next to the engine's own split, and the marginal value
    # of doubling it from the what-if (2 prompts, G4 holding both: doubling adds nothing the model can see)
    value = figures["g4_value"]
    truth_saved = sum(x.recompute_s - x.prefill_compute_s - x.fetch_total_s for x in shared_cache.truths
                      if x.tokens_by_tier) * 3600 / t["cache_seconds"]
    assert value["saved_per_hour_truth"] == pytest.approx(truth_saved, rel=1e-6)  # every reused token was G4's
    assert value["saved_per_hour"] == pytest.approx(truth_saved, rel=0.10)
    assert value["doubling"] is not None and value["doubling"]["tier"] == "G4"
    assert value["g4_bytes"] == shared_cache.config.g4_blocks * 256 * 36_864  # the size the engine has
    assert "*GPU time saved per hour* =" in report and "*Marginal value of doubling G4* =" in report
    assert next(x for x in lines if x.startswith("headline 3:")).startswith("headline 3: G4 saved")
