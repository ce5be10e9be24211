"""AIPerf, a real benchmark client, drives the live vLLM (concurrent streams, prompts reused): kvscope's
figures still equal the engine's own counters, and `kvscope analyze` on AIPerf's output agrees with
AIPerf's own TTFT figures, with the engine's counters as AIPerf scraped them, and with the spans.

The workload: REQUESTS completions drawn from PROMPTS synthetic prompts of ISL tokens (AIPerf shuffles
without replacement, so each prompt is sent REQUESTS / PROMPTS times and every repeat hits vLLM's prefix
cache), CONCURRENCY streams, OSL tokens each (ignore_eos), token counts from the server's usage.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from testkit.live_vllm import Page, compare_counters, settled, tokenizer_home, total

REQUESTS, PROMPTS, CONCURRENCY, ISL, OSL = 24, 6, 2, 400, 4
TOKENIZER_REPO = "local/tiny-llama"
JSONL_HALF_NS = 0.5e-9  # the largest rounding of one seconds figure in kvscope's JSONL


@dataclass(frozen=True)
class Run:
    live: Any
    engine: Page  # vLLM's /metrics once kvscope has caught up
    agent: Page
    records: list[dict[str, Any]]  # AIPerf's profile_export.jsonl
    summary: dict[str, Any]  # AIPerf's profile_export_aiperf.json
    scrapes: list[dict[str, Any]]  # AIPerf's server_metrics_export.jsonl
    report: dict[str, Any]  # `kvscope analyze`'s report.json
    recording: list[dict[str, Any]]  # kvscope's per-request JSONL


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _aiperf_command(exe: Path, live: Any, out: Path) -> list[str]:
    return [str(exe), "profile", "--model", live.model, "--url", live.engine_url, "--endpoint-type", "completions",
            "--streaming", "--tokenizer", TOKENIZER_REPO, "--isl", str(ISL), "--isl-stddev", "0",
            "--osl", str(OSL), "--extra-inputs", "ignore_eos:true", "--concurrency", str(CONCURRENCY),
            "--request-count", str(REQUESTS), "--num-dataset-entries", str(PROMPTS), "--use-server-token-count",
            "--random-seed", "1", "--server-metrics-formats", "json", "jsonl", "--ui", "none",
            "--output-artifact-dir", str(out)]


@pytest.fixture(scope="module")
def run(aiperf: Path, model: Path, launcher: Any) -> Iterator[Run]:
    with launcher("aiperf") as live:
        out = live.folder / "aiperf"
        env = {k: v for k, v in os.environ.items() if k not in ("TRANSFORMERS_OFFLINE", "HF_HUB_OFFLINE")}
        env.update(HF_HOME=str(tokenizer_home(model, live.folder / "hf", TOKENIZER_REPO)), HF_HUB_OFFLINE="1")
        done = subprocess.run(_aiperf_command(aiperf, live, out), env=env, cwd=live.folder, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, f"aiperf exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        served = len(_lines(out / "profile_export.jsonl"))
        engine, agent = settled(live, "kvscope_ttft_seconds_count", "vllm:time_to_first_token_seconds_count")
        # every span attributed and written as a line (vLLM exports its spans in batches, every few seconds)
        recording_file = live.folder / "kvscope-requests.jsonl"
        deadline = time.monotonic() + 30
        while not (recording_file.exists() and len(_lines(recording_file)) >= served):
            assert time.monotonic() < deadline, "not every request's span reached kvscope's JSONL exporter"
            time.sleep(0.5)
        analysis = live.folder / "analysis"
        kvscope = Path(sys.executable).parent / "kvscope"
        done = subprocess.run([str(kvscope), "analyze", str(out), "--recording", str(recording_file),
                               "--engine", "vllm", "--out", str(analysis)], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"kvscope analyze exited {done.returncode}:\n{done.stderr[-3000:]}"
        yield Run(live, engine, agent, _lines(out / "profile_export.jsonl"),
                  json.loads((out / "profile_export_aiperf.json").read_text()),
                  _lines(out / "server_metrics_export.jsonl"), json.loads((analysis / "report.json").read_text()),
                  _lines(recording_file))


def _profiling(run: Run) -> list[dict[str, Any]]:
    return [r for r in run.records if r["metadata"]["benchmark_phase"] == "profiling"]


def _growth(run: Run, family: str, **labels: str) -> float:
    """A family's growth over AIPerf's scrapes (its baseline scrape comes before the first request)."""
    def value(scrape_: dict[str, Any]) -> float:
        return float(sum(e["sum"] if "buckets" in e else e["value"] for e in scrape_["metrics"].get(family, [])
                         if all(e["labels"].get(k) == v for k, v in labels.items())))
    return value(run.scrapes[-1]) - value(run.scrapes[0])


def test_every_request_reached_the_engine_and_kvscope_equals_its_counters(run: Run) -> None:
    profiling = _profiling(run)
    assert len(profiling) == REQUESTS and not any(r.get("error") for r in profiling)
    assert total(run.engine, "vllm:time_to_first_token_seconds_count") == len(run.records)
    compare_counters(run.live, run.engine, run.agent)
    # AIPerf's usage counts are the server's own: their sum is vLLM's prompt-token counter
    usage = sum(r["metrics"]["usage_prompt_tokens"]["value"] for r in run.records)
    assert usage == total(run.engine, "vllm:prompt_tokens_total") == total(run.agent, "kvscope_prompt_tokens_total")
    # repeats of a prompt hit the prefix cache: REQUESTS − PROMPTS requests at least one block each
    assert total(run.engine, "vllm:prefix_cache_hits_total") >= (REQUESTS - PROMPTS) * run.live.block_tokens


def test_analyze_agrees_with_aiperfs_own_ttft(run: Run) -> None:
    report, ttft = run.report, run.summary["time_to_first_token"]
    client = [r["metrics"]["time_to_first_token"]["value"] / 1e3 for r in _profiling(run)]
    assert report["requests"] == ttft["count"] == REQUESTS and report["skipped"] == 0
    # report.json carries 6 significant digits: agreement to that rounding
    for ours, theirs in (("ttft_mean", "avg"), ("ttft_p50", "p50"), ("ttft_p90", "p90")):
        assert report[ours] * 1e3 == pytest.approx(ttft[theirs], rel=5e-6), (ours, report[ours], ttft[theirs])
    assert report["ttft_mean"] == pytest.approx(statistics.fmean(client), rel=5e-6)
    # RPS over the requests' own window, which is AIPerf's benchmark_duration; AIPerf's request_throughput
    # divides by its phase window (start_time to end_time), which the report names when they differ
    duration = run.summary["benchmark_duration"]["avg"]
    assert report["duration_s"] == pytest.approx(duration, rel=5e-6)
    assert report["rps"] == pytest.approx(REQUESTS / duration, rel=5e-6)
    start, end = (datetime.fromisoformat(run.summary[k]) for k in ("start_time", "end_time"))
    assert run.summary["request_throughput"]["avg"] == pytest.approx(REQUESTS / (end - start).total_seconds(),
                                                                     rel=1e-5)


def test_analyze_reads_the_engines_counters_from_aiperfs_scrapes(run: Run) -> None:
    report = run.report
    assert report["server_source"] == "server_metrics_export.jsonl"
    # the engine served nothing but AIPerf's requests: the growth over the run is its whole count
    for family, counter in (("vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total"),
                            ("vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total")):
        assert _growth(run, family) == total(run.engine, counter), family
    assert report["hits"]["G1"] == total(run.engine, "vllm:prefix_cache_hits_total") > 0
    assert report["lookup_tokens"] == total(run.engine, "vllm:prefix_cache_queries_total")
    split = report["server_split"]
    assert split["requests"] == REQUESTS
    assert split["ttft"] == pytest.approx(total(run.engine, "vllm:time_to_first_token_seconds_sum"), rel=5e-6)


def test_the_recorded_spans_are_aiperfs_requests(run: Run) -> None:
    report = run.report
    assert report["recording_kept"] == report["recording_total"] == REQUESTS
    # each request's components add up to its TTFT (less what measured parts overshot it by, counted as
    # the line's negative_remainder), and the spans' TTFTs to vLLM's histogram sum. The JSONL writes
    # seconds to the nanosecond (exporters/jsonl.py): a sum of n written figures is exact to n × 0.5 ns.
    for line in run.recording:
        parts = [c["seconds"] for c in line["components"].values()]
        overshoot = line["errors"]["negative_remainder"]
        assert sum(parts) - overshoot == pytest.approx(line["ttft"], abs=(len(parts) + 2) * JSONL_HALF_NS), line
    assert sum(line["ttft"] for line in run.recording) == pytest.approx(
        total(run.engine, "vllm:time_to_first_token_seconds_sum"), abs=len(run.recording) * JSONL_HALF_NS)
    # the client's TTFT holds the server's and the way there and back: sorted, each client TTFT is longer
    client = sorted(r["metrics"]["time_to_first_token"]["value"] / 1e3 for r in _profiling(run))
    server = sorted(line["ttft"] for line in run.recording)
    assert all(c > s for c, s in zip(client, server, strict=True)), (client, server)
