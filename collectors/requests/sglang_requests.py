"""SGLang's per-request metrics file (`--export-metrics-to-file`), followed like `tail -F`: request records with
each request's hits split by tier (G1 device, G2 host, the storage backend's tier), for the correlation engine.

The line format and what each field becomes: collectors/requests/sglang_request_log.py. The directory's
hourly files, rotation and truncation: collectors/requests/log_tail.py. A bad line is counted by reason
(`kvscope_sglang_request_lines_total{result}`) and skipped; the collector keeps reading.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvscope.agent.core.catalogue import counter
from kvscope.agent.core.pipeline import CollectorContext, CollectorSpec
from kvscope.agent.core.readings import Reading, Sample
from kvscope.agent.core.records import RecordBuffer
from kvscope.agent.core.streams import REQUEST_RECORDS, StreamUse
from kvscope.agent.core.tiers import parse_tier
from kvscope.collectors.engines.sglang_backends import UNATTRIBUTED, backend_tiers, untiered_reason
from kvscope.collectors.requests.log_tail import DirectoryTail, StartAt
from kvscope.collectors.requests.sglang_request_log import FILE_PATTERN, BadLine, LineLabels, parse_line
from kvscope.collectors.sharedfs.placement import place_pool

NAME = "sglang_requests"
LINES = "kvscope_sglang_request_lines_total"
REOPENS = "kvscope_sglang_request_log_reopens_total"
READ_BYTES = "kvscope_sglang_request_log_read_bytes_total"
RESULTS = ("accepted", "malformed", "invalid", "no_timing", "too_long")
log = logging.getLogger(__name__)

METRICS = (
    counter(LINES, "", ("result",),
            "Lines of SGLang's per-request metrics file by result: accepted (a request record), malformed (not a "
            "JSON object), invalid (a field of the wrong kind or out of range), no_timing (no request_received_ts "
            "/ prefill_finished_time: SGLang runs without --enable-metrics, or the request ended before its "
            "prefill), too_long (over max_line_bytes).",
            "sglang_requests collector"),
    counter(REOPENS, "", ("reason",),
            "Times the followed file changed: rotated (the next hour's file), truncated (shrank below the position "
            "read: read again from its start), replaced (a new file under the same name).",
            "sglang_requests collector"),
    counter(READ_BYTES, "bytes", (), "Bytes read from SGLang's per-request metrics files.",
            "sglang_requests collector"),
)


@dataclass
class SglangRequestsOptions:
    directory: str = ""  # SGLang's --export-metrics-to-file-dir, as mounted in the agent's container
    start_at: StartAt = "end"  # "end": requests finished after the agent started; "start": the newest file whole
    engine: str = "sglang"
    model: str = ""  # the `model` label of the records (the file does not name the served model)
    dp_rank: str = "0"  # where a line carries no dp_rank
    storage_backend_tiers: dict[str, str] = field(default_factory=dict)  # as for the sglang collector
    file_storage_dir: str = ""  # the file backend's directory, placed by its mount (as for the sglang collector)
    mountinfo: str = "self/mountinfo"
    max_read_bytes: int = 8 * 1024 * 1024  # per collection; the rest waits for the next
    max_line_bytes: int = 4 * 1024 * 1024  # a longer line (a huge prompt in request_parameters) is skipped

    def validate(self, path: str) -> None:
        if not self.directory or not os.path.isabs(self.directory):
            raise ValueError(f"{path}.directory: SGLang's --export-metrics-to-file-dir as an absolute path, "
                             f"got {self.directory!r}")
        if self.start_at not in ("end", "start"):
            raise ValueError(f"{path}.start_at: 'end' or 'start', got {self.start_at!r}")
        for backend, tier in self.storage_backend_tiers.items():
            try:
                parse_tier(tier)
            except ValueError as exc:
                raise ValueError(f"{path}.storage_backend_tiers.{backend}: {exc}") from None
        if self.max_line_bytes < 1024 or self.max_read_bytes < self.max_line_bytes:
            raise ValueError(f"{path}: max_line_bytes >= 1024 and max_read_bytes >= max_line_bytes")


class SglangRequestsCollector:
    def __init__(self, options: SglangRequestsOptions, records: RecordBuffer, proc_root: str = "/proc") -> None:
        self._records = records
        self._labels = LineLabels(options.engine, options.model, options.dp_rank)
        placement = place_pool(options.file_storage_dir, proc_root, options.mountinfo)
        self._tiers = backend_tiers(options.storage_backend_tiers, placement.tier.value if placement else "G3")
        self._tail = DirectoryTail(options.directory, FILE_PATTERN, options.start_at, options.max_read_bytes,
                                   options.max_line_bytes)
        self._lines = dict.fromkeys(RESULTS, 0)
        self._reopens = dict.fromkeys(("rotated", "truncated", "replaced"), 0)
        self._bytes = 0
        self._warned_backends: set[str] = set()
        self._warned_reasons: set[str] = set()

    def _storage_tier(self, backend: str) -> str:
        tier = self._tiers(backend)
        if tier == UNATTRIBUTED and backend not in self._warned_backends and len(self._warned_backends) < 16:
            self._warned_backends.add(backend)
            log.warning("%s: storage backend %r is %s: its per-request hits are tier 'unattributed'; map it with "
                        "storage_backend_tiers", NAME, backend, untiered_reason(backend))
        return tier

    def collect(self) -> Iterable[Reading]:
        read = self._tail.read()
        self._bytes += read.bytes_read
        self._lines["too_long"] += read.too_long
        for reason, times in read.reopened.items():
            self._reopens[reason] += times
            if reason != "rotated":
                log.warning("%s: %s was %s: reading it again from its start", NAME, self._tail.current, reason)
        records = []
        for line in read.lines:
            if not line.strip():
                continue
            try:
                records.append(parse_line(line, self._labels, self._storage_tier))
            except BadLine as exc:
                self._lines[exc.reason] += 1
                if exc.reason not in self._warned_reasons:
                    self._warned_reasons.add(exc.reason)
                    log.warning("%s: skipping a %s line of %s: %s (counted in %s; logged once)", NAME, exc.reason,
                                self._tail.current, exc, LINES)
        self._lines["accepted"] += len(records)
        self._records.put(records)
        return [*(Sample(LINES, (result,), float(n)) for result, n in self._lines.items()),
                *(Sample(REOPENS, (reason,), float(n)) for reason, n in self._reopens.items()),
                Sample(READ_BYTES, (), float(self._bytes))]


def build(options: SglangRequestsOptions, context: CollectorContext) -> SglangRequestsCollector:
    return SglangRequestsCollector(options, context.streams.require(REQUEST_RECORDS), context.proc_root)


SPEC = CollectorSpec(
    name=NAME,
    description="SGLang's per-request metrics file (--export-metrics-to-file-dir), tailed: request records with "
                "hits per tier (cached_tokens_details) and TTFT, queue and prefill time",
    options=SglangRequestsOptions,
    factory=build,
    metrics=METRICS,
    enabled_by_default=False,
    roots=("proc",),
    streams=StreamUse(writes=(REQUEST_RECORDS,)),
)
