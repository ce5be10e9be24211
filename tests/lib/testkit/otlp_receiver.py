"""Test side of OTLP export: a receiver that decodes with opentelemetry-proto, and the way back to Prometheus.

No OpenTelemetry Collector with an OTLP receiver can be had from our package registries
(shared/facts/dashboards.md), so the tests stand one in: an OTLP/HTTP server (stdlib) and an OTLP/gRPC
server (grpcio, the services opentelemetry-proto generates) that decode every payload and keep it.

`prometheus_samples` turns received metrics into the samples a Prometheus-compatible backend would hold,
following the OpenTelemetry ↔ Prometheus compatibility rules independently of kvscope's own mapping:
unit appended unless the name has it ({annotations} dropped, `1` is `ratio` for gauges), `_total` for
monotonic sums, cumulative `_bucket{le}` with +Inf, `_count` and `_sum` for histograms.
"""

from __future__ import annotations

import gzip
import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric
from opentelemetry.proto.trace.v1.trace_pb2 import Span

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

_UNIT_WORDS = {"By": "bytes", "s": "seconds", "By/s": "bytes_per_second", "ms": "milliseconds"}


def prometheus_name(name: str, unit: str, kind: str, monotonic: bool) -> str:
    """The name an OTLP metric gets in Prometheus (compatibility spec, OTLP → Prometheus)."""
    word = "" if unit.startswith("{") or not unit else ("ratio" if unit == "1" else _UNIT_WORDS.get(unit, unit))
    if word == "ratio" and kind != "gauge":
        word = ""
    if word and not name.endswith(f"_{word}") and f"_{word}_" not in f"{name}_":
        name = f"{name}_{word}"
    return f"{name}_total" if kind == "sum" and monotonic else name


def _labels(attributes: Any) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((kv.key, kv.value.string_value) for kv in attributes))


def _number(point: Any) -> float:
    return float(point.as_double if point.WhichOneof("value") == "as_double" else point.as_int)


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def prometheus_samples(metrics: list[Metric]) -> Samples:
    out: Samples = {}
    for metric in metrics:
        kind = metric.WhichOneof("data")
        name = prometheus_name(metric.name, metric.unit, kind or "", kind == "sum" and metric.sum.is_monotonic)
        if kind in ("sum", "gauge"):
            for point in getattr(metric, kind).data_points:
                out[(name, _labels(point.attributes))] = _number(point)
            continue
        assert kind == "histogram", kind
        for point in metric.histogram.data_points:
            labels = _labels(point.attributes)
            running = 0
            for bound, count in zip([*point.explicit_bounds, math.inf], point.bucket_counts, strict=True):
                running += count
                out[(f"{name}_bucket", tuple(sorted((*labels, ("le", _le(bound))))))] = float(running)
            out[(f"{name}_count", labels)] = float(point.count)
            out[(f"{name}_sum", labels)] = point.sum
    return out


class Received:
    """What a test receiver got, decoded; `hold` makes it answer only once released (a slow collector)."""

    def __init__(self) -> None:
        self.metrics: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.traces: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.lock = threading.Lock()
        self.hold: threading.Event | None = None

    def take(self, path: str, body: bytes) -> bool:
        if self.hold is not None:
            self.hold.wait(30)  # bounded: the test releases it at teardown
        if path.endswith("/v1/metrics"):
            metrics = metrics_service_pb2.ExportMetricsServiceRequest()
            metrics.ParseFromString(body)
            with self.lock:
                self.metrics.append(metrics)
        elif path.endswith("/v1/traces"):
            spans = trace_service_pb2.ExportTraceServiceRequest()
            spans.ParseFromString(body)
            with self.lock:
                self.traces.append(spans)
        else:
            return False
        return True

    def spans(self) -> list[Span]:
        with self.lock:
            return [s for r in self.traces for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]

    def last_metrics(self) -> list[Metric]:
        with self.lock:
            last = self.metrics[-1]
        return [m for rm in last.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]


class HttpReceiver:
    """OTLP/HTTP (protobuf, gzip or not) on 127.0.0.1, in a thread."""

    def __init__(self) -> None:
        self.received = Received()
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                ok = received.take(self.path, body)
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        if self.received.hold is not None:
            self.received.hold.set()
        self.server.shutdown()
        self.server.server_close()


class GrpcReceiver:
    """OTLP/gRPC (plain text) on 127.0.0.1 with opentelemetry-proto's generated services."""

    def __init__(self) -> None:
        import grpc

        self.received = received = Received()

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):  # type: ignore[misc]
            def Export(self, request: Any, context: Any) -> Any:
                received.take("/v1/metrics", request.SerializeToString())
                return metrics_service_pb2.ExportMetricsServiceResponse()

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
            def Export(self, request: Any, context: Any) -> Any:
                received.take("/v1/traces", request.SerializeToString())
                return trace_service_pb2.ExportTraceServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), self.server)
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.url = f"http://127.0.0.1:{port}"

    def close(self) -> None:
        self.server.stop(grace=None)


def wait_for(condition: Callable[[], Any], timeout: float = 10.0, step: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"not within {timeout} s")


def iter_spans(received: Received, name: str) -> Iterator[Span]:
    return (s for s in received.spans() if s.name == name)
