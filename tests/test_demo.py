"""`kvscope demo`: a tiny run writes a report and a chart whose figures are the engine's truth."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvscope.agent.selftest.demo import percentile, run_demo
from kvscope.agent.selftest.plans import SharedPromptsPlan


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 21)]
    assert percentile(values, 50) == 10.0 and percentile(values, 95) == 19.0 and percentile(values, 100) == 20.0
    assert percentile([3.0], 95) == 3.0


@pytest.mark.integration
def test_tiny_demo_report_matches_the_truth(tmp_path: Path) -> None:
    lines: list[str] = []
    plan = SharedPromptsPlan(requests=12, prompts=3, concurrency=3)
    result = run_demo(plan, tmp_path / "out", lines.append)
    assert result.passed
    assert result.report.exists() and result.chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result.chart.stat().st_size > 20_000  # a drawn figure, not an empty canvas
    # both /metrics endpoints were announced while running
    assert sum("/metrics: http://127.0.0.1:" in line for line in lines) == 4

    cache, recompute = result.captures
    # truth, recomputed here from the engine's own records, not from the demo's code
    lookup = sum(t.prompt_tokens for t in cache.truths)
    hit = {tier: sum(t.tokens_by_tier.get(tier, 0) for t in cache.truths) for tier in ("G1", "G2", "G3", "G4")}
    assert sum(hit.values()) > 0
    report = result.report.read_text()
    for tier, tokens in hit.items():
        row = re.search(rf"^\| {tier} \| ([\d.]+) % \| ([\d.]+) % \| ([\d,]+) \|$", report, re.M)
        assert row is not None, f"no hit-rate row for {tier}"
        assert row[1] == row[2] == f"{100 * tokens / lookup:.1f}"
        assert int(row[3].replace(",", "")) == tokens
    for link, moved in cache.link_bytes.items():
        assert f"| {link} | {moved / 1e6:,.1f} MB | {moved / 1e6:,.1f} MB |" in report

    figures = json.loads((tmp_path / "out" / "figures.json").read_text())
    warm = sorted(1000 * t.ttft_s for t in cache.truths if t.tokens_by_tier)
    assert figures["ttft_ms"]["warm"]["agent"]["n"] == len(warm)
    assert figures["ttft_ms"]["warm"]["agent"]["p50"] == pytest.approx(percentile(warm, 50), rel=1e-9)
    mean_cache = sum(t.ttft_s for t in cache.truths) / len(cache.truths)
    mean_recompute = sum(t.ttft_s for t in recompute.truths) / len(recompute.truths)
    assert figures["speedup"]["mean_ttft_agent"] == pytest.approx(mean_recompute / mean_cache, rel=1e-9)
    assert figures["speedup"]["mean_ttft_agent"] > 1  # the cache helped
