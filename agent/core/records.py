"""Per-request data on both sides of the correlation analysis.

Sources → analyses: the `RequestRecord` every per-request source (OTLP spans, AIPerf exports, the
reference pipeline) normalises to, and the `RecordBuffer` that carries records from the sources to
the correlation analysis. Analyses → sinks: the `AttributedRequest`, one request's TTFT split into
components with the method behind each, which the JSON Lines exporter (and any later sink) writes.

Sources differ in what they know: a vLLM `llm_request` span has TTFT, queue and prefill time and the
prompt length but no cached tokens; an AIPerf record has TTFT, prompt length and (with a server that
reports it) cached tokens but no server-side phases; the reference pipeline knows everything. Every
field a source does not know is None, never 0, so the engine can tell "measured zero" from "unknown".
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

Interval = tuple[float, float]  # (start, end) in wall-clock seconds


@dataclass(frozen=True, slots=True)
class TierFetch:
    """What one request read from one tier (G2..G4): tokens, and bytes/seconds where measured."""

    tier: str
    tokens: int
    bytes: float | None = None
    seconds: float | None = None


@dataclass(frozen=True, slots=True)
class RequestRecord:
    request_id: str
    engine: str  # engine kind label (vllm, reference, ...)
    model: str
    dp_rank: str
    arrival: float  # wall-clock seconds when the request arrived (span start, AIPerf request start)
    ttft: float  # seconds
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # reused from any tier (G1 included); None = the source does not say
    queue: float | None = None  # measured queue time
    prefill: float | None = None  # measured prefill time (vLLM: first schedule -> first token)
    fetches: tuple[TierFetch, ...] = ()  # reused tokens by tier below G1, where the source says
    # reused tokens G1 itself served (nothing to fetch), where the source splits hits by tier (SGLang's
    # cached_tokens_details); None: the source does not say
    g1_tokens: int | None = None
    fetch_seconds: float | None = None  # measured total fetch time (reference pipeline)
    # measured offload (evictions, stores down) between the first schedule and the first token, i.e. inside
    # the prefill phase (reference pipeline); None: the source does not say
    offload_seconds: float | None = None
    # Explicit phase intervals, where the source timed them; otherwise derived from the phases above.
    fetch_intervals: tuple[Interval, ...] = ()
    compute_intervals: tuple[Interval, ...] = ()
    source: str = ""  # otlp, aiperf, reference: for the JSONL output
    # the engine's own span for the request (W3C ids: 16 and 8 bytes), where the source had one: the OTLP
    # trace exporter makes its attribution span a child of it
    trace_id: bytes | None = None
    span_id: bytes | None = None

    @property
    def nothing_fetched(self) -> bool:
        """Whether the source says that no reused token came from below G1: none reused, or all of them G1's."""
        return self.cached_tokens == 0 or (not self.fetches and self.g1_tokens is not None
                                           and self.g1_tokens == self.cached_tokens)

    @property
    def tier_tokens(self) -> dict[str, int] | None:
        """Reused tokens by the tier that served them (G1 included), where the source splits them; else None."""
        if self.g1_tokens is None and not self.fetches:
            return None
        out = {} if self.g1_tokens is None else {"G1": self.g1_tokens}
        for fetch in self.fetches:
            out[fetch.tier] = out.get(fetch.tier, 0) + fetch.tokens
        return out

    @property
    def new_tokens(self) -> int | None:
        if self.prompt_tokens is None or self.cached_tokens is None:
            return None
        return max(0, self.prompt_tokens - self.cached_tokens)


@dataclass
class RecordBuffer:
    """A bounded, thread-safe hand-over from receivers (OTLP, AIPerf) to the correlation engine.

    When the engine falls behind, the oldest records are dropped and counted: a burst of spans must
    never grow the sidecar's memory without bound.
    """

    capacity: int = 65536
    _records: deque[RequestRecord] = field(init=False)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    dropped: int = field(init=False, default=0)
    received: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError("capacity must be >= 1")
        self._records = deque(maxlen=self.capacity)

    def put(self, records: Iterable[RequestRecord]) -> None:
        with self._lock:
            for record in records:
                if len(self._records) == self.capacity:
                    self.dropped += 1
                self._records.append(record)
                self.received += 1

    def drain(self) -> list[RequestRecord]:
        with self._lock:
            out = list(self._records)
            self._records.clear()
            return out

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)


Method = Literal["measured", "estimated", "derived"]
# the components of a TTFT, in the order of a request's path: frontend (what the engine timed outside its
# queue and prefill phases: arrival -> queued, and the first token's way out), then the engine core's phases;
# other is what no timer of the engine places (GPU idle inside the prefill phase, or the whole remainder of
# an engine or client that times no phases), wherever it sat
COMPONENTS = ("frontend", "queue", "fetch", "offload", "prefill", "other")
# the attribution errors an Attribution carries (attribute names), exported as the error counter's `kind`
ERROR_KINDS = ("negative_remainder", "fetch_overflow", "estimate_overflow", "offload_overflow", "idle_overflow")


@dataclass(frozen=True, slots=True)
class Part:
    """One component of a TTFT (frontend, queue, fetch, offload, prefill, other): its seconds and how they were
    obtained."""

    seconds: float
    method: Method


@dataclass(frozen=True, slots=True)
class Attribution:
    ttft: float
    parts: dict[str, Part]  # component -> value and method; a component no source covers is absent
    negative_remainder: float = 0.0  # measured/estimated parts exceeded TTFT by this much
    fetch_overflow: float = 0.0  # fetch larger than the phase that contains it, by this much
    estimate_overflow: float = 0.0  # estimated compute larger than the measured prefill, by this much
    offload_overflow: float = 0.0  # offload larger than what was left of the prefill phase, by this much
    # GPU idle seen in prefill phases (beyond fetch and offload) larger than what was left of the window's
    # prefill sum, by this much (aggregate only: a request's idle never exceeds its own phase)
    idle_overflow: float = 0.0
    # GPU idle seconds of the prefill phase (beyond its fetch and offload) moved from prefill to other
    prefill_idle: float = 0.0

    def seconds(self, component: str) -> float:
        part = self.parts.get(component)
        return 0.0 if part is None else part.seconds


@dataclass(frozen=True, slots=True)
class AttributedRequest:
    """What the correlation analysis hands its request sinks for each request it attributed."""

    record: RequestRecord
    attribution: Attribution
    prefill_saved: float | None  # recompute time the cache avoided (negative: the cache cost time)
    ttft_without_cache: float | None  # the counterfactual TTFT had nothing been reused
    # how far the two counterfactuals can be trusted: "high" when the prefill cost model was fitted with
    # its coefficients pinned down, "low" when it fell back to a prior; "" when there is no counterfactual
    confidence: str = ""


class RecentRequests:
    """The latest attributed requests, kept for analyses that read them after the correlation analysis.

    The wiring hands it to the correlation analysis as one more request sink (RequestSink), and to the
    analyses that need per-request figures (the what-if analysis) through AnalysisInputs. Bounded: when a
    reader falls more than `capacity` requests behind, it misses the oldest (`since` says how many)."""

    def __init__(self, capacity: int = 4096) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self._items: deque[AttributedRequest] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self.written = 0  # requests written since start

    def write(self, results: Sequence[AttributedRequest]) -> None:
        with self._lock:
            self._items.extend(results)
            self.written += len(results)

    def since(self, cursor: int) -> tuple[list[AttributedRequest], int, int]:
        """(requests written after `cursor`, the new cursor, how many of them were already gone)."""
        with self._lock:
            new = self.written - cursor
            kept = min(new, len(self._items))
            out = list(self._items)[len(self._items) - kept:] if kept > 0 else []
            return out, self.written, max(0, new - kept)
