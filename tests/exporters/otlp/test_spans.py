"""Attribution traces: the spans of one attributed request, the engine's span as their parent, and a sink
that never blocks the analysis that feeds it."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from kvscope.agent.core.catalogue import Catalogue
from kvscope.agent.core.records import AttributedRequest, Attribution, Part, RequestRecord, TierFetch
from kvscope.agent.core.store import Store
from kvscope.collectors.requests.otlp_traces import PROTOBUF, Labels, decode_export
from kvscope.exporters.otlp import settings as otlp_settings
from kvscope.exporters.otlp.spans import ROOT, STOP_GRACE, AttributionSpans, OtlpTracesSink
from testkit.paths import FIXTURES

SCOPE = InstrumentationScope("kvscope", "test")
FIXTURE = FIXTURES / "correlation" / "otlp" / "llm_request.binpb"
TRACE, SPAN = bytes.fromhex("9022c12b0a50ea6f11bb3bd36219ef46"), bytes.fromhex("1e8c250b16ae00f8")


def result(request: str = "r1", ids: bool = True, fetches: tuple[TierFetch, ...] = ()) -> AttributedRequest:
    record = RequestRecord(request, "vllm", "m", "0", arrival=100.0, ttft=2.0, prompt_tokens=1000, cached_tokens=800,
                           queue=0.7, prefill=1.0, fetches=fetches, source="otlp",
                           trace_id=TRACE if ids else None, span_id=SPAN if ids else None)
    parts = {"frontend": Part(0.2, "derived"), "queue": Part(0.5, "derived"), "fetch": Part(0.2, "estimated"),
             "prefill": Part(1.0, "measured"), "other": Part(0.1, "derived")}
    return AttributedRequest(record, Attribution(2.0, parts), prefill_saved=0.9, ttft_without_cache=2.9)


def build(*results: AttributedRequest) -> dict[str, ReadableSpan]:
    return {s.name: s for s in AttributionSpans(Resource.create({"service.name": "t"}), SCOPE).build(results)}


def test_the_receiver_keeps_the_engine_spans_ids() -> None:
    records = decode_export(FIXTURE.read_bytes(), PROTOBUF, Labels()).records
    a3 = next(r for r in records if r.request_id == "cmpl-a3")
    assert (a3.trace_id, a3.span_id) == (TRACE, SPAN)
    assert all(r.trace_id is not None and len(r.trace_id) == 16 for r in records)


def test_one_request_is_a_child_of_the_engine_span_with_its_components_back_to_back() -> None:
    spans = build(result())
    root = spans[ROOT]
    assert root.context is not None and root.parent is not None
    assert root.context.trace_id == int.from_bytes(TRACE, "big") and root.parent.span_id == int.from_bytes(SPAN, "big")
    assert (root.start_time, root.end_time) == (100_000_000_000, 102_000_000_000)
    layout = {name: (spans[f"kvscope.{name}"].start_time, spans[f"kvscope.{name}"].end_time)
              for name in ("frontend", "queue", "fetch", "other", "prefill")}
    assert layout == {"frontend": (100_000_000_000, 100_200_000_000), "queue": (100_200_000_000, 100_700_000_000),
                      "fetch": (100_700_000_000, 100_900_000_000), "other": (100_900_000_000, 101_000_000_000),
                      "prefill": (101_000_000_000, 102_000_000_000)}
    for name in layout:
        child = spans[f"kvscope.{name}"]
        assert child.parent is not None and child.parent.span_id == root.context.span_id
        assert child.attributes is not None and child.attributes["kvscope.ttft.component"] == name
    assert spans["kvscope.fetch"].attributes["kvscope.ttft.method"] == "estimated"  # type: ignore[index]
    attrs = dict(root.attributes or {})
    assert attrs["kvscope.ttft.prefill.seconds"] == 1.0 and attrs["kvscope.ttft.prefill.method"] == "measured"
    assert attrs["gen_ai.usage.input_tokens"] == 1000 and attrs["gen_ai.usage.cache_read.input_tokens"] == 800
    assert attrs["kvscope.request.id"] == "r1" and attrs["gen_ai.request.model"] == "m"
    assert attrs["kvscope.prefill_saved.seconds"] == 0.9 and attrs["kvscope.ttft_without_cache.seconds"] == 2.9
    assert not [k for k in attrs if k.startswith("kvscope.ttft.error")]


def test_without_the_engine_span_a_trace_of_its_own_and_tiers_as_events() -> None:
    tiers = (TierFetch("G4", 512, 512 * 36_864.0, 0.15), TierFetch("G2", 288))
    spans = build(result(ids=False, fetches=tiers))
    assert spans[ROOT].parent is None
    events = spans["kvscope.fetch"].events
    assert [(e.name, dict(e.attributes or {})) for e in events] == [
        ("kvscope.kv.fetch", {"kvscope.kv.tier": "G4", "kvscope.kv.tokens": 512, "kvscope.kv.bytes": 512 * 36_864.0,
                              "kvscope.kv.fetch.seconds": 0.15}),
        ("kvscope.kv.fetch", {"kvscope.kv.tier": "G2", "kvscope.kv.tokens": 288})]
    attrs = dict(spans[ROOT].attributes or {})
    assert attrs["kvscope.kv.G4.tokens"] == 512 and attrs["kvscope.kv.G2.tokens"] == 288
    assert "kvscope.kv.fetch.bytes" not in attrs  # G2's bytes are unknown: no total is made up
    assert "kvscope.kv.G1.tokens" not in attrs  # the record does not say what G1 served


def test_tokens_g1_served_are_an_attribute_where_the_source_says() -> None:
    split = result()
    record = dataclasses.replace(split.record, g1_tokens=512, fetches=(TierFetch("G2", 288),))
    attrs = dict(build(AttributedRequest(record, split.attribution, None, None))[ROOT].attributes or {})
    assert attrs["kvscope.kv.G1.tokens"] == 512 and attrs["kvscope.kv.G2.tokens"] == 288


def test_a_timing_that_is_not_finite_builds_spans_all_the_same() -> None:
    broken = result()
    broken = AttributedRequest(broken.record, Attribution(2.0, {"fetch": Part(float("nan"), "estimated")}),
                               None, None)
    spans = build(broken)
    assert set(spans) == {ROOT, "kvscope.fetch"}


class Exporter(SpanExporter):
    def __init__(self, answer: SpanExportResult = SpanExportResult.SUCCESS, block: bool = False) -> None:
        self.answer, self.release = answer, threading.Event()
        if not block:
            self.release.set()
        self.batches: list[int] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.release.wait(10)
        self.batches.append(len(spans))
        return self.answer

    def shutdown(self) -> None:
        self.release.set()


def sink_with(exporter: Exporter, queue: int = 100, batch: int = 10) -> tuple[OtlpTracesSink, Store]:
    store = Store(Catalogue(otlp_settings.METRICS))
    sink = OtlpTracesSink(store, AttributionSpans(Resource.create({}), SCOPE), exporter, queue, batch, delay=0.05)
    sink.start()
    return sink, store


def counts(store: Store) -> dict[str, float | None]:
    return {r: store.value(otlp_settings.TRACES, (r,)) for r in ("exported", "failed", "dropped")}


@pytest.mark.parametrize(("answer", "key"), [(SpanExportResult.SUCCESS, "exported"),
                                             (SpanExportResult.FAILURE, "failed")])
def test_requests_are_exported_in_batches_and_counted(answer: SpanExportResult, key: str) -> None:
    exporter = Exporter(answer)
    sink, store = sink_with(exporter)
    sink.write([result(f"r{i}") for i in range(25)])
    deadline = time.monotonic() + 5
    while sum(exporter.batches) < 25 * 5 and time.monotonic() < deadline:
        time.sleep(0.02)
    sink.stop()
    assert sum(exporter.batches) == 25 * 6 and max(exporter.batches) <= 10 * 6  # 6 spans a request, 10 a batch
    assert counts(store) == {"exported": 0.0, "failed": 0.0, "dropped": 0.0} | {key: 25.0}
    ok = "ok" if key == "exported" else "failed"
    assert store.value(otlp_settings.EXPORTS, ("traces", ok)) == 3.0


def test_a_stuck_exporter_never_blocks_write_and_what_does_not_fit_is_counted() -> None:
    exporter = Exporter(block=True)
    sink, store = sink_with(exporter, queue=20, batch=5)
    started = time.monotonic()
    for i in range(100):
        sink.write([result(f"r{i}")])
    took = time.monotonic() - started
    assert took < 0.5, took
    stopping = time.monotonic()
    sink.stop()
    assert time.monotonic() - stopping < STOP_GRACE + 1.0
    seen = counts(store)
    # one batch was in the exporter when it stuck; the queue held 20; all else was dropped, nothing lost unseen
    assert seen["dropped"] is not None and seen["dropped"] >= 75
    assert sum(v or 0 for v in seen.values()) == 100
