"""The JSON Lines sink: each attributed request as one line, for offline analysis (`jq`, pandas,
`kvscope analyze --recording`).

It receives what the correlation analysis attributed (a `RequestSink`) and appends to a file. A write
that fails is counted and logged once, never raised into the analysis: the file is a side output.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any

from kvscope.agent.config.binding import ConfigError
from kvscope.agent.core.catalogue import counter
from kvscope.agent.core.pipeline import Sink, SinkInputs, SinkSpec
from kvscope.agent.core.records import ERROR_KINDS, AttributedRequest
from kvscope.agent.core.store import Store
from kvscope.agent.core.streams import ATTRIBUTED_REQUESTS, StreamUse

log = logging.getLogger("kvscope.jsonl")

LINES_WRITTEN = "kvscope_jsonl_lines_written_total"
WRITE_ERRORS = "kvscope_jsonl_write_errors_total"
METRICS = (
    counter(LINES_WRITTEN, "", (), "Attributed requests written to the JSON Lines file.", "JSONL exporter"),
    counter(WRITE_ERRORS, "", (), "Attributed requests that could not be written to the JSON Lines file.",
            "JSONL exporter"),
)


def request_line(result: AttributedRequest) -> dict[str, Any]:
    def num(v: float | None) -> float | None:
        return None if v is None or not math.isfinite(v) else round(v, 9)

    record, attribution = result.record, result.attribution
    return {
        "request_id": record.request_id, "source": record.source, "engine": record.engine,
        "model": record.model, "dp_rank": record.dp_rank, "arrival": record.arrival,
        "ttft": num(record.ttft), "prompt_tokens": record.prompt_tokens, "cached_tokens": record.cached_tokens,
        "tier_tokens": record.tier_tokens,
        "components": {name: {"seconds": num(p.seconds), "method": p.method} for name, p in attribution.parts.items()},
        "errors": {kind: num(getattr(attribution, kind)) for kind in ERROR_KINDS},
        "prefill_saved": num(result.prefill_saved), "ttft_without_cache": num(result.ttft_without_cache),
        "confidence": result.confidence,
    }


class JsonlSink:
    """Appends one line per attributed request to `path`; counts lines written and lines lost."""

    def __init__(self, path: str, store: Store | None = None, opener: Callable[[str], IO[str]] | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self._path = path
        self._store = store
        self._open = opener or (lambda p: open(p, "a", encoding="utf-8"))  # noqa: SIM115
        self._wall = wall_clock
        self.written = 0
        self.errors = 0
        self._logged = False

    def start(self) -> None:
        self._count(0, 0)  # both series exist from the start, at 0

    def stop(self) -> None:
        pass  # every write opens and closes the file: nothing is held open

    def write(self, results: Sequence[AttributedRequest]) -> None:
        if not results:
            return
        text = "".join(json.dumps(request_line(r), separators=(",", ":")) + "\n" for r in results)
        try:
            with self._open(self._path) as fh:
                fh.write(text)
        except (OSError, ValueError) as exc:
            self._count(0, len(results))
            if not self._logged:
                log.warning("cannot write per-request attribution to %s: %s (counting, not retrying the lines)",
                            self._path, exc)
                self._logged = True
            return
        self._count(len(results), 0)

    def _count(self, written: int, failed: int) -> None:
        self.written += written
        self.errors += failed
        if self._store is not None:
            now = self._wall()
            self._store.bump(LINES_WRITTEN, (), written, now)
            self._store.bump(WRITE_ERRORS, (), failed, now)


@dataclass
class JsonlOptions:
    """`[exporters.jsonl]`: each attributed request as one JSON line."""

    enabled: bool = False
    path: str = "kvscope-requests.jsonl"  # each attributed request as one JSON line, appended

    def validate(self, path: str) -> None:
        if self.enabled and not self.path:
            raise ConfigError(f"{path}.path: a file path is required when enabled")


def build(section: JsonlOptions, inputs: SinkInputs) -> list[Sink]:
    return [JsonlSink(section.path, inputs.store, wall_clock=inputs.wall_clock)] if section.enabled else []


SPEC = SinkSpec(
    name="jsonl",
    description="each attributed request as one JSON line, appended to a file",
    options=JsonlOptions,
    factory=build,
    metrics=METRICS,
    streams=StreamUse(offers={ATTRIBUTED_REQUESTS: lambda sink: sink}),
)
