"""Reader of AIPerf's exports: per-request records and the server-metrics time series.

`profile_export.jsonl` (one line per request, `--export-level records`, AIPerf 0.13.0): `metadata` with
wall-clock ns timestamps (`request_start_ns`, `request_end_ns`, ...), `was_cancelled`, `benchmark_phase`;
`metrics` where every metric is `{"value": ..., "unit": ...}` — TTFT in ms, `input_sequence_length`
(client tokenizer), `usage_prompt_tokens` (the server's count) and, with a server that reports cached
tokens, `usage_prompt_cache_read_tokens` (shared/facts/clients.md §3).

`server_metrics_export.jsonl` (one Prometheus scrape per line): `endpoint_url`, `timestamp_ns`,
`endpoint_latency_ns`, `metrics: {name: [entry, ...]}` where an entry is `{"labels"?: {...}, "value": N}`
for counters and gauges, `{"buckets": {le: count}, "sum": N, "count": N}` for histograms (what AIPerf
0.13.0 really writes, tests/fixtures/aiperf_live; its docs say `"histogram"`, accepted too) and
`{"summary": {quantile: value}, "sum": N, "count": N}` for summaries (clients.md §4). Consecutive identical scrapes are
deduplicated by AIPerf, so a gap between lines does not mean a missing scrape.

`server_metrics_export.json` (AIPerf's default format, written on every run): no time series, the growth of
each series over the profiling phase — `metrics: {name: {"type", "series": [{"labels", "stats", "buckets"?}]}}`
with `stats.total` for a counter, `stats.sum`/`stats.count` and `buckets` (per-bucket counts, not cumulative
here either way: the growth of each cumulative bucket) for a histogram, and the phase's bounds in
`summary.phase_time_ranges.profiling` (tests/fixtures/aiperf_live). `parse_server_metrics_summary` turns it into
the same shape as the JSONL: two scrapes, zero at the phase's start and the growth at its end, so whatever
reads growth between scrapes reads both formats alike. Gauges have no growth and are left out.

Parsing is a pure function of the text: a bad line is counted and skipped, never raised.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from kvscope.agent.core.records import RequestRecord

_TO_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0}


@dataclass(frozen=True, slots=True)
class AiperfRequest:
    request_id: str
    start_ns: int
    ttft: float | None  # seconds
    latency: float | None  # seconds
    input_tokens: int | None  # client-side ISL
    prompt_tokens: int | None  # the server's usage count
    cached_tokens: int | None
    output_tokens: int | None
    phase: str
    cancelled: bool
    failed: bool


@dataclass(slots=True)
class ProfileExport:
    requests: list[AiperfRequest] = field(default_factory=list)
    bad_lines: int = 0


@dataclass(frozen=True, slots=True)
class ScrapeEntry:
    name: str
    labels: dict[str, str]
    value: float | None = None  # counters, gauges
    buckets: tuple[tuple[float, float], ...] = ()  # histograms: (le, cumulative count), ascending
    quantiles: tuple[tuple[float, float], ...] = ()  # summaries
    sum: float | None = None
    count: float | None = None


@dataclass(frozen=True, slots=True)
class Scrape:
    endpoint_url: str
    timestamp_ns: int
    latency_ns: int | None
    entries: tuple[ScrapeEntry, ...]
    phase: str = ""  # AIPerf's benchmark_phase (warmup, profiling), when it writes one


@dataclass(slots=True)
class ServerMetricsExport:
    scrapes: list[Scrape] = field(default_factory=list)
    bad_lines: int = 0
    bad_entries: int = 0


def _finite(value: Any) -> TypeGuard[int | float]:
    """A JSON number that fits a float (json.loads makes ints of any size: 10**400 overflows float())."""
    return (not isinstance(value, bool) and isinstance(value, int | float)
            and -1e308 < value < 1e308)  # compares in exact arithmetic: no OverflowError, NaN fails


def _seconds(metric: Any) -> float | None:
    if not isinstance(metric, dict):
        return None
    value, unit = metric.get("value"), str(metric.get("unit", "ms")).lower()
    if not _finite(value) or unit not in _TO_SECONDS:
        return None
    return float(value) * _TO_SECONDS[unit] if value >= 0 else None


def _count(metric: Any) -> int | None:
    value = metric.get("value") if isinstance(metric, dict) else None
    if not _finite(value) or value < 0:
        return None
    return int(value)


def parse_profile_line(line: str) -> AiperfRequest:
    """One `profile_export.jsonl` line; ValueError (or KeyError/TypeError) when it is not a record."""
    data = json.loads(line)
    meta, metrics = data["metadata"], data.get("metrics") or {}
    if not isinstance(meta, dict) or not isinstance(metrics, dict):
        raise ValueError("metadata and metrics must be objects")
    start = meta["request_start_ns"]
    if isinstance(start, bool) or not isinstance(start, int):
        raise ValueError("request_start_ns must be an integer")
    request_id = meta.get("x_request_id") or f"{meta.get('conversation_id', '')}:{meta.get('turn_index', 0)}:{start}"
    return AiperfRequest(
        request_id=str(request_id), start_ns=start,
        ttft=_seconds(metrics.get("time_to_first_token")), latency=_seconds(metrics.get("request_latency")),
        input_tokens=_count(metrics.get("input_sequence_length")),
        prompt_tokens=_count(metrics.get("usage_prompt_tokens")),
        cached_tokens=_count(metrics.get("usage_prompt_cache_read_tokens")),
        output_tokens=_count(metrics.get("output_sequence_length")),
        phase=str(meta.get("benchmark_phase", "")), cancelled=bool(meta.get("was_cancelled", False)),
        failed=bool(data.get("error")),
    )


def parse_profile_export(text: str) -> ProfileExport:
    out = ProfileExport()
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            out.requests.append(parse_profile_line(line))
        except (ValueError, KeyError, TypeError, RecursionError):  # json.loads: RecursionError on deep nesting
            out.bad_lines += 1
    return out


def to_record(request: AiperfRequest, engine: str, model: str, dp_rank: str = "0") -> RequestRecord | None:
    """A request record for the correlation engine: profiling-phase requests that got a first token.

    The prompt length is the server's count where AIPerf has it (cached tokens are counted by the server
    too), else the client tokenizer's ISL. TTFT is client-side: it includes the network and ~10 ms of
    client overhead (clients.md §3), which attribution leaves in `other`.
    """
    if request.failed or request.cancelled or request.ttft is None or request.phase not in ("", "profiling"):
        return None
    prompt = request.prompt_tokens if request.prompt_tokens is not None else request.input_tokens
    return RequestRecord(request_id=request.request_id, engine=engine, model=model, dp_rank=dp_rank,
                         arrival=request.start_ns / 1e9, ttft=request.ttft, prompt_tokens=prompt,
                         cached_tokens=request.cached_tokens, source="aiperf")


def _float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"not a number: {value!r}")
    try:
        return float(value)  # "+Inf" as a bucket bound parses too
    except OverflowError:  # an int past float's range
        raise ValueError("number out of range") from None


def parse_entry(name: str, raw: Any) -> ScrapeEntry:
    """One metric entry of a scrape; raises ValueError/KeyError/TypeError on a malformed one."""
    if not isinstance(raw, dict):
        raise ValueError("an entry must be an object")
    labels = {str(k): str(v) for k, v in (raw.get("labels") or {}).items()}
    total = None if raw.get("sum") is None else _float(raw["sum"])
    count = None if raw.get("count") is None else _float(raw["count"])
    # AIPerf 0.13.0 writes histograms under "buckets" (tests/fixtures/aiperf_live); "histogram" is
    # the key its docs use, accepted too.
    histogram = raw.get("buckets", raw.get("histogram"))
    if isinstance(histogram, dict):
        buckets = tuple(sorted((_float(le), _float(c)) for le, c in histogram.items()))
        return ScrapeEntry(name, labels, buckets=buckets, sum=total, count=count)
    if "summary" in raw:
        quantiles = tuple(sorted((_float(q), _float(v)) for q, v in raw["summary"].items()))
        return ScrapeEntry(name, labels, quantiles=quantiles, sum=total, count=count)
    return ScrapeEntry(name, labels, value=_float(raw["value"]))


def parse_server_metrics(text: str) -> ServerMetricsExport:
    out = ServerMetricsExport()
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            metrics = data["metrics"]
            timestamp = data["timestamp_ns"]
            if not isinstance(metrics, dict) or isinstance(timestamp, bool) or not isinstance(timestamp, int):
                raise ValueError("metrics must be an object and timestamp_ns an integer")
        except (ValueError, KeyError, TypeError, RecursionError):  # json.loads: RecursionError on deep nesting
            out.bad_lines += 1
            continue
        entries = []
        for name, raws in metrics.items():
            for raw in raws if isinstance(raws, list) else [raws]:
                try:
                    entries.append(parse_entry(str(name), raw))
                except (ValueError, KeyError, TypeError, AttributeError):
                    out.bad_entries += 1
        latency = data.get("endpoint_latency_ns")
        out.scrapes.append(Scrape(str(data.get("endpoint_url", "")), timestamp,
                                  latency if isinstance(latency, int) and not isinstance(latency, bool) else None,
                                  tuple(entries), str(data.get("benchmark_phase") or "")))
    return out


def _summary_entry(name: str, kind: str, series: Any) -> tuple[ScrapeEntry, ScrapeEntry] | None:
    """(zero, growth) entries of one series of the JSON summary; None for a gauge or another kind."""
    labels = {str(k): str(v) for k, v in (series.get("labels") or {}).items()}
    stats = series.get("stats") or {}
    if kind == "counter":
        return ScrapeEntry(name, labels, value=0.0), ScrapeEntry(name, labels, value=_float(stats["total"]))
    if kind == "histogram":
        buckets = tuple(sorted((_float(le), _float(c)) for le, c in (series.get("buckets") or {}).items()))
        return (ScrapeEntry(name, labels, buckets=tuple((le, 0.0) for le, _ in buckets), sum=0.0, count=0.0),
                ScrapeEntry(name, labels, buckets=buckets, sum=_float(stats["sum"]), count=_float(stats["count"])))
    return None


def parse_server_metrics_summary(text: str) -> ServerMetricsExport:
    """`server_metrics_export.json` as two scrapes (see the module docstring); an unreadable file is one bad line."""
    out = ServerMetricsExport()
    try:
        data = json.loads(text)
        metrics = data["metrics"]
        summary = data.get("summary") or {}
        phase = (summary.get("phase_time_ranges") or {}).get("profiling") or {}
        start, end = int(phase["start_ns"]), int(phase["end_ns"])
        if not isinstance(metrics, dict) or end <= start:
            raise ValueError("metrics must be an object and the profiling phase must have a length")
    except (ValueError, KeyError, TypeError, AttributeError):
        out.bad_lines += 1
        return out
    zeros, growth = [], []
    for name, family in metrics.items():
        try:
            kind = str(family.get("type", ""))
            for series in family["series"]:
                pair = _summary_entry(str(name), kind, series)
                if pair is not None:
                    zeros.append(pair[0])
                    growth.append(pair[1])
        except (ValueError, KeyError, TypeError, AttributeError):
            out.bad_entries += 1
    url = next(iter(summary.get("endpoints_successful") or [""]))
    out.scrapes = [Scrape(str(url), start - 1, None, tuple(zeros), "profiling"),
                   Scrape(str(url), end, None, tuple(growth), "profiling")]
    return out


def read_artifact_dir(path: str | Path) -> tuple[ProfileExport, ServerMetricsExport | None]:
    """The two JSONL exports of an AIPerf `--output-artifact-dir` (the server metrics when present)."""
    root = Path(path)
    profile = parse_profile_export((root / "profile_export.jsonl").read_text(encoding="utf-8"))
    server_file = root / "server_metrics_export.jsonl"
    server = parse_server_metrics(server_file.read_text(encoding="utf-8")) if server_file.exists() else None
    return profile, server
