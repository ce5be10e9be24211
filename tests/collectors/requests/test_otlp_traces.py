"""The OTLP/HTTP trace receiver: the literal fixture, real HTTP with the SDK's exporter, and limits."""

from __future__ import annotations

import gzip
import io
import json
import urllib.error
import urllib.request

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from kvscope.agent.core.pipeline import CollectorContext
from kvscope.agent.core.records import RecordBuffer
from kvscope.agent.core.streams import REQUEST_RECORDS
from kvscope.collectors.requests.otlp_traces import (
    EXPORTS,
    PROTOBUF,
    SPANS,
    SPEC,
    Labels,
    OtlpTracesOptions,
    OtlpTracesReceiver,
    build,
    decode_export,
)
from testkit.paths import FIXTURES
from testkit.stages import streams_for

FIXTURE = FIXTURES / "correlation" / "otlp" / "llm_request.binpb"


def counts(receiver: OtlpTracesReceiver) -> dict[tuple[str, tuple[str, ...]], float]:
    return {(r.name, r.labels): r.value for r in receiver.collect()}  # type: ignore[union-attr]


def test_fixture_decodes_to_records() -> None:
    decoded = decode_export(FIXTURE.read_bytes(), PROTOBUF, Labels("vllm", "fallback", "0"))
    assert decoded.rejected == 1 and decoded.ignored == 1
    by_id = {r.request_id: r for r in decoded.records}
    assert sorted(by_id) == ["cmpl-a1", "cmpl-a2", "cmpl-a3"]
    a3 = by_id["cmpl-a3"]
    assert a3.ttft == 32.14 and a3.queue == 0.001 and a3.prefill == 32.12 and a3.prompt_tokens == 130_000
    assert a3.model == "openai/gpt-oss-120b" and a3.engine == "vllm" and a3.source == "otlp"
    assert a3.cached_tokens is None  # vLLM's span does not say
    assert a3.arrival == pytest.approx(1_796_056_570.0)


def test_bad_bodies_raise_value_error() -> None:
    with pytest.raises(ValueError):
        decode_export(b"\xff\xff\xff not protobuf", PROTOBUF, Labels())
    with pytest.raises(ValueError):
        decode_export(b"{}", "text/plain", Labels())


def test_otlp_json_is_accepted() -> None:
    body = (b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"name":"llm_request","spanId":"AAAAAAAAAAE=",'
            b'"startTimeUnixNano":"1000000000","attributes":['
            b'{"key":"gen_ai.latency.time_to_first_token","value":{"doubleValue":0.25}},'
            b'{"key":"gen_ai.latency.time_in_queue","value":{"doubleValue":-1}}]},'
            b'{"name":"llm_request","spanId":"AAAAAAAAAAI=","startTimeUnixNano":"2000000000","attributes":['
            b'{"key":"gen_ai.latency.time_to_first_token","value":{"doubleValue":0.5}},'
            b'{"key":"gen_ai.usage.prompt_tokens","value":{"intValue":"77"}}]}]}]}]}')
    decoded = decode_export(body, "application/json", Labels())
    assert decoded.rejected == 1  # a negative queue time
    (record,) = decoded.records
    assert record.ttft == 0.5 and record.prompt_tokens == 77 and record.arrival == 2.0
    assert record.request_id == "0000000000000002"


def test_otlp_json_ids_are_hex_as_the_otlp_spec_writes_them() -> None:
    """OTLP/JSON encodes traceId/spanId as hex, not protobuf-JSON's base64: the record keeps the real ids, so
    kvscope's attribution span can be parented to the engine's span."""
    trace, span = "5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174"
    spans = [{"name": "llm_request", "traceId": trace, "spanId": span, "startTimeUnixNano": "1000000000",
              "attributes": [{"key": "gen_ai.latency.time_to_first_token", "value": {"doubleValue": 0.25}}]}]
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]})
    (record,) = decode_export(body.encode(), "application/json", Labels()).records
    assert record.trace_id == bytes.fromhex(trace) and record.span_id == bytes.fromhex(span)
    nested = b'{"resourceSpans":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(ValueError):
        decode_export(nested, "application/json", Labels())
    for not_an_object in (b"0", b'"x"', b"[]", b"null"):
        with pytest.raises(ValueError):
            decode_export(not_an_object, "application/json", Labels())


@pytest.fixture
def receiver() -> OtlpTracesReceiver:
    rx = OtlpTracesReceiver(OtlpTracesOptions(listen="127.0.0.1:0", max_body_bytes=64 * 1024), RecordBuffer())
    rx.start()
    yield rx
    rx.close()


@pytest.mark.integration
@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_real_sdk_exporter_over_http(compression: str) -> None:
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import SpanKind

    options = OtlpTracesOptions(listen="127.0.0.1:0", model="served")
    context = CollectorContext(streams=streams_for(SPEC.streams, options))
    rx = build(options, context)
    rx.start()
    try:
        host, port = rx.address
        wire = Compression.Gzip if compression == "gzip" else Compression.NoCompression
        exporter = OTLPSpanExporter(endpoint=f"http://{host}:{port}/v1/traces", compression=wire)
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("vllm.llm_engine")
        span = tracer.start_span("llm_request", kind=SpanKind.SERVER, start_time=5_000_000_000)
        span.set_attributes({"gen_ai.latency.time_to_first_token": 0.8, "gen_ai.latency.time_in_queue": 0.1,
                             "gen_ai.latency.time_in_model_prefill": 0.6, "gen_ai.usage.prompt_tokens": 4096,
                             "gen_ai.request.id": "cmpl-xyz", "kvscope.kv.cached_tokens": 2048,
                             "kvscope.kv.fetch_seconds": 0.2, "kvscope.kv.offload_seconds": 0.05})
        span.end(end_time=6_000_000_000)
        tracer.start_span("Warmup (GPU)").end()
        provider.shutdown()
        buffer = context.streams.require(REQUEST_RECORDS)
        (record,) = buffer.drain()
        assert (record.request_id, record.ttft, record.queue, record.prefill) == ("cmpl-xyz", 0.8, 0.1, 0.6)
        assert record.prompt_tokens == 4096 and record.cached_tokens == 2048 and record.model == "served"
        assert (record.fetch_seconds, record.offload_seconds) == (0.2, 0.05)
        c = counts(rx)
        assert c[(EXPORTS, ("ok",))] == 2 and c[(SPANS, ("accepted",))] == 1 and c[(SPANS, ("ignored",))] == 1
    finally:
        rx.close()


def post(rx: OtlpTracesReceiver, body: bytes, ctype: str = PROTOBUF, path: str = "/v1/traces",
         encoding: str = "") -> tuple[int, bytes]:
    host, port = rx.address
    headers = {"Content-Type": ctype, **({"Content-Encoding": encoding} if encoding else {})}
    request = urllib.request.Request(f"http://{host}:{port}{path}", data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


@pytest.mark.integration
def test_fixture_over_http_reports_partial_success(receiver: OtlpTracesReceiver) -> None:
    status, body = post(receiver, FIXTURE.read_bytes())
    assert status == 200
    response = ExportTraceServiceResponse.FromString(body)
    assert response.partial_success.rejected_spans == 1
    assert counts(receiver)[(SPANS, ("rejected",))] == 1


@pytest.mark.integration
def test_limits_and_bad_input_are_counted_not_fatal(receiver: OtlpTracesReceiver) -> None:
    assert post(receiver, b"x" * (64 * 1024 + 1))[0] == 413
    bomb = io.BytesIO()
    with gzip.GzipFile(fileobj=bomb, mode="wb") as gz:
        gz.write(b"\0" * (1024 * 1024))
    assert post(receiver, bomb.getvalue(), encoding="gzip")[0] == 413
    assert post(receiver, b"garbage\xff\xfe", encoding="gzip")[0] == 400
    assert post(receiver, b"\xff\xff\xff")[0] == 400
    assert post(receiver, b"{}", ctype="text/plain")[0] == 415
    assert post(receiver, b"", path="/v1/metrics")[0] == 404
    assert post(receiver, FIXTURE.read_bytes())[0] == 200  # still serving
    c = counts(receiver)
    assert c[(EXPORTS, ("too_large",))] == 2 and c[(EXPORTS, ("bad_body",))] == 2
    assert c[(EXPORTS, ("unsupported_type",))] == 1 and c[(EXPORTS, ("not_found",))] == 1
    assert c[(EXPORTS, ("ok",))] == 1


def test_options_validation() -> None:
    from kvscope.agent.config.settings import ConfigError, bind
    with pytest.raises(ConfigError, match="listen"):
        bind(OtlpTracesOptions, {"listen": "nonsense"}, "collectors.otlp_traces")
    assert bind(OtlpTracesOptions, {}, "collectors.otlp_traces").listen == "127.0.0.1:4318"  # loopback by default
