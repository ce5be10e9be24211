"""Per-request attribution as JSON Lines, for offline analysis (`jq`, pandas)."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from typing import IO, Any

from kvscope.agent.correlation.attribution import Attribution
from kvscope.agent.correlation.records import RequestRecord

log = logging.getLogger("kvscope.correlation")


def request_line(record: RequestRecord, attribution: Attribution, saved: float | None,
                 without_cache: float | None) -> dict[str, Any]:
    def num(v: float | None) -> float | None:
        return None if v is None or not math.isfinite(v) else round(v, 9)

    return {
        "request_id": record.request_id, "source": record.source, "engine": record.engine,
        "model": record.model, "dp_rank": record.dp_rank, "arrival": record.arrival,
        "ttft": num(record.ttft), "prompt_tokens": record.prompt_tokens, "cached_tokens": record.cached_tokens,
        "components": {name: {"seconds": num(p.seconds), "method": p.method} for name, p in attribution.parts.items()},
        "errors": {"negative_remainder": num(attribution.negative_remainder),
                   "fetch_overflow": num(attribution.fetch_overflow),
                   "estimate_overflow": num(attribution.estimate_overflow)},
        "prefill_saved": num(saved), "ttft_without_cache": num(without_cache),
    }


class JsonlWriter:
    """Appends lines to a file; a failure is counted and logged once, never raised into the agent."""

    def __init__(self, path: str, opener: Callable[[str], IO[str]] | None = None) -> None:
        self._path = path
        self._open = opener or (lambda p: open(p, "a", encoding="utf-8"))  # noqa: SIM115
        self.errors = 0
        self._logged = False

    def write(self, lines: Sequence[dict[str, Any]]) -> None:
        if not lines:
            return
        try:
            with self._open(self._path) as fh:
                fh.write("".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines))
        except (OSError, ValueError) as exc:
            self.errors += len(lines)
            if not self._logged:
                log.warning("cannot write per-request attribution to %s: %s (counting, not retrying the lines)",
                            self._path, exc)
                self._logged = True
