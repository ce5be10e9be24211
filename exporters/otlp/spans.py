"""Each attributed request as a trace over OTLP: where its time to first token went.

One span per request, `kvscope.ttft`, from arrival to first token. Where the engine's own span is known
(vLLM's `llm_request`, received by the `otlp_traces` collector) it is that span's child, so it shows
inside the engine's trace in Tempo or Jaeger; otherwise it starts a trace of its own. Under it, one
span per TTFT component the correlation analysis attributed — `kvscope.frontend`,
`kvscope.queue`, `kvscope.offload`, `kvscope.fetch`, `kvscope.other`, `kvscope.prefill` — laid back to
back in that order so that they end at the first token. The durations are the attribution's; the
placement is a picture (vLLM's span gives phase lengths, not phase times). Per tier, where the source
said what it fetched from where, an event `kvscope.kv.fetch` on the fetch span. The attribute names are
in docs/otlp-export.md.

`OtlpTracesSink` is a request sink: the correlation analysis calls `write()` on its own thread, so it
only appends to a bounded queue (full: the requests are dropped and counted). A thread of its own
builds the spans and exports them in batches; a slow or dead collector holds only that thread.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.util.types import AttributeValue

from kvscope.agent.core.records import ERROR_KINDS, AttributedRequest, RequestRecord
from kvscope.agent.core.store import Store
from kvscope.exporters.otlp.settings import TRACES, ExportCounter

log = logging.getLogger("kvscope.otlp")

ROOT = "kvscope.ttft"
# laid out backwards from the first token: prefill ends there, the fetch before it, the offload that made
# room for both before that (an engine makes room before it loads), ...
LAYOUT = ("prefill", "other", "fetch", "offload", "queue", "frontend")  # from the first token back
FETCH_EVENT = "kvscope.kv.fetch"
STOP_GRACE = 2.0  # seconds stop() waits for the queue to go out before it drops the rest
EXPORT_DELAY = 1.0  # seconds a partial batch waits (the analysis hands over one window at a time)


def _ns(seconds: float) -> int:
    # sources validate their timings; a non-finite one that slipped through must not fail a whole batch
    return round(seconds * 1e9) if math.isfinite(seconds) else 0


def request_attributes(result: AttributedRequest) -> dict[str, AttributeValue]:
    """The root span's attributes: what the request was, and its TTFT by component with methods."""
    record, attribution = result.record, result.attribution
    attrs: dict[str, AttributeValue] = {
        "kvscope.request.id": record.request_id, "kvscope.request.source": record.source,
        "kvscope.engine": record.engine, "kvscope.dp_rank": record.dp_rank, "gen_ai.request.model": record.model,
        "kvscope.ttft.seconds": record.ttft,
    }
    if record.prompt_tokens is not None:
        attrs["gen_ai.usage.input_tokens"] = record.prompt_tokens
    if record.cached_tokens is not None:
        attrs["gen_ai.usage.cache_read.input_tokens"] = record.cached_tokens
    for name, part in attribution.parts.items():
        attrs[f"kvscope.ttft.{name}.seconds"] = part.seconds
        attrs[f"kvscope.ttft.{name}.method"] = part.method
    for kind in ERROR_KINDS:
        error = getattr(attribution, kind)
        if error:
            attrs[f"kvscope.ttft.error.{kind}.seconds"] = error
    if record.g1_tokens is not None:
        attrs["kvscope.kv.G1.tokens"] = record.g1_tokens
    for fetch in record.fetches:
        attrs[f"kvscope.kv.{fetch.tier}.tokens"] = fetch.tokens
        if fetch.bytes is not None:
            attrs[f"kvscope.kv.{fetch.tier}.bytes"] = fetch.bytes
    if record.fetches and all(f.bytes is not None for f in record.fetches):
        attrs["kvscope.kv.fetch.bytes"] = sum(f.bytes or 0.0 for f in record.fetches)
    if result.prefill_saved is not None:
        attrs["kvscope.prefill_saved.seconds"] = result.prefill_saved
    if result.ttft_without_cache is not None:
        attrs["kvscope.ttft_without_cache.seconds"] = result.ttft_without_cache
    if result.confidence:
        attrs["kvscope.counterfactual.confidence"] = result.confidence
    return attrs


def _parent(record: RequestRecord) -> Context:
    """The engine's span as the remote parent, where the source had its ids; else no parent."""
    if record.trace_id is None or record.span_id is None:
        return Context()
    engine = SpanContext(int.from_bytes(record.trace_id, "big"), int.from_bytes(record.span_id, "big"),
                         is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace.set_span_in_context(NonRecordingSpan(engine), Context())


class _Collect(SpanProcessor):
    """Hands ended spans to the batch being built (on the export thread only)."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


class AttributionSpans:
    """Builds each attributed request's spans with the SDK's tracer (ids, limits, resource, scope)."""

    def __init__(self, resource: Resource, scope: InstrumentationScope) -> None:
        self._collect = _Collect()
        self._provider = TracerProvider(sampler=ALWAYS_ON, resource=resource, shutdown_on_exit=False)
        self._provider.add_span_processor(self._collect)
        self._tracer = self._provider.get_tracer(scope.name, scope.version)

    def build(self, results: Sequence[AttributedRequest]) -> list[ReadableSpan]:
        for result in results:
            self._request(result)
        spans, self._collect.spans = self._collect.spans, []
        return spans

    def _request(self, result: AttributedRequest) -> None:
        record, parts = result.record, result.attribution.parts
        # durations exact to the ns; the start as exact as a float of epoch seconds keeps it (~0.25 µs)
        arrival = _ns(record.arrival)
        first_token = arrival + _ns(record.ttft)
        root = self._tracer.start_span(ROOT, context=_parent(record), kind=SpanKind.INTERNAL,
                                       attributes=request_attributes(result), start_time=arrival)
        inside = trace.set_span_in_context(root, Context())
        end = first_token
        fetched = False
        for name in LAYOUT:
            part = parts.get(name)
            if part is None:
                continue
            start = max(arrival, end - _ns(part.seconds))
            child = self._tracer.start_span(f"kvscope.{name}", context=inside, start_time=start, attributes={
                "kvscope.ttft.component": name, "kvscope.ttft.method": part.method})
            if name == "fetch":
                self._tier_events(child, result, start)
                fetched = True
            child.end(end_time=end)
            end = start
        if not fetched:
            self._tier_events(root, result, arrival)
        root.end(end_time=first_token)

    @staticmethod
    def _tier_events(span: trace.Span, result: AttributedRequest, at: int) -> None:
        for fetch in result.record.fetches:
            attrs: dict[str, AttributeValue] = {"kvscope.kv.tier": fetch.tier, "kvscope.kv.tokens": fetch.tokens}
            if fetch.bytes is not None:
                attrs["kvscope.kv.bytes"] = fetch.bytes
            if fetch.seconds is not None:
                attrs["kvscope.kv.fetch.seconds"] = fetch.seconds
            span.add_event(FETCH_EVENT, attrs, timestamp=at)


class OtlpTracesSink:
    """A request sink and a sink: queues attributed requests, exports their spans from its own thread."""

    def __init__(self, store: Store, spans: AttributionSpans, exporter: SpanExporter, queue_size: int,
                 batch_size: int, wall_clock: Callable[[], float] = time.time, delay: float = EXPORT_DELAY) -> None:
        self._store = store
        self._spans = spans
        self._exporter = exporter
        self._queue_size, self._batch_size, self._delay = queue_size, batch_size, delay
        self._wall = wall_clock
        self._queue: deque[AttributedRequest] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._counter = ExportCounter(store, "traces", wall_clock)
        self._dropping = False

    def start(self) -> None:
        self._counter.start()
        now = self._wall()
        for result in ("exported", "failed", "dropped"):
            self._store.bump(TRACES, (result,), 0, now)
        self._thread = threading.Thread(target=self._loop, name="otlp-traces", daemon=True)
        self._thread.start()

    def write(self, results: Sequence[AttributedRequest]) -> None:
        """Called from the analysis' thread: enqueue, never export here."""
        with self._lock:
            room = max(0, self._queue_size - len(self._queue))
            self._queue.extend(results[:room])
            dropped = len(results) - min(room, len(results))
            if len(self._queue) >= self._batch_size:
                self._wake.set()
        self._drops(dropped)

    def _drops(self, dropped: int) -> None:
        if dropped:
            self._store.bump(TRACES, ("dropped",), dropped, self._wall())
        if bool(dropped) != self._dropping:
            self._dropping = bool(dropped)
            if dropped:
                log.warning("OTLP trace export queue full (%d requests): dropping attribution traces "
                            "(counted in kvscope_otlp_exporter_traces_total{result=\"dropped\"})", self._queue_size)

    def _take(self) -> list[AttributedRequest]:
        with self._lock:
            return [self._queue.popleft() for _ in range(min(self._batch_size, len(self._queue)))]

    def _loop(self) -> None:
        while True:
            self._wake.wait(self._delay)
            self._wake.clear()
            stopping = self._stopping.is_set()
            while batch := self._take():
                self.export(batch)
            if stopping:
                return

    def export(self, batch: Sequence[AttributedRequest]) -> bool:
        try:
            ok = self._exporter.export(self._spans.build(batch)) == SpanExportResult.SUCCESS
        except Exception:  # an exporter or SDK bug must not end the thread: counted and logged like a failure
            log.exception("OTLP trace export raised")
            ok = False
        self._counter.count(ok)
        self._store.bump(TRACES, ("exported" if ok else "failed",), len(batch), self._wall())
        return ok

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(STOP_GRACE)
        self._exporter.shutdown()  # aborts retries still waiting; a request in flight ends at its timeout
        if self._thread is not None:
            self._thread.join(0.5)  # what the thread still takes fails at once on a shut exporter, and is counted
        with self._lock:
            left = len(self._queue)
            self._queue.clear()
        if left:
            self._store.bump(TRACES, ("dropped",), left, self._wall())
