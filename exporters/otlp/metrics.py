"""Metrics over OTLP: the store, the same one `/metrics` renders, as OpenTelemetry metric data.

The store already holds aggregated data (kvscope's monotonic totals, cumulative histogram buckets), so
it is bridged the way the OTel specification's MetricProducer bridges a third-party source: one
snapshot per export, turned into the SDK's `MetricsData` and handed to the SDK's OTLP exporter. SDK
instruments would not do: the OTel API has no asynchronous histogram, and one observable callback
per metric would take the store's lock once per metric instead of once per export, and would not
give one consistent cut of the store (the values `/metrics` shows at the same moment).

Names, units and types come from exporters/otlp/names.py. Counters are cumulative monotonic sums; their start
time is when this exporter first saw the series, and moves to the current export when the store made the
series again (forgotten and back, docs/store.md: its total began anew), so a backend sees a reset.
Histograms become explicit-bucket histograms: OTLP wants per-bucket counts where the store keeps
cumulative ones, and integers (a fractional count, from a scaled histogram, is rounded).

`OtlpMetricsSink` exports on its own thread every interval. The store's lock is held only while the
snapshot is copied; an export that is slow or failing holds nothing but that thread.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import cast

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from kvscope.agent.core.catalogue import MetricSpec
from kvscope.agent.core.readings import LabelValues
from kvscope.agent.core.store import Store
from kvscope.exporters.otlp.names import OtelMetric, otel_metric
from kvscope.exporters.otlp.settings import ExportCounter

log = logging.getLogger("kvscope.otlp")

STOP_GRACE = 2.0  # seconds stop() waits for a last export before it lets the thread go
_UNKNOWN = cast(float, None)  # histogram min/max: the store keeps none; None leaves the OTLP fields unset

# (labels, value, bounds, cumulative buckets, sum): one series as copied under the store's lock
_Copy = tuple[LabelValues, float, tuple[float, ...], tuple[float, ...], float, int]  # ..., born


def per_bucket(bounds: tuple[float, ...], cumulative: tuple[float, ...], count: float) -> tuple[list[float], list[int]]:
    """(explicit bounds, per-bucket counts) from Prometheus-style cumulative buckets (`le`, +Inf last)."""
    if bounds and math.isinf(bounds[-1]):
        explicit, totals = list(bounds[:-1]), [round(c) for c in cumulative]
    else:
        explicit, totals = list(bounds), [*(round(c) for c in cumulative), round(count)]
    counts = [max(0, c - p) for c, p in zip(totals, [0, *totals[:-1]], strict=True)]
    return explicit, counts


class StoreMetrics:
    """Turns the store into `MetricsData`, one consistent snapshot per `collect()`."""

    def __init__(self, store: Store, resource: Resource, scope: InstrumentationScope,
                 clock_ns: Callable[[], int] = time.time_ns) -> None:
        self._store = store
        self._resource = resource
        self._scope = scope
        self._clock_ns = clock_ns
        self._otel: dict[str, OtelMetric] = {spec.name: otel_metric(spec) for spec in store.catalogue}
        # series -> (start time, the making of it that started then, store.Series.born): a cumulative point's
        # start moves when the store forgot the series and made it again (its total began anew)
        self._starts: dict[tuple[str, LabelValues], tuple[int, int]] = {}

    def _snapshot(self) -> list[tuple[MetricSpec, list[_Copy]]]:
        return [(spec, [(s.labels, s.value, s.bounds, tuple(s.buckets), s.hist_sum, s.born) for s in group])
                for spec, group in self._store.families()]

    def _start(self, key: tuple[str, LabelValues], born: int, now: int,
               seen: dict[tuple[str, LabelValues], tuple[int, int]]) -> int:
        start, started = self._starts.get(key, (now, born))
        if born != started:
            start = now
        seen[key] = (start, born)
        return start

    def collect(self) -> MetricsData:
        snapshot = self._snapshot()
        now = self._clock_ns()
        seen: dict[tuple[str, LabelValues], tuple[int, int]] = {}
        metrics = []
        for spec, series in snapshot:
            otel = self._otel[spec.name]
            data: Sum | Gauge | Histogram
            if otel.kind == "histogram":
                points = []
                for labels, count, bounds, buckets, total, born in series:
                    explicit, counts = per_bucket(bounds, buckets, count)
                    points.append(HistogramDataPoint(
                        attributes=dict(zip(spec.labels, labels, strict=True)),
                        start_time_unix_nano=self._start((spec.name, labels), born, now, seen),
                        time_unix_nano=now, count=sum(counts), sum=total, bucket_counts=counts,
                        explicit_bounds=explicit, min=_UNKNOWN, max=_UNKNOWN))
                data = Histogram(points, AggregationTemporality.CUMULATIVE)
            else:
                numbers = [NumberDataPoint(
                    attributes=dict(zip(spec.labels, labels, strict=True)),
                    start_time_unix_nano=self._start((spec.name, labels), born, now, seen) if otel.monotonic else 0,
                    time_unix_nano=now, value=value) for labels, value, _, _, _, born in series]
                data = Sum(numbers, AggregationTemporality.CUMULATIVE, True) if otel.kind == "sum" else Gauge(numbers)
            metrics.append(Metric(otel.name, spec.help, otel.unit, data))
        self._starts = seen  # a series no longer exported is forgotten here too
        return MetricsData([ResourceMetrics(self._resource, [ScopeMetrics(self._scope, metrics, "")], "")])


class OtlpMetricsSink:
    """A sink: exports the store every `interval` seconds on its own thread; counts each export's result."""

    def __init__(self, store: Store, metrics: StoreMetrics, exporter: MetricExporter, interval: float,
                 timeout: float, wall_clock: Callable[[], float] = time.time,
                 refresh: Callable[[], None] | None = None) -> None:
        self._metrics = metrics
        self._refresh = refresh  # the scheduler's: collects what is collected when read, before an export
        self._exporter = exporter
        self._interval = interval
        self._timeout = timeout
        self._counter = ExportCounter(store, "metrics", wall_clock)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._counter.start()
        self._thread = threading.Thread(target=self._loop, name="otlp-metrics", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stopping.wait(self._interval):
            self.export()
        self.export()  # the last values, as the agent stops

    def export(self) -> bool:
        """One export of the whole store; True when the endpoint took it."""
        if self._refresh is not None:
            self._refresh()
        try:
            ok = self._exporter.export(self._metrics.collect(), timeout_millis=self._timeout * 1000) \
                == MetricExportResult.SUCCESS
        except Exception:  # an exporter bug must not end the thread: counted and logged like a failure
            log.exception("OTLP metrics export raised")
            ok = False
        self._counter.count(ok)
        return ok

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(STOP_GRACE)  # the last export, if the endpoint answers in time
        self._exporter.shutdown()  # aborts retries still waiting; a request in flight ends at its timeout
        if self._thread is not None:
            self._thread.join(0.5)
