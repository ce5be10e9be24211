"""One `llm_request` span per request, as vLLM's OutputProcessor emits it (shared/facts/vllm.md §3).

Kind SERVER, start = arrival, end = finish, attributes gen_ai.latency.* (seconds) and gen_ai.usage.*;
a W3C traceparent on the HTTP request becomes the parent. Exported with the SDK's OTLP/HTTP exporter
through a BatchSpanProcessor on a provider of our own (no global state), only when an endpoint is set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any


class RequestTracer:
    def __init__(self, endpoint: str, exporter: Any = None) -> None:
        """`endpoint`: the collector's base URL (http://host:4318) or its full /v1/traces URL.
        `exporter`: a SpanExporter to use instead (tests pass an in-memory one)."""
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            url = endpoint if endpoint.rstrip("/").endswith("/v1/traces") else endpoint.rstrip("/") + "/v1/traces"
            exporter = OTLPSpanExporter(endpoint=url)
            processor: Any = BatchSpanProcessor(exporter)
        else:
            processor = SimpleSpanProcessor(exporter)
        resource = Resource.create({"service.name": "vllm", "vllm.instrumenting_module_name": "vllm.llm_engine",
                                    "vllm.process_id": os.getpid()})
        self.provider = TracerProvider(resource=resource)
        self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("vllm.llm_engine")
        self.propagator = TraceContextTextMapPropagator()

    def record(self, headers: Mapping[str, str], start_ns: int, end_ns: int, attributes: dict[str, Any]) -> None:
        from opentelemetry.trace import SpanKind

        parent = self.propagator.extract(carrier={k.lower(): v for k, v in headers.items()})
        span = self.tracer.start_span("llm_request", context=parent, kind=SpanKind.SERVER, start_time=start_ns,
                                      attributes=attributes)
        span.end(end_time=end_ns)

    def close(self) -> None:
        self.provider.shutdown()


def span_attributes(request_id: str, ttft: float, e2e: float, queue: float, prefill: float, decode: float,
                    prompt_tokens: int, completion_tokens: int, max_tokens: int,
                    temperature: float | None, top_p: float | None, cached_tokens: int | None = None,
                    fetch_seconds: float | None = None, offload_seconds: float | None = None) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "gen_ai.request.id": request_id,
        "gen_ai.latency.time_to_first_token": ttft,
        "gen_ai.latency.e2e": e2e,
        "gen_ai.latency.time_in_queue": queue,
        "gen_ai.latency.time_in_model_prefill": prefill,
        "gen_ai.latency.time_in_model_decode": decode,
        "gen_ai.latency.time_in_model_inference": prefill + decode,
        "gen_ai.usage.prompt_tokens": prompt_tokens,
        "gen_ai.usage.completion_tokens": completion_tokens,
    }
    # vLLM sets these only when truthy
    for key, value in (("gen_ai.request.max_tokens", max_tokens), ("gen_ai.request.temperature", temperature),
                       ("gen_ai.request.top_p", top_p), ("gen_ai.request.n", 1)):
        if value:
            attrs[key] = value
    # kvscope's own (vLLM's span has no reuse or load time): what the otlp_traces receiver reads
    if cached_tokens is not None:
        attrs["kvscope.kv.cached_tokens"] = cached_tokens
    if fetch_seconds is not None:
        attrs["kvscope.kv.fetch_seconds"] = fetch_seconds
    if offload_seconds is not None:
        attrs["kvscope.kv.offload_seconds"] = offload_seconds
    return attrs
