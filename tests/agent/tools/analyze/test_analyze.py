"""`kvscope analyze` on a real AIPerf 0.13.0 capture (tests/fixtures/aiperf_live) and on the constructed AIPerf
fixtures (tests/fixtures/aiperf). Expected figures are derived here from the raw files with plain json, not from
the code under test; where two independent sources exist (AIPerf's per-request usage and the engine's
counters, AIPerf's aggregate and our RPS) they are checked against each other too.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from kvscope.agent.app.cli import main
from kvscope.agent.tools.analyze.build import build_report
from kvscope.agent.tools.analyze.inputs import parse_recording, parse_scrapes, scan_of
from kvscope.agent.tools.analyze.render import to_markdown
from kvscope.agent.tools.analyze.server import increase
from testkit.paths import FIXTURES

FIX = FIXTURES
LIVE = FIX / "aiperf_live"
CACHED, RECOMPUTE = LIVE / "cached", LIVE / "recompute"
RECORDING = CACHED / "kvscope_requests.jsonl"


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _profiling(run: Path) -> list[dict[str, Any]]:
    return [r for r in _lines(run / "profile_export.jsonl") if r["metadata"]["benchmark_phase"] == "profiling"]


def _value(scrape: dict[str, Any], family: str, **labels: str) -> float:
    """A scalar (counter/gauge) or a histogram's sum from one raw scrape; 0 where the family is absent."""
    total = 0.0
    for entry in scrape["metrics"].get(family, []):
        if all(entry["labels"].get(k) == v for k, v in labels.items()):
            total += entry["sum"] if "buckets" in entry else entry["value"]
    return total


def _growth(run: Path, family: str, **labels: str) -> float:
    scrapes = _lines(run / "server_metrics_export.jsonl")
    return float(_value(scrapes[-1], family, **labels) - _value(scrapes[0], family, **labels))


def _rps(run: Path) -> float:
    records = _profiling(run)
    start = min(r["metadata"]["request_start_ns"] for r in records)
    # integer ns: a float cannot hold 1.8e18 ns to better than 256 ns
    end = max(r["metadata"]["request_start_ns"] + round(r["metrics"]["request_latency"]["value"] * 1e6)
              for r in records)
    return float(len(records) / ((end - start) / 1e9))


@pytest.fixture(scope="module")
def live() -> Any:
    return build_report(CACHED, recording=RECORDING, baseline=RECOMPUTE)


def test_requests_rps_and_ttft_from_the_records(live: Any) -> None:
    records = _profiling(CACHED)
    ttfts = [r["metrics"]["time_to_first_token"]["value"] / 1e3 for r in records]
    assert live.requests == len(records) == 24 and live.skipped == 0
    assert live.ttft_mean == pytest.approx(statistics.fmean(ttfts), rel=1e-12)
    assert live.ttft_p50 == pytest.approx(statistics.median(ttfts), rel=1e-12)
    assert live.rps == pytest.approx(_rps(CACHED), rel=1e-7)
    # AIPerf's own aggregates, another source, agree
    summary = json.loads((CACHED / "profile_export_aiperf.json").read_text())
    assert live.rps == pytest.approx(summary["request_throughput"]["avg"], rel=5e-3)
    assert live.ttft_mean * 1e3 == pytest.approx(summary["time_to_first_token"]["avg"], rel=1e-7)


def test_ttft_by_prompt_length(live: Any) -> None:
    records = _profiling(CACHED)
    prompts = [r["metrics"]["usage_prompt_tokens"]["value"] for r in records]
    assert all(8192 <= n < 16384 for n in prompts)  # one power-of-two bin
    (only,) = live.bins
    cold = [r["metrics"]["time_to_first_token"]["value"] / 1e3 for r in records
            if r["metrics"]["usage_prompt_cache_read_tokens"]["value"] == 0]
    warm = [r["metrics"]["time_to_first_token"]["value"] / 1e3 for r in records
            if r["metrics"]["usage_prompt_cache_read_tokens"]["value"] > 0]
    assert (only.low, only.high, only.requests, only.cold, only.warm) == (8192, 16384, 24, len(cold), len(warm))
    assert (only.cold, only.warm) == (8, 16)  # 8 prompts used 3 times each
    assert only.cold_ttft_mean == pytest.approx(statistics.fmean(cold))
    assert only.warm_ttft_mean == pytest.approx(statistics.fmean(warm))


def test_hits_per_tier_from_the_server_agree_with_aiperf_usage(live: Any) -> None:
    g4 = _growth(CACHED, "vllm:prompt_tokens_cached_by_source", source="external_unspecified")
    usage = sum(r["metrics"]["usage_prompt_cache_read_tokens"]["value"] for r in _profiling(CACHED))
    assert live.hits["G4"] == g4 == usage == live.cached_tokens
    assert live.hits["G1"] == live.hits["G2"] == live.hits["G3"] == 0
    assert live.lookup_tokens == _growth(CACHED, "vllm:prefix_cache_queries")
    assert live.computed_tokens == _growth(CACHED, "vllm:prompt_tokens_by_source", source="local_compute")


def test_bytes_and_seconds_per_link(live: Any) -> None:
    expected = {
        "G4->G2": ("vllm:kv_offload_tiering_read_bytes", "vllm:kv_offload_tiering_read_time", {"tier": "2:fs"}),
        "G2->G4": ("vllm:kv_offload_tiering_write_bytes", "vllm:kv_offload_tiering_write_time", {"tier": "2:fs"}),
        "G2->G1": ("vllm:kv_offload_load_bytes", "vllm:kv_offload_load_time", {}),
        "G1->G2": ("vllm:kv_offload_store_bytes", "vllm:kv_offload_store_time", {}),
    }
    for link, (moved, spent, labels) in expected.items():
        assert live.links[link]["bytes"] == pytest.approx(_growth(CACHED, moved, **labels))
        assert live.links[link]["seconds"] == pytest.approx(_growth(CACHED, spent, **labels))
        assert live.links[link]["bytes"] > 0
    # every G4 block read reaches G1: the two hops carry the same payload (+ a 4 KiB file header per block)
    assert live.links["G4->G2"]["bytes"] >= live.links["G2->G1"]["bytes"]


def test_aggregate_split_from_the_engine_histograms(live: Any) -> None:
    ttft = _growth(CACHED, "vllm:time_to_first_token_seconds")
    queue = _growth(CACHED, "vllm:request_queue_time_seconds")
    prefill = _growth(CACHED, "vllm:request_prefill_time_seconds")
    fetch = (_growth(CACHED, "vllm:kv_offload_load_time")
             + _growth(CACHED, "vllm:kv_offload_tiering_read_time", tier="2:fs"))
    offload = _growth(CACHED, "vllm:kv_offload_store_time")
    split = live.server_split
    assert split.requests == 24
    assert split.ttft == pytest.approx(ttft)
    # the reference engine loads and stores synchronously: fetch and offload sit inside prefill time
    assert split.components["fetch"] == pytest.approx(fetch)
    assert split.components["offload"] == pytest.approx(offload) and offload > 0
    assert split.components["queue"] == pytest.approx(queue)
    assert split.components["prefill"] == pytest.approx(prefill - fetch - offload)
    assert split.components["frontend"] == pytest.approx(max(0.0, ttft - queue - prefill), abs=1e-9)
    assert split.components["other"] == 0.0  # no GPU samples: nothing is moved out of a phase


def test_per_request_split_from_the_recording(live: Any) -> None:
    raw = _lines(RECORDING)
    assert len(live.per_request) == len(raw) == 24
    for k in ("queue", "fetch", "offload", "prefill", "other"):
        assert live.split.components[k] == pytest.approx(sum(r["components"][k]["seconds"] for r in raw))
    assert live.split.ttft == pytest.approx(sum(r["ttft"] for r in raw))
    # the recording (spans) and the histograms describe the same requests
    assert live.split.ttft == pytest.approx(live.server_split.ttft, rel=1e-6)
    # requests that reused nothing fetched nothing
    assert all(p["fetch"] == 0 for p in live.per_request if p["cached_tokens"] == 0)


def test_speedup_against_the_recompute_baseline(live: Any) -> None:
    base = _profiling(RECOMPUTE)
    assert all(r["metrics"]["usage_prompt_cache_read_tokens"]["value"] == 0 for r in base)
    assert live.baseline.baseline_rps == pytest.approx(_rps(RECOMPUTE), rel=1e-7)
    assert live.baseline.rps_speedup == pytest.approx(_rps(CACHED) / _rps(RECOMPUTE), rel=1e-7)
    base_ttft = statistics.fmean(r["metrics"]["time_to_first_token"]["value"] / 1e3 for r in base)
    assert live.baseline.ttft_speedup == pytest.approx(base_ttft / live.ttft_mean, rel=1e-7)


def test_cli_writes_markdown_json_and_charts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    assert main(["analyze", str(CACHED), "--recording", str(RECORDING), "--baseline", str(RECOMPUTE),
                 "--out", str(out)]) == 0
    data = json.loads((out / "report.json").read_text())
    assert data["requests"] == 24 and data["hits"]["G4"] == live_hits()
    assert data["rps"] == float(f"{_rps(CACHED):.6g}")  # rounded to 6 significant digits
    assert all(v == float(f"{v:.6g}") for v in _floats(data))  # no 6.319828992000001 anywhere
    markdown = (out / "report.md").read_text()
    assert "## TTFT by prompt length" in markdown and "## Against the baseline" in markdown
    assert f"| RPS | {_rps(CACHED):.3f} |" in markdown
    pytest.importorskip("matplotlib")
    for name in ("ttft_by_prompt_length.png", "ttft_split.png", "link_bytes.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"![{name}]({name})" in markdown
    assert "written:" in capsys.readouterr().out


def _floats(value: Any) -> list[float]:
    if isinstance(value, dict):
        return [f for v in value.values() for f in _floats(v)]
    if isinstance(value, list):
        return [f for v in value for f in _floats(v)]
    return [value] if isinstance(value, float) else []


def live_hits() -> float:
    return float(sum(r["metrics"]["usage_prompt_cache_read_tokens"]["value"] for r in _profiling(CACHED)))


def test_cli_reports_a_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(tmp_path / "nothing")]) == 2
    assert "profile_export.jsonl" in capsys.readouterr().err


# -- the constructed fixtures: documented shapes and broken input ------------------------------------


def test_constructed_fixture() -> None:
    r = build_report(FIX / "aiperf")
    raw = [json.loads(line) for line in (FIX / "aiperf" / "profile_export.jsonl").read_text().splitlines()[:5]]
    kept = [x for x in raw if x["metadata"]["benchmark_phase"] == "profiling" and not x["metadata"]["was_cancelled"]
            and not x.get("error")]
    assert r.requests == len(kept) == 2 and r.skipped == 3  # warm-up, cancelled, failed
    assert r.ttft_mean == pytest.approx(statistics.fmean(x["metrics"]["time_to_first_token"]["value"] / 1e3
                                                         for x in kept))
    assert r.cached_tokens == sum(x["metrics"].get("usage_prompt_cache_read_tokens", {}).get("value", 0) for x in kept)
    assert any("1 unreadable lines" in n for n in r.notes)  # the truncated last record
    # the documented `histogram` shape: TTFT sum and count grew by the second scrape's values
    assert r.server_split is not None and r.server_split.requests == 2
    assert r.server_split.ttft == pytest.approx(0.2122)
    assert r.server_split.components == {"other": pytest.approx(0.2122)}  # no queue/prefill series
    assert any("1 unreadable lines, 1 unreadable entries" in n for n in r.notes)


def test_scan_of_real_and_documented_shapes() -> None:
    scan, bad = scan_of({
        "vllm:prompt_tokens": [{"labels": {"engine": "0"}, "value": 5}],
        "vllm:ttft": [{"labels": {}, "buckets": {"0.5": 1, "+Inf": 2}, "sum": 1.5, "count": 2}],
        "vllm:queue": [{"histogram": {"1.0": 3}, "sum": 0.3, "count": 3}],
        "vllm:broken": [{"labels": {}}, "not an object"],
        "x:summary": [{"summary": {"0.5": 1.0}, "sum": 1, "count": 1}],
    })
    s = scan.samples
    assert s["vllm:prompt_tokens_total"] == s["vllm:prompt_tokens"] == [({"engine": "0"}, 5.0)]
    assert s["vllm:ttft_bucket"] == [({"le": "0.5"}, 1.0), ({"le": "+Inf"}, 2.0)]
    assert (s["vllm:ttft_sum"], s["vllm:ttft_count"]) == ([({}, 1.5)], [({}, 2.0)])
    assert s["vllm:queue_bucket"] == [({"le": "1.0"}, 3.0)]
    assert bad == 2 and not any(k.startswith("x:summary") for k in s)


def test_parse_scrapes_and_recording_count_bad_lines() -> None:
    scrapes = parse_scrapes('{"timestamp_ns": 1, "metrics": {}}\nnot json\n{"timestamp_ns": "x", "metrics": {}}\n')
    assert len(scrapes.scrapes) == 1 and scrapes.bad_lines == 2
    recording = parse_recording(RECORDING.read_text().splitlines()[0] + "\n{}\n")
    assert len(recording.requests) == 1 and recording.bad_lines == 1


def test_increase_counts_a_restart_from_zero() -> None:
    assert increase([5.0, 7.0, 7.0, 2.0, 4.0]) == 2.0 + 2.0 + 2.0
    assert increase([3.0]) == 0.0


# -- issue 12: the run's own records, both server-metrics formats, caveats, charts with legends ----------------


def test_the_json_summary_gives_the_server_figures_when_there_is_no_jsonl(tmp_path: Path) -> None:
    """AIPerf's default server_metrics_export.json alone: hits, links and the split from its growth stats."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("profile_export.jsonl", "profile_export_aiperf.json", "server_metrics_export.json"):
        (run / name).write_bytes((CACHED / name).read_bytes())
    report = build_report(run)
    summary = json.loads((CACHED / "server_metrics_export.json").read_text())["metrics"]

    def total(family: str, **labels: str) -> float:
        return float(sum(s["stats"]["total"] if "total" in s["stats"] else s["stats"]["sum"]
                         for s in summary[family]["series"] if all(s["labels"].get(k) == v for k, v in labels.items())))

    assert report.server_source == "server_metrics_export.json"
    assert report.hits["G4"] == total("vllm:prompt_tokens_cached_by_source", source="external_unspecified") > 0
    assert report.links["G1->G2"]["seconds"] == pytest.approx(total("vllm:kv_offload_store_time"))
    assert report.server_split is not None
    assert report.server_split.ttft == pytest.approx(total("vllm:time_to_first_token_seconds"))
    assert report.server_split.components["offload"] == pytest.approx(total("vllm:kv_offload_store_time"))
    assert report.timeline == []  # no time series: no link chart
    assert any("server_metrics_export.json" in n for n in report.notes)
    # the JSONL of the same run says the same over the same requests, within what AIPerf's phase bounds cut
    jsonl = build_report(CACHED)
    assert report.hits == jsonl.hits


def test_a_recording_with_other_runs_in_it_is_cut_to_this_runs_window(tmp_path: Path) -> None:
    mixed = tmp_path / "requests.jsonl"
    mixed.write_text(RECORDING.read_text() + (RECOMPUTE / "kvscope_requests.jsonl").read_text())
    report = build_report(CACHED, recording=mixed)
    assert (report.recording_kept, report.recording_total) == (24, 48)
    assert report.split is not None and report.split.requests == 24
    assert any("kept 24 of 48" in n for n in report.notes)
    cached_ids = {r["request_id"] for r in _lines(RECORDING)}
    assert {p["request_id"] for p in report.per_request} == cached_ids


def test_counterfactuals_are_reported_with_the_cost_models_confidence(live: Any) -> None:
    raw = _lines(RECORDING)
    cf = live.counterfactuals
    saved = [r["prefill_saved"] for r in raw if r["prefill_saved"] is not None]
    assert cf is not None and cf.prefill_saved == pytest.approx(sum(saved)) and saved
    # AIPerf sent one prompt length (ISL 12000): the agent's cost model could not tell a from b
    assert {r["confidence"] for r in raw if r["prefill_saved"] is not None} == {"low"} and cf.confidence == "low"
    markdown = to_markdown(live)
    assert "## What the cache changed" in markdown and "LOW CONFIDENCE" in markdown


def test_a_baseline_of_another_workload_is_warned_about() -> None:
    report = build_report(CACHED, baseline=FIX / "aiperf")
    assert report.baseline is not None
    warnings = report.baseline.warnings
    assert any("2 requests against this run's 24" in w for w in warnings)
    assert any("mean prompt" in w for w in warnings)
    assert any(n.startswith("baseline: ") for n in report.notes)
    assert "not the same workload" in to_markdown(report)
    assert build_report(CACHED, baseline=RECOMPUTE).baseline.warnings == []  # the same dataset, recomputed


def test_every_chart_has_a_legend_and_none_is_drawn_empty() -> None:
    pytest.importorskip("matplotlib")
    from kvscope.agent.tools.analyze.charts import figures

    for report in (build_report(CACHED, recording=RECORDING, baseline=RECOMPUTE), build_report(CACHED),
                   build_report(FIX / "aiperf")):
        drawn = figures(report)
        for name, fig in drawn.items():
            for ax in fig.axes:
                if ax.get_label() == "<colorbar>":
                    continue
                assert ax.get_legend() is not None, f"{name}: a panel without a legend"
                assert ax.has_data(), f"{name}: an empty panel"
    assert "link_bytes.png" not in figures(build_report(FIX / "aiperf"))  # two scrapes: no time series to draw


def _duration(run: Path) -> float:
    return len(_profiling(run)) / _rps(run)


def test_what_each_tier_saved_per_hour_from_the_recording_and_the_engine_counters(live: Any) -> None:
    """Every reused token of this run came from G4 (the engine counted no other hit tier, and G2 -> G1 only relayed
    G4's blocks), so G4 owns every second the recording says was saved, per hour of the run."""
    assert _growth(CACHED, "vllm:prompt_tokens_cached_by_source", source="host") == 0
    saved = sum(r["prefill_saved"] for r in _lines(RECORDING) if r["prefill_saved"] is not None)
    assert live.saved_per_hour == {"G4": pytest.approx(saved * 3600 / _duration(CACHED), rel=1e-6)}
    assert "*GPU time saved per hour* =" in to_markdown(live) and "**G4 saved" in to_markdown(live)
    twice = build_report(CACHED, recording=RECORDING, gpus=2.0)
    assert twice.saved_per_hour["G4"] == pytest.approx(2 * live.saved_per_hour["G4"])


def test_the_marginal_value_of_each_tier_from_a_whatif_profile(tmp_path: Path) -> None:
    """A profile whose G1 of 2 blocks misses a block used again 2 steps later: doubling G1 keeps it."""
    from array import array

    from kvscope.agent.analyses.whatif.marginal import marginals
    from kvscope.agent.analyses.whatif.profile import Cost, Measured, RequestSample, StreamProfile, TierFetch, dumps

    profile = StreamProfile("reference", "m", "0", 1.0, 16, 36_864, "inclusive", [2, 0, None, 0],
                            trace=array("Q", [1, 2, 3, 1, 2, 3, 1, 2, 3]), batches=array("I", [3, 3, 3]), warmup=3,
                            measured=Measured(144.0, {}), cost=Cost(4e-5, 1e-9, True, {"G2": TierFetch(1e9)}),
                            requests=[RequestSample(0.1, 48, 0)] * 6)
    (tmp_path / "profile.json").write_bytes(dumps([profile]))
    report = build_report(CACHED, recording=RECORDING, whatif=tmp_path / "profile.json")
    expected = {(m.tier, m.step): m.per_request for m in marginals(profile)}
    got = {(m["tier"], m["step"]): m for m in report.marginal}
    assert set(got) == set(expected) and got[("G1", "next")]["per_request"] > 0
    for key, m in got.items():
        assert m["per_request"] == pytest.approx(expected[key])
        assert m["per_hour"] == pytest.approx(expected[key] * report.rps * 3600)
    assert "*Marginal value of a tier's size* =" in to_markdown(report)
