"""OTLP/HTTP trace receiver: vLLM's per-request `llm_request` spans become request records.

vLLM exports one span per finished request (shared/facts/vllm.md §3) with `--otlp-traces-endpoint`
and `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`; point it at this receiver
(`http://localhost:4318/v1/traces`; loopback by default, TLS and basic auth as for /metrics: docs/security.md).
Each `llm_request` span gives TTFT, queue time, prefill time and
the prompt length; the records go to the shared RecordBuffer the correlation engine drains. vLLM's span
carries no cached-token or KV-tier attribute, so three attributes of kvscope's own are read where a
source sets them (the reference pipeline does): `kvscope.kv.cached_tokens`, `kvscope.kv.fetch_seconds` and
`kvscope.kv.offload_seconds` (eviction and store work inside the prefill phase).

Decoding is a pure function of the body (`decode_export`); the HTTP side only enforces limits:
a body over `max_body_bytes` (also after gzip/deflate decompression) is refused with 413, an unknown
content type with 415, an undecodable body with 400, a malformed request with 400 (or the status
agent/http/messages.py gives it), missing or wrong credentials with 401 — each counted, none can stop
the agent. Connections, threads and timeouts are agent/http/server.py's, bounded by the `http` table.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import threading
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from kvscope.agent.config.settings import parse_listen
from kvscope.agent.core.catalogue import counter
from kvscope.agent.core.pipeline import CollectorContext, CollectorSpec
from kvscope.agent.core.readings import Reading, Sample
from kvscope.agent.core.records import RecordBuffer, RequestRecord
from kvscope.agent.core.streams import REQUEST_RECORDS, StreamUse
from kvscope.agent.http.messages import Request, Response
from kvscope.agent.http.server import HttpLimits, HttpServer
from kvscope.agent.http.webconfig import WebConfig, load_web_config

log = logging.getLogger("kvscope.collectors.otlp_traces")

SPAN_NAME = "llm_request"
TTFT = "gen_ai.latency.time_to_first_token"
QUEUE = "gen_ai.latency.time_in_queue"
PREFILL = "gen_ai.latency.time_in_model_prefill"
PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
REQUEST_ID = "gen_ai.request.id"
MODEL_ATTRS = ("gen_ai.response.model", "gen_ai.request.model")  # not set by vLLM 0.33; used when present
CACHED_TOKENS = "kvscope.kv.cached_tokens"
FETCH_SECONDS = "kvscope.kv.fetch_seconds"
OFFLOAD_SECONDS = "kvscope.kv.offload_seconds"

PROTOBUF, JSON = "application/x-protobuf", "application/json"

EXPORTS = "kvscope_otlp_export_requests_total"
SPANS = "kvscope_otlp_spans_total"
RECEIVED = "kvscope_otlp_received_bytes_total"

METRICS = (
    counter(EXPORTS, "requests", ("result",),
            "OTLP/HTTP export requests to /v1/traces by result: ok, bad_body, too_large, unsupported_type, "
            "not_found, bad_request (malformed HTTP), unauthorized (basic auth refused or not checked: too "
            "many password checks in flight).", "otlp_traces receiver"),
    counter(SPANS, "", ("result",),
            "Spans received by result: accepted (an llm_request span became a record), rejected (an "
            "llm_request span with missing or invalid latency attributes), ignored (other spans).",
            "otlp_traces receiver"),
    counter(RECEIVED, "bytes", (), "Request body bytes received on /v1/traces (as sent, before decompression).",
            "otlp_traces receiver"),
)


@dataclass
class OtlpTracesOptions:
    # the OTLP/HTTP default port, on loopback: the engine runs in the same pod. Anyone who reaches the
    # receiver can inject request records, so a wider address wants the web config's TLS or basic auth.
    listen: str = "127.0.0.1:4318"
    web_config_file: str = ""  # exporter-toolkit web config (TLS, basic auth), as for /metrics; "" = plain
    max_body_bytes: int = 8 * 1024 * 1024  # per export request, compressed and decompressed
    engine: str = "vllm"  # the `engine` label of the records
    model: str = ""  # the `model` label when the span does not name one (vLLM 0.33 does not)
    dp_rank: str = "0"
    http: HttpLimits = field(default_factory=HttpLimits)  # connections, threads and timeouts

    def validate(self, path: str) -> None:
        parse_listen(f"{path}.listen", self.listen)
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        self.http.validate(f"{path}.http")


@dataclass(frozen=True, slots=True)
class Labels:
    engine: str = "vllm"
    model: str = ""
    dp_rank: str = "0"


@dataclass(slots=True)
class Decoded:
    records: list[RequestRecord] = field(default_factory=list)
    rejected: int = 0
    ignored: int = 0


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return None if kind is None else getattr(any_value, kind)


def _number(attrs: dict[str, Any], key: str) -> float | None:
    value = attrs.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def span_record(span: Any, labels: Labels) -> RequestRecord | None:
    """An `llm_request` span as a record; None when TTFT is missing or a latency is invalid."""
    attrs = {kv.key: _value(kv.value) for kv in span.attributes}
    ttft = _number(attrs, TTFT)
    if ttft is None:
        return None
    durations = {key: _number(attrs, key) for key in (QUEUE, PREFILL, FETCH_SECONDS, OFFLOAD_SECONDS)}
    if any(key in attrs and durations[key] is None for key in durations):
        return None
    prompt, cached = _number(attrs, PROMPT_TOKENS), _number(attrs, CACHED_TOKENS)
    model = next((str(attrs[k]) for k in MODEL_ATTRS if isinstance(attrs.get(k), str) and attrs[k]), labels.model)
    request_id = attrs.get(REQUEST_ID)
    return RequestRecord(
        request_id=str(request_id) if request_id else span.span_id.hex(),
        engine=labels.engine, model=model, dp_rank=labels.dp_rank,
        arrival=span.start_time_unix_nano / 1e9, ttft=ttft,
        prompt_tokens=None if prompt is None else int(prompt),
        cached_tokens=None if cached is None else int(cached),
        queue=durations[QUEUE], prefill=durations[PREFILL], fetch_seconds=durations[FETCH_SECONDS],
        offload_seconds=durations[OFFLOAD_SECONDS],
        source="otlp", trace_id=_span_id(span.trace_id, 16), span_id=_span_id(span.span_id, 8),
    )


def _span_id(raw: bytes, size: int) -> bytes | None:
    """A W3C trace or span id as sent; None when absent or invalid (wrong length, all zero)."""
    return bytes(raw) if len(raw) == size and any(raw) else None


# OTLP/JSON writes trace and span ids as hex (the OTLP spec's exception to protobuf's JSON mapping, which
# would read bytes fields as base64): field -> length in hex digits.
_HEX_IDS = {"traceId": 32, "spanId": 16, "parentSpanId": 16}


def _hex_ids_to_base64(tree: Any) -> Any:
    """The request with every hex id of a span (and of its links) turned into the base64 protobuf expects.
    A value that is not hex of the right length is left for the parser (a base64-writing client's)."""
    if not isinstance(tree, dict):
        return tree
    for resource_spans in tree.get("resourceSpans") or ():
        for scope_spans in (resource_spans.get("scopeSpans") or ()) if isinstance(resource_spans, dict) else ():
            for span in (scope_spans.get("spans") or ()) if isinstance(scope_spans, dict) else ():
                if isinstance(span, dict):
                    for item in (span, *(link for link in span.get("links") or () if isinstance(link, dict))):
                        for key, digits in _HEX_IDS.items():
                            value = item.get(key)
                            if isinstance(value, str) and len(value) == digits and _is_hex(value):
                                item[key] = base64.b64encode(bytes.fromhex(value)).decode("ascii")
    return tree


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdefABCDEF" for c in text)


def decode_export(body: bytes, content_type: str, labels: Labels) -> Decoded:
    """Decode an ExportTraceServiceRequest (protobuf or OTLP JSON). Raises ValueError on a bad body."""
    request = ExportTraceServiceRequest()
    try:
        if content_type == PROTOBUF:
            request.ParseFromString(body)
        elif content_type == JSON:
            tree = json.loads(body.decode("utf-8"))
            if not isinstance(tree, dict):
                raise ValueError(f"an OTLP/JSON export is an object, not {type(tree).__name__}")
            json_format.ParseDict(_hex_ids_to_base64(tree), request, ignore_unknown_fields=True)
        else:
            raise ValueError(f"unsupported content type {content_type!r}")
    except (DecodeError, json_format.ParseError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ValueError(f"undecodable body: {type(exc).__name__}: {str(exc)[:200]}") from None
    out = Decoded()
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                if span.name != SPAN_NAME:
                    out.ignored += 1
                    continue
                record = span_record(span, labels)
                if record is None:
                    out.rejected += 1
                else:
                    out.records.append(record)
    return out


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """gzip/deflate with a ceiling on the output, so a small compressed body cannot blow up memory."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise ValueError(f"unsupported content encoding {encoding!r}")
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise ValueError(f"bad {encoding} body: {exc}") from None
    if len(data) > limit:
        raise OverflowError
    return data


class OtlpTracesReceiver:
    def __init__(self, options: OtlpTracesOptions, records: RecordBuffer, web: WebConfig | None = None) -> None:
        self._options = options
        self._records = records
        self._web = web or WebConfig()
        self._labels = Labels(options.engine, options.model, options.dp_rank)
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, tuple[str, ...]], float] = {}
        self._server: HttpServer | None = None
        self._logged: set[str] = set()

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None
        return self._server.address

    def start(self) -> None:
        host, port = parse_listen("listen", self._options.listen)  # validated by the options; port 0 in tests
        self._server = HttpServer("otlp", host, port, self.handle, limits=self._options.http, web=self._web,
                                  max_body_bytes=self._options.max_body_bytes, refused=self._refused)
        self._server.start()

    def reload(self) -> None:
        """Re-reads the web config file (SIGHUP); raises ConfigError and keeps the old one when it is wrong."""
        web = load_web_config(self._options.web_config_file)
        self._web = web
        if self._server is not None:
            self._server.reload(web)

    def _refused(self, reason: str) -> None:
        """A request the HTTP server answered itself, before it reached `handle` (agent/http/server.py's
        refusal_reason: bad_request, too_large, unauthorized)."""
        self._add((EXPORTS, (reason,)), 1)

    def handle(self, request: Request) -> Response:
        """One request, its body read and bounded by the server. Never raises."""
        headers = request.headers
        ctype = (headers.get("content-type") or "").split(";")[0].strip().lower()
        if request.path != "/v1/traces":
            return self._refuse("not_found", 404, "only /v1/traces is served")
        if request.method != "POST":
            return self._refuse("bad_request", 405, "only POST is served", [("Allow", "POST")])
        if headers.get("content-length") is None and headers.get("transfer-encoding") is None:
            return self._refuse("bad_body", 411, "Content-Length is required")
        body = request.body
        self._add((RECEIVED, ()), len(body))
        if ctype not in (PROTOBUF, JSON):
            return self._refuse("unsupported_type", 415, f"content type {ctype!r}: use {PROTOBUF} or {JSON}")
        try:
            data = decompress(body, headers.get("content-encoding") or "", self._options.max_body_bytes)
            decoded = decode_export(data, ctype, self._labels)
        except OverflowError:
            return self._refuse("too_large", 413, "decompressed body over the limit")
        except ValueError as exc:
            return self._refuse("bad_body", 400, str(exc))
        self._records.put(decoded.records)
        self._add((EXPORTS, ("ok",)), 1)
        self._add((SPANS, ("accepted",)), len(decoded.records))
        self._add((SPANS, ("rejected",)), decoded.rejected)
        self._add((SPANS, ("ignored",)), decoded.ignored)
        response = ExportTraceServiceResponse()
        if decoded.rejected:
            response.partial_success.rejected_spans = decoded.rejected
            response.partial_success.error_message = f"{decoded.rejected} llm_request spans lacked valid latencies"
            self._log_once("rejected", "otlp_traces: llm_request spans without valid gen_ai.latency.* "
                                       "attributes are rejected (counted in kvscope_otlp_spans_total)")
        if ctype == JSON:
            return Response(200, json_format.MessageToJson(response).encode(), JSON)
        return Response(200, response.SerializeToString(), PROTOBUF)

    def _refuse(self, result: str, status: int, message: str,
                headers: list[tuple[str, str]] | None = None) -> Response:
        self._add((EXPORTS, (result,)), 1)
        self._log_once(result, f"otlp_traces: refusing an export ({status}): {message}")
        return Response(status, message.encode(), "text/plain; charset=utf-8", headers or [])

    def _add(self, key: tuple[str, tuple[str, ...]], by: float) -> None:
        with self._lock:
            self._counts[key] = self._counts.get(key, 0.0) + by

    def _log_once(self, kind: str, message: str) -> None:
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning("%s (logged once)", message)

    def collect(self) -> Iterable[Reading]:
        with self._lock:
            return [Sample(name, labels, value) for (name, labels), value in self._counts.items()]

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        else:
            self._web.close()


def build(options: OtlpTracesOptions, context: CollectorContext) -> OtlpTracesReceiver:
    return OtlpTracesReceiver(options, context.streams.require(REQUEST_RECORDS),
                              load_web_config(options.web_config_file))


SPEC = CollectorSpec(
    name="otlp_traces",
    description="OTLP/HTTP receiver on 127.0.0.1:4318 /v1/traces: vLLM llm_request spans -> per-request TTFT "
                "records",
    options=OtlpTracesOptions,
    factory=build,
    metrics=METRICS,
    enabled_by_default=False,
    streams=StreamUse(writes=(REQUEST_RECORDS,)),
)
