"""The figures of `kvscope analyze`, from an AIPerf output directory (and a recording, and a baseline run).

Per request (AIPerf's `profile_export.jsonl`, profiling phase, not cancelled, no error, with a TTFT):
RPS = requests / (last request end − first request start); TTFT mean and percentiles; TTFT by prompt
length (the server's `usage_prompt_tokens` where AIPerf has it, else its ISL) in power-of-two bins, split
into cold (no cached tokens) and warm requests.

From the engine's /metrics as AIPerf scraped it — `server_metrics_export.jsonl` (a time series, with
`--server-metrics-formats ... jsonl`), else `server_metrics_export.json` (AIPerf's default: the growth over
the profiling phase) — the server-side figures (server.py). From the recording, the requests of this run
only (recording.py). From the baseline directory: the same figures for a recompute run, the speed-up, and a
warning for every way the two runs are not the same workload.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from kvscope.agent.analyses.whatif.profile import loads
from kvscope.agent.tools.analyze.inputs import RecordedRequest, Scrapes, parse_recording, parse_scrapes, parse_summary
from kvscope.agent.tools.analyze.recording import in_window, recording_figures
from kvscope.agent.tools.analyze.report import Comparison, LengthBin, Report
from kvscope.agent.tools.analyze.server import server_figures
from kvscope.agent.tools.analyze.value import value_figures
from kvscope.collectors.requests.aiperf import AiperfRequest, parse_profile_export

SERVER_FILES = ("server_metrics_export.jsonl", "server_metrics_export.json")
# how far apart two runs' workloads may be before the comparison says so
MEAN_PROMPT_TOLERANCE = 0.05


def _percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), q in [0, 100]."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _prompt(r: AiperfRequest) -> int | None:
    return r.prompt_tokens if r.prompt_tokens is not None else r.input_tokens


def length_bins(requests: Iterable[AiperfRequest]) -> list[LengthBin]:
    """Power-of-two prompt-length bins: [2^k, 2^(k+1)) tokens."""
    groups: dict[int, list[AiperfRequest]] = defaultdict(list)
    for r in requests:
        n = _prompt(r)
        if n is not None and n > 0 and r.ttft is not None:
            groups[1 << (n.bit_length() - 1)].append(r)
    out = []
    for low in sorted(groups):
        rs = groups[low]
        ttfts = [r.ttft for r in rs if r.ttft is not None]
        cold = [r.ttft for r in rs if r.ttft is not None and not r.cached_tokens]
        warm = [r.ttft for r in rs if r.ttft is not None and r.cached_tokens]
        out.append(LengthBin(low, 2 * low, len(rs), statistics.fmean(ttfts), _percentile(ttfts, 50),
                             _percentile(ttfts, 90), len(cold), statistics.fmean(cold) if cold else None,
                             len(warm), statistics.fmean(warm) if warm else None))
    return out


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _aiperf_summary(report: Report, root: Path) -> None:
    summary = _read_json(root / "profile_export_aiperf.json")
    if summary is None:
        return
    for key, stat in (("request_throughput", "avg"), ("time_to_first_token", "avg"),
                      ("time_to_first_token", "p50"), ("time_to_first_token", "p90"),
                      ("benchmark_duration", "avg"), ("request_count", "avg")):
        value = (summary.get(key) or {}).get(stat)
        if isinstance(value, int | float):
            report.aiperf[f"{key}.{stat}"] = float(value)
    if "aiperf_version" in summary:
        report.notes.append(f"AIPerf {summary['aiperf_version']}")
    theirs = report.aiperf.get("request_throughput.avg")
    window = _phase_window(summary)
    if theirs and report.rps and abs(theirs / report.rps - 1) > RPS_NOTE_ABOVE and window is not None:
        report.notes.append(
            f"RPS {report.rps:.3f} is requests over the requests' own window ({report.duration_s:.3f} s, AIPerf's "
            f"benchmark_duration); AIPerf's request_throughput {theirs:.3f} divides by its profiling phase "
            f"(start_time to end_time, {window:.3f} s), which includes its own start-up and wind-down")


# AIPerf's request_throughput and ours part by a fixed few ms of AIPerf's phase overhead: said above 0.5 %
RPS_NOTE_ABOVE = 5e-3


def _phase_window(summary: dict[str, Any]) -> float | None:
    """Seconds from AIPerf's start_time to its end_time (ISO 8601, the client's clock), None if unreadable."""
    try:
        start, end = (datetime.fromisoformat(summary[key]) for key in ("start_time", "end_time"))
    except (KeyError, TypeError, ValueError):
        return None
    return (end - start).total_seconds()


def _server(report: Report, root: Path, engine: str) -> None:
    """The time series where AIPerf wrote one, else its default summary; a note when neither is there."""
    for name, parse in zip(SERVER_FILES, (parse_scrapes, parse_summary), strict=True):
        path = root / name
        if not path.exists():
            continue
        scrapes: Scrapes = parse(path.read_text(encoding="utf-8"))
        if scrapes.bad_lines or scrapes.bad_entries:
            report.notes.append(f"server metrics: {scrapes.bad_lines} unreadable lines, "
                                f"{scrapes.bad_entries} unreadable entries skipped")
        report.server_source = name
        server_figures(report, scrapes, report.start_ns, engine)
        if name.endswith(".json"):
            report.notes.append("server metrics from server_metrics_export.json (growth over the profiling phase, no "
                                "time series: run AIPerf with --server-metrics-formats json jsonl for the link chart)")
        return
    report.notes.append("no server metrics (server_metrics_export.json or .jsonl): AIPerf ran with "
                        "--no-server-metrics, or the files were removed")


def build_report(directory: str | Path, recording: str | Path | None = None, baseline: str | Path | None = None,
                 engine: str = "reference", whatif: str | Path | None = None, gpus: float = 1.0) -> Report:
    """All figures for one AIPerf output directory. Raises OSError if it has no profile_export.jsonl."""
    root = Path(directory)
    profile = parse_profile_export((root / "profile_export.jsonl").read_text(encoding="utf-8"))
    kept = [r for r in profile.requests if r.phase in ("", "profiling") and not r.cancelled and not r.failed
            and r.ttft is not None]
    if not kept:
        raise ValueError(f"{root}/profile_export.jsonl has no completed profiling-phase request")
    ttfts = [r.ttft for r in kept if r.ttft is not None]
    start = min(r.start_ns for r in kept)
    end = max(r.start_ns + int((r.latency or r.ttft or 0.0) * 1e9) for r in kept)
    duration = (end - start) / 1e9
    report = Report(
        str(root), len(kept), len(profile.requests) - len(kept), duration, len(kept) / duration if duration else 0.0,
        statistics.fmean(ttfts), _percentile(ttfts, 50), _percentile(ttfts, 90),
        sum(_prompt(r) or 0 for r in kept), sum(r.cached_tokens or 0 for r in kept), length_bins(kept),
        start, end)
    report.scatter = [(_prompt(r) or 0, r.ttft or 0.0, (r.cached_tokens or 0) / (_prompt(r) or 1)) for r in kept]
    if profile.bad_lines:
        report.notes.append(f"profile_export.jsonl: {profile.bad_lines} unreadable lines skipped")
    _aiperf_summary(report, root)
    _server(report, root, engine)
    recorded: list[RecordedRequest] = []
    if recording is not None:
        recorded_run = parse_recording(Path(recording).read_text(encoding="utf-8"))
        recording_figures(report, recorded_run)
        recorded = in_window(recorded_run, report.start_ns, report.end_ns)
    profiles = loads(Path(whatif).read_bytes()) if whatif is not None else []
    value_figures(report, recorded, profiles[0] if profiles else None, gpus)
    if baseline is not None:
        report.baseline = compare(report, build_report(baseline, engine=engine), str(baseline))
        report.notes.extend(f"baseline: {w}" for w in report.baseline.warnings)
    return report


def _mean_prompt(r: Report) -> float:
    return r.prompt_tokens / r.requests if r.requests else 0.0


def mismatches(run: Report, base: Report) -> list[str]:
    """Every way the baseline is not the same workload as the run, in words (empty: comparable)."""
    out = []
    if run.requests != base.requests:
        out.append(f"{base.requests} requests against this run's {run.requests}: RPS and duration compare "
                   "different amounts of work")
    mine, theirs = _mean_prompt(run), _mean_prompt(base)
    if mine and abs(theirs - mine) / mine > MEAN_PROMPT_TOLERANCE:
        out.append(f"mean prompt {theirs:,.0f} tokens against {mine:,.0f} (more than "
                   f"{MEAN_PROMPT_TOLERANCE:.0%} apart)")
    if base.cached_tokens:
        out.append(f"the baseline reused {base.cached_tokens:,} prompt tokens: it is not a recompute run")
    missing = sorted({(b.low, b.high) for b in run.bins} ^ {(b.low, b.high) for b in base.bins})
    if missing:
        out.append("prompt-length bins in only one of the runs: "
                   + ", ".join(f"{low:,}–{high - 1:,}" for low, high in missing))
    return out


def compare(run: Report, base: Report, baseline_dir: str) -> Comparison:
    mine = {(b.low, b.high): b.ttft_mean for b in run.bins}
    return Comparison(
        baseline_dir, base.rps, base.ttft_mean, run.rps / base.rps if base.rps else math.nan,
        base.ttft_mean / run.ttft_mean if run.ttft_mean else math.nan,
        base.duration_s / run.duration_s if run.duration_s else math.nan,
        [(b.low, b.high, b.ttft_mean / mine[(b.low, b.high)]) for b in base.bins if mine.get((b.low, b.high))],
        mismatches(run, base))
