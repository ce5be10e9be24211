"""Metrics over OTLP: every catalogued metric, typed and valued as the OTel SDK itself would export it, and
equal to what /metrics shows at the same moment."""

from __future__ import annotations

import math
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client.parser import text_string_to_metric_families

from kvscope.agent.app.wiring import build_catalogue
from kvscope.agent.core.catalogue import Catalogue, MetricSpec, counter
from kvscope.agent.core.readings import HistogramSample, Reading, Sample
from kvscope.agent.core.store import Store
from kvscope.exporters.otlp.metrics import OtlpMetricsSink, StoreMetrics, per_bucket
from kvscope.exporters.otlp.names import otel_metric
from kvscope.exporters.otlp.settings import EXPORTS
from kvscope.exporters.prometheus.server import MetricsServer
from testkit.otlp_receiver import Samples, prometheus_samples

SCOPE = InstrumentationScope("kvscope", "test")
RESOURCE = Resource.create({"service.name": "kvscope-test"})
BOUNDS = (0.005, 0.05, 0.5, 5.0, math.inf)


def readings(specs: list[MetricSpec]) -> list[Reading]:
    """Two series of every catalogued metric, with values that differ per metric and per series."""
    out: list[Reading] = []
    for i, spec in enumerate(specs):
        for j in range(2):
            labels = tuple(f"{label}-{j}" for label in spec.labels)
            if spec.type == "histogram":
                cumulative = [float(i % 3 + j), float(i % 3 + j + 2), 7.0 + j, 9.0 + j, 12.0 + 2 * j]
                out.append(HistogramSample(spec.name, labels, tuple(zip(BOUNDS, cumulative, strict=True)),
                                           sum=3.25 * (i + 1) + j, count=cumulative[-1]))
            else:
                out.append(Sample(spec.name, labels, 1000.0 * i + 0.5 + j))
            if not spec.labels:
                break
    return out


@pytest.fixture
def store() -> Store:
    catalogue = build_catalogue()
    store = Store(catalogue)
    result = store.ingest("test", readings(list(catalogue)), time.time())
    assert result.rejected == 0
    return store


def sdk_equivalent(store: Store) -> MetricsData:
    """The same data produced by the SDK's own instruments, read with its in-memory reader: observable
    counters and gauges over the store's values, and a histogram with the store's bounds fed one value per
    count in each bucket (the SDK has no asynchronous histogram, which is why kvscope bridges the store)."""
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader], resource=RESOURCE, shutdown_on_exit=False).get_meter("kvscope")
    for spec, group in store.families():
        otel = otel_metric(spec)
        points = [(dict(zip(spec.labels, s.labels, strict=True)), s.value) for s in group]

        def observe(_options: CallbackOptions, points: list[tuple[dict[str, str], float]] = points
                    ) -> Iterator[Observation]:
            return iter([Observation(value, attrs) for attrs, value in points])

        if spec.type == "counter":
            meter.create_observable_counter(otel.name, [observe], otel.unit, spec.help)
        elif spec.type == "gauge":
            meter.create_observable_gauge(otel.name, [observe], otel.unit, spec.help)
        else:
            instrument = meter.create_histogram(otel.name, otel.unit, spec.help,
                                                explicit_bucket_boundaries_advisory=list(BOUNDS[:-1]))
            for s in group:
                attrs = dict(zip(spec.labels, s.labels, strict=True))
                previous = 0.0
                for bound, cumulative in zip(s.bounds, s.buckets, strict=True):
                    value = bound if math.isfinite(bound) else 50.0
                    for _ in range(round(cumulative - previous)):
                        instrument.record(value, attrs)
                    previous = cumulative
    data = reader.get_metrics_data()
    assert data is not None
    return data


def by_name(data: MetricsData) -> dict[str, object]:
    return {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


def test_every_catalogued_metric_is_exported_as_the_sdk_exports_it(store: Store) -> None:
    ours, sdk = by_name(StoreMetrics(store, RESOURCE, SCOPE).collect()), by_name(sdk_equivalent(store))
    assert set(ours) == {otel_metric(spec).name for spec in store.catalogue} == set(sdk)
    for name, metric in ours.items():
        theirs = sdk[name]
        assert (metric.unit, metric.description, type(metric.data)) == (  # type: ignore[attr-defined]
            theirs.unit, theirs.description, type(theirs.data)), name  # type: ignore[attr-defined]
        for field in ("aggregation_temporality", "is_monotonic"):
            assert getattr(metric.data, field, None) == getattr(theirs.data, field, None), (name, field)  # type: ignore[attr-defined]
        mine = {tuple(sorted(p.attributes.items())): p for p in metric.data.data_points}  # type: ignore[attr-defined]
        other = {tuple(sorted(p.attributes.items())): p for p in theirs.data.data_points}  # type: ignore[attr-defined]
        assert set(mine) == set(other), name
        for attrs, point in mine.items():
            if hasattr(point, "bucket_counts"):
                assert (list(point.explicit_bounds), list(point.bucket_counts), point.count) == (
                    list(other[attrs].explicit_bounds), list(other[attrs].bucket_counts), other[attrs].count), name
            else:
                assert point.value == other[attrs].value, (name, attrs)


def test_histograms_keep_their_sum_and_leave_min_and_max_unset(store: Store) -> None:
    data = StoreMetrics(store, RESOURCE, SCOPE).collect()
    request = encode_metrics(data)
    histograms = [m for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
                  if m.WhichOneof("data") == "histogram"]
    assert histograms
    for metric in histograms:
        for point in metric.histogram.data_points:
            labels = tuple(kv.value.string_value for kv in point.attributes)
            name = metric.name
            assert point.sum == store.histogram(name, labels)[2]
            assert not point.HasField("min") and not point.HasField("max")


def metrics_page(store: Store) -> Samples:
    server = MetricsServer(store, "127.0.0.1", 0)
    server.start()
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10).read().decode()
    finally:
        server.stop()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {k: (repr(float(v)) if k == "le" and v != "+Inf" else v) for k, v in sample.labels.items()}
            out[(sample.name, tuple(sorted(labels.items())))] = sample.value
    return out


def test_the_values_are_those_of_the_metrics_page_at_the_same_moment(store: Store) -> None:
    page = metrics_page(store)  # (a metrics server starts its own counters in the store: read it first)
    exported = prometheus_samples(list(encode_metrics(StoreMetrics(store, RESOURCE, SCOPE).collect())
                                       .resource_metrics[0].scope_metrics[0].metrics))
    assert exported == page
    assert {name for name, _ in page} >= {spec.name for spec in store.catalogue if spec.type != "histogram"}


def test_per_bucket_counts_from_cumulative_buckets() -> None:
    assert per_bucket((0.1, 1.0, math.inf), (1.0, 3.0, 4.0), 4.0) == ([0.1, 1.0], [1, 2, 1])
    assert per_bucket((0.1, 1.0), (1.0, 3.0), 5.0) == ([0.1, 1.0], [1, 2, 2])  # no +Inf: the count closes it
    assert per_bucket((1.0, math.inf), (3.4, 6.6), 6.6) == ([1.0], [3, 4])  # scaled counts are rounded


def test_a_counter_that_goes_down_starts_again_and_a_steady_one_keeps_its_start() -> None:
    spec = counter("kvscope_test_things_total", "", ("k",), "Things.", "test")
    store = Store(Catalogue([spec]), stale_after=1)
    clock = iter(range(1, 100))
    metrics = StoreMetrics(store, RESOURCE, SCOPE, clock_ns=lambda: next(clock))

    def starts() -> dict[str, tuple[int, float]]:
        (metric,) = by_name(metrics.collect()).values()
        return {p.attributes["k"]: (p.start_time_unix_nano, p.value) for p in metric.data.data_points}  # type: ignore[attr-defined]

    store.ingest("o", [Sample(spec.name, ("a",), 10.0), Sample(spec.name, ("b",), 5.0)], 0.0)
    assert starts() == {"a": (1, 10.0), "b": (1, 5.0)}
    store.ingest("o", [Sample(spec.name, ("a",), 12.0)], 0.0)  # b is gone and, at stale_after=1, forgotten
    assert starts() == {"a": (1, 12.0)}
    store.ingest("o", [Sample(spec.name, ("a",), 13.0), Sample(spec.name, ("b",), 2.0)], 0.0)  # b afresh: 2 < 5
    assert starts() == {"a": (1, 13.0), "b": (3, 2.0)}
    # between two exports b is forgotten and made again with a larger total: a new series all the same
    store.ingest("o", [Sample(spec.name, ("a",), 14.0)], 0.0)
    store.ingest("o", [Sample(spec.name, ("a",), 15.0), Sample(spec.name, ("b",), 9.0)], 0.0)
    assert starts() == {"a": (1, 15.0), "b": (4, 9.0)}


class Blocking(MetricExporter):
    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.calls = 0

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: object) -> MetricExportResult:
        self.calls += 1
        return MetricExportResult.SUCCESS if self.release.wait(5) else MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        self.release.set()


def test_a_blocked_export_holds_neither_the_store_nor_the_metrics_page(store: Store) -> None:
    exporter = Blocking()
    sink = OtlpMetricsSink(store, StoreMetrics(store, RESOURCE, SCOPE), exporter, interval=3600, timeout=5)
    sink.start()
    thread = threading.Thread(target=sink.export)
    thread.start()
    while not exporter.calls:
        time.sleep(0.01)
    started = time.monotonic()
    store.ingest("test", [Sample("kvscope_collector_up", ("x",), 1.0)], time.time())
    page = metrics_page(store)
    assert time.monotonic() - started < 1.0 and page
    exporter.release.set()
    thread.join(5)
    assert store.value(EXPORTS, ("metrics", "ok")) == 1.0
    sink.stop()
    assert store.value(EXPORTS, ("metrics", "ok")) == 2.0  # the last export as it stops
