"""One line of SGLang's per-request metrics file as a request record, tokens split by the tier that served them.

SGLang started with `--export-metrics-to-file --export-metrics-to-file-dir DIR` writes one JSON object per
finished request to `DIR/sglang-request-metrics-<YYYYMMDD_HH>.log`
(`python/sglang/srt/observability/request_metrics_exporter.py`, `FileRequestMetricsExporter`): the request's
parameters as a JSON string (`request_parameters`) and, at the top level, the response's `meta_info`:

- `id` (the rid), `prompt_tokens`, `cached_tokens`, and `cached_tokens_details` = `{"device", "host"}` plus
  `"storage"` and `"storage_backend"` (the backend's class name) where HiCache has a storage tier
  (`get_cached_tokens_details` in the scheduler's output streamer); absent when nothing was cached;
- with `--enable-metrics` only, the scheduler's and API server's timestamps (`req_time_stats.py`,
  `convert_to_output_meta_info`): `request_received_ts`, `forward_entry_time`, `prefill_finished_time`
  (wall-clock seconds) and `queue_time` (seconds: waiting queue → first scheduled);
- `dp_rank` where the scheduler reports one.

The record's TTFT is `prefill_finished_time − request_received_ts`: request received → the prefill that
sampled the first token finished. SGLang writes no first-output time to the file, so the first token's way
back through the detokenizer is not in it. Its phases: queue = `queue_time`; prefill = `prefill_finished_time −
forward_entry_time` (first scheduled → first token, as vLLM's prefill time). Hits: `device` tokens are G1's,
`host` tokens were fetched from G2, `storage` tokens from the storage backend's tier (the table in
collectors/engines/sglang_backends.py, over `storage_backend_tiers`).

Parsing is a pure function of the line: a line that is not such an object raises BadLine with a reason.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvscope.agent.core.records import RequestRecord, TierFetch
from kvscope.collectors.engines.sglang_backends import PLACEHOLDERS, UNATTRIBUTED, backend_key

FILE_PATTERN = "sglang-request-metrics-*.log"
SOURCE = "sglang"


class BadLine(ValueError):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason  # malformed (not a JSON object), invalid (a field of the wrong kind), no_timing


@dataclass(frozen=True, slots=True)
class LineLabels:
    engine: str = "sglang"
    model: str = ""
    dp_rank: str = "0"


def _count(meta: dict[str, Any], key: str, required: bool = False) -> int | None:
    value = meta.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadLine("invalid", f"{key} must be a non-negative integer, got {value!r}")
    return value


def _seconds(meta: dict[str, Any], key: str) -> float | None:
    value = meta.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise BadLine("invalid", f"{key} must be a non-negative number, got {value!r}")
    return float(value)


def _fetches(details: Any, storage_tier: Callable[[str], str]) -> tuple[int, tuple[TierFetch, ...]]:
    """(G1 tokens, the tokens fetched from the tiers below) of `cached_tokens_details`."""
    if not isinstance(details, dict):
        raise BadLine("invalid", f"cached_tokens_details must be an object, got {type(details).__name__}")
    device = _count(details, "device", required=True) or 0
    host = _count(details, "host", required=True) or 0
    storage = _count(details, "storage") or 0
    backend = details.get("storage_backend")
    if backend is not None and not isinstance(backend, str):
        raise BadLine("invalid", f"storage_backend must be a string, got {backend!r}")
    fetches = []
    if host:
        fetches.append(TierFetch("G2", host))
    if storage:
        key = backend_key(backend or "")
        fetches.append(TierFetch(UNATTRIBUTED if key in PLACEHOLDERS else storage_tier(key), storage))
    return device, tuple(fetches)


def parse_line(line: bytes | str, labels: LineLabels, storage_tier: Callable[[str], str]) -> RequestRecord:
    """The record of one line; `storage_tier` maps a backend (its flag name, sglang_backends.backend_key) to a tier."""
    try:
        meta = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BadLine("malformed", f"not JSON: {str(exc)[:120]}") from None
    if not isinstance(meta, dict):
        raise BadLine("malformed", f"a line is a JSON object, not {type(meta).__name__}")
    rid = meta.get("id")
    if not isinstance(rid, str) or not rid:
        raise BadLine("invalid", f"id must be a non-empty string, got {rid!r}")
    prompt = _count(meta, "prompt_tokens", required=True)
    cached = _count(meta, "cached_tokens")
    received, first_token = _seconds(meta, "request_received_ts"), _seconds(meta, "prefill_finished_time")
    if received is None or first_token is None:
        raise BadLine("no_timing", "no request_received_ts / prefill_finished_time (SGLang without "
                                   "--enable-metrics, or the request ended before its prefill)")
    if first_token < received:
        raise BadLine("invalid", f"prefill_finished_time {first_token} before request_received_ts {received}")
    forward = _seconds(meta, "forward_entry_time")
    if forward is not None and not received <= forward <= first_token:
        raise BadLine("invalid", f"forward_entry_time {forward} outside [{received}, {first_token}]")
    g1, fetches = (None, ()) if meta.get("cached_tokens_details") is None else _fetches(
        meta["cached_tokens_details"], storage_tier)
    if cached is None:
        cached = 0 if g1 is None else g1 + sum(f.tokens for f in fetches)
    elif g1 is None and cached == 0:
        g1 = 0  # nothing cached: SGLang writes no details, and nothing was fetched
    split = (g1 or 0) + sum(f.tokens for f in fetches)
    if max(split, cached) > (prompt or 0):
        raise BadLine("invalid", f"more tokens cached ({cached}, by tier {split}) than the prompt has ({prompt})")
    dp_rank = meta.get("dp_rank")
    return RequestRecord(
        request_id=rid, engine=labels.engine, model=labels.model,
        dp_rank=str(dp_rank) if isinstance(dp_rank, int) and not isinstance(dp_rank, bool) else labels.dp_rank,
        arrival=received, ttft=first_token - received, prompt_tokens=prompt, cached_tokens=cached,
        queue=_seconds(meta, "queue_time"), prefill=None if forward is None else first_token - forward,
        fetches=fetches, g1_tokens=g1, source=SOURCE,
    )
