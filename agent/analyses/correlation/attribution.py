"""TTFT attribution: TTFT = frontend + queue + fetch + offload + prefill + other, per window and per request.

vLLM's definitions (shared/facts/vllm.md §1.2, §3), which fix where fetch and offload time hide:

- TTFT            = first output − arrival, measured in the frontend;
- queue time      = first SCHEDULED − QUEUED, in the engine core;
- prefill time    = first token − first SCHEDULED (preemptions during prefill included).

A KV load the connector performs *synchronously* (in the step) sits inside prefill time. A load it
performs *asynchronously* keeps the request in WAITING_FOR_REMOTE_KVS, and the SCHEDULED event is only
recorded once the load has finished (vllm/v1/core/sched/scheduler.py: the `load_kv_async` branch
`continue`s before `record_event(SCHEDULED)`), so the load sits inside queue time. vLLM's
OffloadingConnector answers `get_num_new_matched_tokens` with `(hits, True)`: asynchronous, so
`fetch_inside="queue"` is the vLLM default. A connector that loads in the step (layer-wise LMCache)
wants `"prefill"`.

Offload (storing KV down a tier, evicting to make room) is the same question for the other direction.
vLLM's OffloadingConnector defers each store to the start of the next engine step and runs it on its own
stream, so it sits in no request's phases (`offload_inside="none"`, the default: no offload component).
An engine that stores synchronously inside the step (the reference engine evicts G1 → G2 while it
schedules a request) has its store time inside the prefill phase (`"prefill"`). So, per window:

    fetch   = connector load time + tiering read time              (measured: transfer seconds)
    offload = store time of the links leaving G1                   (measured; estimated from bytes / the
              link's bandwidth where the engine counts bytes only) — only when offload sits in prefill
    queue   = queue_time − fetch          if fetch sits in queue   (derived), else queue_time (measured)
    prefill = prefill_time − fetch − offload   for what sits there (derived), else prefill_time (measured)
    frontend = TTFT − queue_time − prefill_time                    (derived; the remainder)

`frontend` is what the engine's own TTFT holds outside its core's two phases. In vLLM that is the API
server's part: arrival (stamped before the prompt is rendered and tokenised) → QUEUED in the engine core
(tokenisation, input processing, the IPC hop into the core), plus the first output's way back (the core's
output IPC, detokenising) up to the frontend's iteration timestamp. vLLM times the two only together:
its spans give `gen_ai.latency.time_to_first_token`, `time_in_queue` and `time_in_model_prefill` as
durations, and QUEUED and the first token are engine-core monotonic stamps no span or metric carries.

A GPU that sat idle inside the prefill phase, outside its fetch and offload, was not computing this
request: scheduling gaps, the engine's own bookkeeping, a CPU-starved engine thread (correlation.md §1).
Per request, where the GPU samples tell (`cross_layer.idle_seconds` over the phase), that idle time
leaves `prefill` for `other`; the aggregate takes the same seconds out of its window's prefill sum
(`WindowTotals.prefill_idle`). So `other` is what no timer of the engine places. An engine that reports
no queue or prefill time has no `frontend`: its whole remainder is `other`.

`frontend` and `other` are never negative: when measured parts exceed TTFT both are 0 and the excess is reported as
`negative_remainder`; fetch (offload) that does not fit in what is left of the phase that should contain
it is capped and the excess reported as `fetch_overflow` (`offload_overflow`). So Σ components = TTFT +
negative_remainder, exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from kvscope.agent.analyses.correlation.costmodel import PrefillCostModel
from kvscope.agent.core.records import COMPONENTS, Attribution, Method, Part, RequestRecord

FetchInside = Literal["queue", "prefill"]
OffloadInside = Literal["prefill", "none"]
__all__ = ["COMPONENTS", "FetchInside", "OffloadInside", "WindowTotals", "attribute_request", "attribute_window",
           "compute_sample", "estimate_fetch", "idle_gap", "measured_fetch"]


@dataclass(frozen=True, slots=True)
class WindowTotals:
    """Sums over one window of one engine's series; None where the engine does not report it."""

    ttft: float
    queue: float | None
    prefill: float | None
    fetch: float | None
    offload: float | None = None  # store seconds of the links leaving G1
    offload_method: Method = "measured"  # "estimated" when it came from bytes over a bandwidth
    prefill_idle: float | None = None  # GPU idle in the requests' prefill phases beyond fetch and offload


def _finish(ttft: float, parts: dict[str, Part], timed: bool, **errors: float) -> Attribution:
    """The remainder: `frontend` and `other` where the engine timed both phases (`timed`), else `other`.

    The engine's own TTFT less its queue and prefill time is what it timed outside those phases: its
    `frontend`. `other` is then only what was moved out of a phase (GPU idle, `prefill_idle`).
    """
    explained = sum(p.seconds for p in parts.values())
    remainder = ttft - explained
    if timed:
        moved = errors.get("prefill_idle", 0.0)
        parts["frontend"] = Part(max(0.0, remainder - moved), "derived")
        parts["other"] = Part(min(moved, max(0.0, remainder)), "derived")
    else:
        parts["other"] = Part(max(0.0, remainder), "derived")
    return Attribution(ttft, parts, negative_remainder=max(0.0, -remainder), **errors)


def _carve(parts: dict[str, Part], container: str, component: str, seconds: float, method: Method) -> float:
    """Take `seconds` of `component` out of the measured phase `container`; returns the overflow."""
    phase = parts[container].seconds
    taken = min(seconds, phase)
    parts[container] = Part(phase - taken, "derived" if taken > 0 else parts[container].method)
    parts[component] = Part(taken, method)
    return seconds - taken


def attribute_window(totals: WindowTotals, fetch_inside: FetchInside,
                     offload_inside: OffloadInside = "none") -> Attribution:
    """Aggregate attribution of one window's sums (module docstring has the derivation)."""
    parts: dict[str, Part] = {}
    if totals.queue is not None:
        parts["queue"] = Part(totals.queue, "measured")
    if totals.prefill is not None:
        parts["prefill"] = Part(totals.prefill, "measured")
    overflow = offload_overflow = 0.0
    if totals.fetch is not None:
        if fetch_inside in parts:
            overflow = _carve(parts, fetch_inside, "fetch", totals.fetch, "measured")
        else:  # the phase that would contain it is not reported: fetch comes out of the remainder
            parts["fetch"] = Part(totals.fetch, "measured")
    if totals.offload is not None and offload_inside == "prefill":
        if "prefill" in parts:
            offload_overflow = _carve(parts, "prefill", "offload", totals.offload, totals.offload_method)
        else:
            parts["offload"] = Part(totals.offload, totals.offload_method)
    idle_overflow = moved = 0.0
    if totals.prefill_idle and "prefill" in parts:
        idle_overflow = _idle(parts, totals.prefill_idle)
        moved = totals.prefill_idle - idle_overflow
    timed = totals.queue is not None and totals.prefill is not None
    return _finish(totals.ttft, parts, timed, fetch_overflow=overflow, offload_overflow=offload_overflow,
                   idle_overflow=idle_overflow, prefill_idle=moved)


def idle_gap(idle: float | None, inside: float) -> float:
    """GPU idle seconds in a prefill phase beyond the fetch and offload that sit in it (they idle it too)."""
    return max(0.0, idle - inside) if idle else 0.0


def _idle(parts: dict[str, Part], seconds: float) -> float:
    """Moves `seconds` of GPU idle time out of `prefill` (to the remainder, `other`); returns the excess."""
    phase = parts["prefill"].seconds
    taken = min(seconds, phase)
    if taken > 0:
        parts["prefill"] = Part(phase - taken, "derived")
    return seconds - taken


def estimate_fetch(
    record: RequestRecord,
    seconds_for: Callable[[str, float], float | None],
    bytes_per_token: Callable[[str], float | None],
) -> float | None:
    """Σ_t bytes_t/BW_t + L_t over the tiers the record read from; None when any tier is unknown.

    A tier's measured seconds win over the model; bytes come from the record or tokens × bytes/token.
    A record that reused tokens without saying from which tier has no estimate (they may be G1 hits).
    """
    if not record.fetches:
        return 0.0 if record.nothing_fetched else None
    total = 0.0
    for fetch in record.fetches:
        if fetch.seconds is not None:
            total += fetch.seconds
            continue
        moved = fetch.bytes
        if moved is None:
            per_token = bytes_per_token(fetch.tier)
            if per_token is None:
                return None
            moved = fetch.tokens * per_token
        modelled = seconds_for(fetch.tier, moved)
        if modelled is None:
            return None
        total += modelled
    return total


def measured_fetch(record: RequestRecord) -> float | None:
    if record.fetch_seconds is not None:
        return record.fetch_seconds
    if record.fetches and all(f.seconds is not None for f in record.fetches):
        return sum(f.seconds or 0.0 for f in record.fetches)
    if record.nothing_fetched:
        return 0.0  # nothing reused, or all of it from G1: nothing fetched, a known zero
    return None


def attribute_request(
    record: RequestRecord,
    model: PrefillCostModel,
    fetch_estimate: float | None,
    fetch_inside: FetchInside,
    prefill_idle: float | None = None,
) -> Attribution:
    """Per-request attribution; `fetch_estimate` is the tier model's Σ bytes/BW + L (or None).

    A record's measured offload is, by its definition, inside the prefill phase: it is carved from there
    first, whatever the engine's aggregate setting says. `prefill_idle`: seconds the GPU was idle during
    the request's measured prefill phase (None: no GPU samples); what exceeds the fetch and offload in
    that phase goes from prefill to other.
    """
    parts: dict[str, Part] = {}
    if record.queue is not None:
        parts["queue"] = Part(record.queue, "measured")
    if record.prefill is not None:
        parts["prefill"] = Part(record.prefill, "measured")
    phases = set(parts)  # the phases the source measured, that fetch and offload can be carved from
    timed = phases == {"queue", "prefill"}
    fetch = measured_fetch(record)
    fetch_method: Method = "measured"
    new, ctx = record.new_tokens, record.cached_tokens
    compute_estimate = model.compute(new, ctx or 0) if new is not None and model.known else None
    overflow = estimate_overflow = offload_overflow = 0.0

    if record.offload_seconds is not None:
        if "prefill" in phases:
            offload_overflow = _carve(parts, "prefill", "offload", record.offload_seconds, "measured")
        else:
            parts["offload"] = Part(record.offload_seconds, "measured")

    if "prefill" in phases and fetch_inside == "prefill" and fetch is None and compute_estimate is not None:
        # the measured prefill (less its offload) split by the model: compute estimated, fetch the rest
        measured = parts["prefill"].seconds
        compute = min(compute_estimate, measured)
        estimate_overflow = compute_estimate - compute
        parts["prefill"] = Part(compute, "estimated")
        parts["fetch"] = Part(measured - compute, "derived")
        return _finish(record.ttft, parts, timed, estimate_overflow=estimate_overflow,
                       offload_overflow=offload_overflow)

    if fetch is None and fetch_estimate is not None:
        fetch, fetch_method = fetch_estimate, "estimated"
    if "prefill" not in parts and compute_estimate is not None:
        parts["prefill"] = Part(compute_estimate, "estimated")  # a client record: no server phases
    if fetch is not None:
        if fetch_inside in phases:
            overflow = _carve(parts, fetch_inside, "fetch", fetch, fetch_method)
        else:
            parts["fetch"] = Part(fetch, fetch_method)
    moved = 0.0
    if "prefill" in phases and prefill_idle:
        inside = parts["offload"].seconds if record.offload_seconds is not None and "offload" in parts else 0.0
        if fetch_inside == "prefill" and "fetch" in parts:
            inside += parts["fetch"].seconds
        gap = idle_gap(prefill_idle, inside)
        moved = gap - _idle(parts, gap)
    return _finish(record.ttft, parts, timed, fetch_overflow=overflow, offload_overflow=offload_overflow,
                   prefill_idle=moved)


def compute_sample(
    record: RequestRecord, fetch_inside: FetchInside, ttft_when_no_prefill: bool = False,
    prefill_idle: float | None = None,
) -> tuple[int, int, float] | None:
    """(new, ctx, seconds of pure compute) when the record pins its compute time down, else None.

    Pure compute is measured prefill with the fetch and offload inside it removed: an async-load engine's
    prefill time is pure compute once a measured offload (if any) is taken out; a sync-load engine's,
    once a measured (or known-zero) fetch is too. A client record without phases counts only if allowed
    (`ttft_when_no_prefill`) and the request was cold — TTFT then also holds queueing, so it suits
    unloaded sweeps like the seeds'. GPU idle time in the prefill phase beyond its fetch and offload
    (`prefill_idle`, as in attribute_request) is not compute either.
    """
    new, ctx = record.new_tokens, record.cached_tokens
    if new is None or ctx is None or new <= 0:
        return None
    if record.prefill is not None:
        inside = record.offload_seconds or 0.0
        if fetch_inside == "prefill":
            fetch = measured_fetch(record)
            if fetch is None:
                return None
            inside += fetch
        spent = record.prefill - inside - idle_gap(prefill_idle, inside)
        return (new, ctx, spent) if spent > 0 else None
    if ttft_when_no_prefill and ctx == 0:
        return new, 0, record.ttft - (record.queue or 0.0)
    return None
