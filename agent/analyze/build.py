"""The figures of `kvscope analyze`, from an AIPerf output directory (and a recording, and a baseline run).

Per request (AIPerf's `profile_export.jsonl`, profiling phase, not cancelled, no error, with a TTFT):
RPS = requests / (last request end − first request start); TTFT mean and percentiles; TTFT by prompt
length (the server's `usage_prompt_tokens` where AIPerf has it, else its ISL) in power-of-two bins, split
into cold (no cached tokens) and warm requests.

From the engine's /metrics as AIPerf scraped it (`server_metrics_export.jsonl`), normalised by the vLLM
tables: the growth over the run (reset-safe: a decrease counts as a restart from zero) of hits per tier,
lookup and computed tokens, bytes and seconds per link, and the TTFT/queue/prefill histogram sums, which
give the aggregate TTFT split exactly as the agent computes one window (agent/correlation/attribution.py).
From the recording: the per-request split (queue, fetch, prefill, other). From the baseline directory: the
same figures for a recompute run, and the speed-up.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvscope.agent import contract as c
from kvscope.agent.analyze.inputs import COMPONENTS, Recording, Scrapes, parse_recording, parse_scrapes
from kvscope.agent.correlation.attribution import WindowTotals, attribute_window
from kvscope.agent.readings import HistogramSample, Sample
from kvscope.collectors.aiperf import AiperfRequest, parse_profile_export
from kvscope.collectors.vllm_map import DEFAULT_SOURCE_TIERS, DEFAULT_TIERING_TIERS, Normaliser

FETCH_INSIDE = {"reference": "prefill"}  # as the correlation engine's default fetch_inside_by_engine


@dataclass(frozen=True, slots=True)
class LengthBin:
    low: int  # prompt tokens, inclusive
    high: int  # exclusive
    requests: int
    ttft_mean: float
    ttft_p50: float
    ttft_p90: float
    cold: int
    cold_ttft_mean: float | None
    warm: int
    warm_ttft_mean: float | None


@dataclass(frozen=True, slots=True)
class Split:
    source: str  # "recording" (per request) or "server metrics" (histogram sums)
    requests: float
    ttft: float  # seconds, summed
    components: dict[str, float]  # seconds, summed
    methods: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Comparison:
    baseline_dir: str
    baseline_rps: float
    baseline_ttft_mean: float
    rps_speedup: float  # this run's RPS / the baseline's
    ttft_speedup: float  # the baseline's mean TTFT / this run's
    duration_speedup: float
    by_length: list[tuple[int, int, float]]  # (low, high, baseline mean TTFT / this run's) for bins in both


@dataclass
class Report:
    directory: str
    requests: int
    skipped: int  # records not counted (warm-up, cancelled, failed, no TTFT)
    duration_s: float
    rps: float
    ttft_mean: float
    ttft_p50: float
    ttft_p90: float
    prompt_tokens: int
    cached_tokens: int
    bins: list[LengthBin]
    aiperf: dict[str, float] = field(default_factory=dict)  # AIPerf's own aggregates, where present
    hits: dict[str, float] = field(default_factory=dict)  # tier -> hit tokens over the run
    lookup_tokens: float | None = None
    computed_tokens: float | None = None
    links: dict[str, dict[str, float]] = field(default_factory=dict)  # "G4->G2" -> bytes, seconds, bytes/s
    server_split: Split | None = None
    split: Split | None = None
    per_request: list[dict[str, Any]] = field(default_factory=list)  # from the recording
    timeline: list[tuple[float, dict[str, float]]] = field(default_factory=list)  # s from 1st request, bytes
    scatter: list[tuple[int, float, float]] = field(default_factory=list)  # prompt tokens, TTFT s, cached share
    baseline: Comparison | None = None
    notes: list[str] = field(default_factory=list)


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


def increase(values: list[float]) -> float:
    """Growth of a cumulative series over consecutive scrapes; a decrease is a restart from zero."""
    total = 0.0
    for prev, cur in itertools.pairwise(values):
        total += cur - prev if cur >= prev else cur
    return total


def _server_figures(report: Report, scrapes: Scrapes, start_ns: int, engine: str) -> None:
    normaliser = Normaliser(engine, DEFAULT_SOURCE_TIERS | {"external_unspecified": "G4"} if engine == "reference"
                            else DEFAULT_SOURCE_TIERS, DEFAULT_TIERING_TIERS)
    # the scrapes of the run: the last one before the first request (AIPerf's baseline) and those after
    before = [s for s in scrapes.scrapes if s.timestamp_ns <= start_ns]
    run = before[-1:] + [s for s in scrapes.scrapes if s.timestamp_ns > start_ns]
    if len(run) < 2:
        report.notes.append("server metrics: fewer than two scrapes over the run; no server-side figures")
        return
    series: dict[tuple[str, tuple[str, ...]], list[float]] = defaultdict(list)
    hist: dict[tuple[str, tuple[str, ...]], list[tuple[float, float]]] = defaultdict(list)
    times: list[float] = []
    per_scrape_links: list[dict[str, float]] = []
    dropped = 0
    for i, scrape in enumerate(run):
        normal = normaliser.normalise(scrape.scan)
        dropped += normal.dropped
        times.append((scrape.timestamp_ns - start_ns) / 1e9)
        links: dict[str, float] = {}
        for reading in normal.readings:
            # a series that appears after the baseline scrape was created during the run: it grew from 0
            if isinstance(reading, HistogramSample):
                points = hist[(reading.name, reading.labels)]
                if not points and i > 0:
                    points.append((0.0, 0.0))
                points.append((reading.sum, reading.count))
            elif isinstance(reading, Sample):
                values = series[(reading.name, reading.labels)]
                if not values and i > 0:
                    values.append(0.0)
                values.append(reading.value)
                if reading.name == c.KV_TRANSFER_BYTES:
                    links[f"{reading.labels[3]}->{reading.labels[4]}"] = reading.value
        per_scrape_links.append(links)
    if dropped:
        report.notes.append(f"server metrics: {dropped} samples the contract cannot take were skipped")
    grown = {key: increase(values) for key, values in series.items()}
    for (name, labels), value in grown.items():
        if name == c.KV_HIT_TOKENS:
            report.hits[labels[3]] = report.hits.get(labels[3], 0.0) + value
        elif name == c.KV_LOOKUP_TOKENS:
            report.lookup_tokens = (report.lookup_tokens or 0.0) + value
        elif name == c.KV_COMPUTED_TOKENS:
            report.computed_tokens = (report.computed_tokens or 0.0) + value
        elif name in (c.KV_TRANSFER_BYTES, c.KV_TRANSFER_SECONDS):
            link = report.links.setdefault(f"{labels[3]}->{labels[4]}", {"bytes": 0.0, "seconds": 0.0})
            link["bytes" if name == c.KV_TRANSFER_BYTES else "seconds"] += value
    for link in report.links.values():
        link["bytes_per_second"] = link["bytes"] / link["seconds"] if link["seconds"] > 0 else 0.0
    first = per_scrape_links[0]
    report.timeline = [(t, {k: v - first.get(k, 0.0) for k, v in links.items()})
                       for t, links in zip(times, per_scrape_links, strict=True)]
    sums = {name: [0.0, 0.0] for name in (c.TTFT_SECONDS, c.QUEUE_SECONDS, c.PREFILL_SECONDS)}
    for (name, _labels), points in hist.items():
        if name in sums:
            sums[name][0] += increase([p[0] for p in points])
            sums[name][1] += increase([p[1] for p in points])
    if sums[c.TTFT_SECONDS][1] > 0:
        fetch = sum(v for (name, labels), v in grown.items() if name == c.KV_TRANSFER_SECONDS
                    and labels[4] in ("G1", "G2") and _onboard(labels[3], labels[4]))
        has_fetch = any(name == c.KV_TRANSFER_SECONDS for name, _ in grown)
        totals = WindowTotals(sums[c.TTFT_SECONDS][0], sums[c.QUEUE_SECONDS][0] if sums[c.QUEUE_SECONDS][1] else None,
                              sums[c.PREFILL_SECONDS][0] if sums[c.PREFILL_SECONDS][1] else None,
                              fetch if has_fetch else None)
        attribution = attribute_window(totals, "prefill" if FETCH_INSIDE.get(engine) == "prefill" else "queue")
        report.server_split = Split("server metrics", sums[c.TTFT_SECONDS][1], attribution.ttft,
                                    {k: p.seconds for k, p in attribution.parts.items()},
                                    {k: p.method for k, p in attribution.parts.items()})


def _onboard(src: str, dst: str) -> bool:
    order = ("G1", "G2", "G3", "G4")
    return src in order and dst in order and order.index(dst) < order.index(src)


def _recording_figures(report: Report, recording: Recording) -> None:
    if recording.bad_lines:
        report.notes.append(f"recording: {recording.bad_lines} unreadable lines skipped")
    if not recording.requests:
        return
    components = {k: sum(r.components.get(k, 0.0) for r in recording.requests) for k in COMPONENTS}
    methods = {}
    for k in COMPONENTS:
        seen = sorted({r.methods[k] for r in recording.requests if k in r.methods})
        methods[k] = "/".join(seen)
    report.split = Split("recording", len(recording.requests), sum(r.ttft for r in recording.requests),
                         components, methods)
    report.per_request = [{"request_id": r.request_id, "arrival": r.arrival, "prompt_tokens": r.prompt_tokens,
                           "cached_tokens": r.cached_tokens, "ttft": r.ttft,
                           **{k: r.components.get(k) for k in COMPONENTS}}
                          for r in sorted(recording.requests, key=lambda r: r.arrival)]


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def build_report(directory: str | Path, recording: str | Path | None = None, baseline: str | Path | None = None,
                 engine: str = "reference") -> Report:
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
        sum(_prompt(r) or 0 for r in kept), sum(r.cached_tokens or 0 for r in kept), length_bins(kept))
    report.scatter = [(_prompt(r) or 0, r.ttft or 0.0, (r.cached_tokens or 0) / (_prompt(r) or 1)) for r in kept]
    if profile.bad_lines:
        report.notes.append(f"profile_export.jsonl: {profile.bad_lines} unreadable lines skipped")
    summary = _read_json(root / "profile_export_aiperf.json")
    if summary is not None:
        for key, stat in (("request_throughput", "avg"), ("time_to_first_token", "avg"),
                          ("time_to_first_token", "p50"), ("time_to_first_token", "p90"),
                          ("benchmark_duration", "avg"), ("request_count", "avg")):
            value = (summary.get(key) or {}).get(stat)
            if isinstance(value, int | float):
                report.aiperf[f"{key}.{stat}"] = float(value)
        if "aiperf_version" in summary:
            report.notes.append(f"AIPerf {summary['aiperf_version']}")
    server = root / "server_metrics_export.jsonl"
    if server.exists():
        scrapes = parse_scrapes(server.read_text(encoding="utf-8"))
        if scrapes.bad_lines or scrapes.bad_entries:
            report.notes.append(f"server metrics: {scrapes.bad_lines} unreadable lines, "
                                f"{scrapes.bad_entries} unreadable entries skipped")
        _server_figures(report, scrapes, start, engine)
    else:
        report.notes.append("no server_metrics_export.jsonl (run AIPerf with --server-metrics-formats ... jsonl)")
    if recording is not None:
        _recording_figures(report, parse_recording(Path(recording).read_text(encoding="utf-8")))
    if baseline is not None:
        base = build_report(baseline, engine=engine)
        mine = {(b.low, b.high): b.ttft_mean for b in report.bins}
        report.baseline = Comparison(
            str(baseline), base.rps, base.ttft_mean, report.rps / base.rps if base.rps else math.nan,
            base.ttft_mean / report.ttft_mean if report.ttft_mean else math.nan,
            base.duration_s / report.duration_s if report.duration_s else math.nan,
            [(b.low, b.high, b.ttft_mean / mine[(b.low, b.high)]) for b in base.bins
             if mine.get((b.low, b.high))])
    return report
