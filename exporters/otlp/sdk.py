"""The OpenTelemetry SDK's side of kvscope's OTLP export: the resource and the exporters, built from the
resolved settings (exporters/otlp/settings.py). Needs the `otlp` extra (`otlp-grpc` for gRPC); imported only when
an OTLP exporter is enabled.

The SDK's exporters do the wire work: protobuf encoding, gzip, headers, TLS, and retries with
exponential backoff on connection errors and on 429/502/503/504 (gRPC: UNAVAILABLE and the like) until
the export's timeout. kvscope calls them from its own export threads only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from kvscope.agent.config import extras
from kvscope.exporters.otlp.settings import Destination, resource_attributes


def scope(version: str) -> InstrumentationScope:
    return InstrumentationScope("kvscope", version)


def resource(environ: Mapping[str, str], version: str) -> Resource:
    """kvscope's resource: service.*, the pod identity, OTEL_RESOURCE_ATTRIBUTES; plus telemetry.sdk.*."""
    return Resource.create(resource_attributes(environ, version))


def _grpc_args(dest: Destination) -> dict[str, Any]:
    extras.require("otlp-grpc", "exporters.otlp with protocol grpc")
    import grpc

    credentials = None
    if dest.certificate and not dest.insecure:
        with open(dest.certificate, "rb") as fh:
            credentials = grpc.ssl_channel_credentials(root_certificates=fh.read())
    return {"endpoint": dest.endpoint, "insecure": dest.insecure, "credentials": credentials, "headers": dest.headers,
            "timeout": dest.timeout,
            "compression": grpc.Compression.Gzip if dest.compression == "gzip" else grpc.Compression.NoCompression}


def _http_args(dest: Destination) -> dict[str, Any]:
    from opentelemetry.exporter.otlp.proto.http import Compression

    return {"endpoint": dest.endpoint, "certificate_file": dest.certificate or None, "headers": dest.headers,
            "timeout": dest.timeout,
            "compression": Compression.Gzip if dest.compression == "gzip" else Compression.NoCompression}


def metric_exporter(dest: Destination) -> MetricExporter:
    if dest.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetrics

        return GrpcMetrics(**_grpc_args(dest))
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    return OTLPMetricExporter(**_http_args(dest))


def span_exporter(dest: Destination) -> SpanExporter:
    if dest.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpans

        return GrpcSpans(**_grpc_args(dest))
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(**_http_args(dest))
