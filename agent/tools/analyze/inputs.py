"""What `kvscope analyze` reads, as pure functions of text: AIPerf's exports and kvscope's per-request JSONL.

- `profile_export.jsonl`: parsed by collectors/requests/aiperf.py (one record per request).
- `profile_export_aiperf.json`: AIPerf's own aggregates (`request_throughput.avg`, `time_to_first_token`...),
  optional, shown beside our figures.
- `server_metrics_export.jsonl`: one scrape of the engine's /metrics per line; `server_metrics_export.json`
  (AIPerf's default) the growth over the profiling phase, read as two scrapes (its ends). In AIPerf 0.13.0's real output
  (tests/fixtures/aiperf_live) metric keys are *family* names — a counter is `vllm:prompt_tokens`, not
  `vllm:prompt_tokens_total` — with no type, and a histogram entry is `{"labels", "buckets": {le: cumulative},
  "sum", "count"}` (`"+Inf"` included). `scan_of` turns one scrape back into the exposed sample names the
  vLLM normaliser (collectors/engines/vllm_map.py) reads, so the same tables map it to the kvscope contract: a scalar
  family is offered both as `name` and `name_total` (only one of them can match a rule: counter rules end in
  `_total`, gauge rules do not); `"histogram"` is accepted as a synonym of `"buckets"` (AIPerf's docs).
- the JSON Lines exporter's output (exporters/jsonl.py): one attributed request per
  line.
Bad lines and entries are counted, never raised.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from kvscope.agent.core.records import COMPONENTS
from kvscope.collectors.requests.aiperf import (
    ScrapeEntry,
    ServerMetricsExport,
    parse_entry,
    parse_server_metrics,
    parse_server_metrics_summary,
)
from kvscope.collectors.scrape.exposition import ScanResult

__all__ = ["COMPONENTS", "RecordedRequest", "Recording", "Scrape", "Scrapes", "parse_recording", "parse_scrapes",
           "parse_summary", "scan_of"]




@dataclass(slots=True)
class Scrape:
    timestamp_ns: int
    phase: str
    scan: ScanResult


@dataclass(slots=True)
class Scrapes:
    scrapes: list[Scrape] = field(default_factory=list)
    bad_lines: int = 0
    bad_entries: int = 0


def _le(bound: float) -> str:
    """Bucket bound as the exposition format writes it ('+Inf', '0.25')."""
    return "+Inf" if bound == math.inf else repr(bound)


def _add_entry(out: ScanResult, entry: ScrapeEntry) -> None:
    """One parsed entry as the exposed samples the vLLM normaliser reads."""

    def add(name: str, labels: dict[str, str], value: float) -> None:
        out.samples.setdefault(name, []).append((labels, value))

    if entry.buckets:
        for bound, count in entry.buckets:
            add(f"{entry.name}_bucket", {**entry.labels, "le": _le(bound)}, count)
        if entry.sum is None or entry.count is None:
            raise ValueError("a histogram needs sum and count")
        add(f"{entry.name}_sum", entry.labels, entry.sum)
        add(f"{entry.name}_count", entry.labels, entry.count)
    elif entry.value is not None:
        add(entry.name, entry.labels, entry.value)
        if not entry.name.endswith("_total"):
            add(f"{entry.name}_total", entry.labels, entry.value)
    # summaries: no rule reads them


def scan_of(metrics: dict[str, Any]) -> tuple[ScanResult, int]:
    """One scrape's `metrics` object as exposed samples; the number of entries that could not be read."""
    out = ScanResult()
    bad = 0
    for family, entries in metrics.items():
        for raw in entries if isinstance(entries, list) else [entries]:
            try:
                _add_entry(out, parse_entry(str(family), raw))
            except (ValueError, KeyError, TypeError, AttributeError):
                bad += 1
    return out, bad


def parse_scrapes(text: str) -> Scrapes:
    """The whole JSONL file, read by collectors/requests/aiperf.py's parser, each scrape turned into exposed samples."""
    return _scans(parse_server_metrics(text))


def parse_summary(text: str) -> Scrapes:
    """AIPerf's `server_metrics_export.json` (growth over the profiling phase) as two scrapes, its ends."""
    return _scans(parse_server_metrics_summary(text))


def _scans(export: ServerMetricsExport) -> Scrapes:
    out = Scrapes(bad_lines=export.bad_lines, bad_entries=export.bad_entries)
    for scrape in export.scrapes:
        scan = ScanResult()
        for entry in scrape.entries:
            try:
                _add_entry(scan, entry)
            except ValueError:
                out.bad_entries += 1
        out.scrapes.append(Scrape(scrape.timestamp_ns, scrape.phase, scan))
    return out


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One line of kvscope's per-request attribution JSONL."""

    request_id: str
    arrival: float
    ttft: float
    prompt_tokens: int | None
    cached_tokens: int | None
    components: dict[str, float]
    methods: dict[str, str]
    ttft_without_cache: float | None
    prefill_saved: float | None = None
    confidence: str = ""  # the cost model's, for the two counterfactuals ("" in recordings from before it)


@dataclass(slots=True)
class Recording:
    requests: list[RecordedRequest] = field(default_factory=list)
    bad_lines: int = 0


def _optional_int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _optional_float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def parse_recording(text: str) -> Recording:
    out = Recording()
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            parts = data["components"]
            components = {k: float(v["seconds"]) for k, v in parts.items() if v.get("seconds") is not None}
            methods = {k: str(v.get("method", "")) for k, v in parts.items()}
            without, saved = data.get("ttft_without_cache"), data.get("prefill_saved")
            out.requests.append(RecordedRequest(
                str(data["request_id"]), float(data["arrival"]), float(data["ttft"]),
                _optional_int(data.get("prompt_tokens")), _optional_int(data.get("cached_tokens")),
                components, methods, _optional_float(without), _optional_float(saved),
                str(data.get("confidence") or "")))
        except (ValueError, KeyError, TypeError, AttributeError):
            out.bad_lines += 1
    return out
