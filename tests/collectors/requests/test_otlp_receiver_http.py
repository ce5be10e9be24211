"""The OTLP receiver's HTTP side: the web config's TLS and basic auth (with the real SDK exporter), and the
malformed or oversized requests the shared server refuses — each counted under the receiver's results."""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest

from kvscope.agent.core.pipeline import CollectorContext
from kvscope.agent.core.records import RecordBuffer
from kvscope.agent.core.streams import REQUEST_RECORDS
from kvscope.collectors.requests.otlp_traces import (
    EXPORTS,
    PROTOBUF,
    SPEC,
    OtlpTracesOptions,
    OtlpTracesReceiver,
    build,
)
from testkit.http import Certificate, basic, exchange, read_until_closed, self_signed
from testkit.paths import FIXTURES
from testkit.stages import streams_for

FIXTURE = FIXTURES / "correlation" / "otlp" / "llm_request.binpb"
LIMIT = 64 * 1024


def counts(receiver: OtlpTracesReceiver) -> dict[tuple[str, ...], float]:
    return {r.labels: r.value for r in receiver.collect() if r.name == EXPORTS}  # type: ignore[union-attr]


@pytest.fixture
def receiver() -> Iterator[OtlpTracesReceiver]:
    rx = OtlpTracesReceiver(OtlpTracesOptions(listen="127.0.0.1:0", max_body_bytes=LIMIT), RecordBuffer())
    rx.start()
    yield rx
    rx.close()


def head(length: bytes, extra: bytes = b"") -> bytes:
    return (b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            b"Content-Length: " + length + b"\r\n" + extra + b"\r\n")


@pytest.mark.parametrize(
    ("length", "status", "result"),
    [(b"-1", b"400", "bad_request"), (b"abc", b"400", "bad_request"),
     (str(2**62).encode(), b"413", "too_large"), (str(LIMIT + 1).encode(), b"413", "too_large")],
)
def test_unusable_content_lengths_are_refused_and_counted(receiver: OtlpTracesReceiver, length: bytes,
                                                          status: bytes, result: str) -> None:
    """Issue 11 #5: -1 read until EOF (RSS 37 -> 339 MB), abc logged a traceback, 2**62 a MemoryError."""
    _, port = receiver.address
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head(length) + b"\0" * 65536)
        start = time.monotonic()
        reply, closed = read_until_closed(sock, 3.0)
    assert reply.startswith(b"HTTP/1.1 " + status) and closed
    assert time.monotonic() - start < 2.0  # answered at once, not after reading to EOF
    assert counts(receiver) == {(result,): 1.0}


def test_chunked_exports_are_read_and_bounded(receiver: OtlpTracesReceiver) -> None:
    _, port = receiver.address
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    body = FIXTURE.read_bytes()
    conn.request("POST", "/v1/traces", body=iter([body[:100], body[100:]]), encode_chunked=True,
                 headers={"Content-Type": PROTOBUF})
    response = conn.getresponse()
    assert response.status == 200
    response.read()
    oversized = b"".join(b"8000\r\n" + b"x" * 0x8000 + b"\r\n" for _ in range(3))  # 3 x 32 KiB > 64 KiB
    reply, closed = exchange(port, b"POST /v1/traces HTTP/1.1\r\nContent-Type: application/x-protobuf\r\n"
                                   b"Transfer-Encoding: chunked\r\n\r\n" + oversized)
    assert reply.startswith(b"HTTP/1.1 413") and closed
    assert counts(receiver) == {("ok",): 1.0, ("too_large",): 1.0}


def test_expect_100_continue(receiver: OtlpTracesReceiver) -> None:
    """curl sends `Expect: 100-continue` before a body over 1 MiB and waits a second for the go-ahead."""
    _, port = receiver.address
    body = FIXTURE.read_bytes()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head(str(len(body)).encode(), b"Expect: 100-continue\r\nConnection: close\r\n"))
        assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        reply, _ = read_until_closed(sock, 3.0)
    assert reply.startswith(b"HTTP/1.1 200")


def test_a_get_is_refused_and_counted(receiver: OtlpTracesReceiver) -> None:
    _, port = receiver.address
    reply, _ = exchange(port, b"GET /v1/traces HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 405")
    assert counts(receiver) == {("bad_request",): 1.0}


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> Certificate:
    return self_signed(tmp_path_factory.mktemp("tls"))


def secured(certificate: Certificate, tmp_path: Path) -> tuple[OtlpTracesReceiver, RecordBuffer]:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"tls_server_config:\n  cert_file: {certificate.cert}\n  key_file: {certificate.key}\n"
                   f"basic_auth_users:\n  vllm: '{hashed}'\n")
    options = OtlpTracesOptions(listen="127.0.0.1:0", web_config_file=str(cfg))
    context = CollectorContext(streams=streams_for(SPEC.streams, options))
    rx = build(options, context)
    rx.start()
    return rx, context.streams.require(REQUEST_RECORDS)


@pytest.mark.integration
def test_tls_and_basic_auth_with_the_sdk_exporter(certificate: Certificate, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 11 #12: the receiver had no TLS or auth option; anyone reaching the pod could inject records."""
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):  # requests lets these override the exporter's CA file
        monkeypatch.delenv(name, raising=False)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    rx, records = secured(certificate, tmp_path)
    try:
        host, port = rx.address
        for password, expected in (("wrong", 0), ("s3cret", 1)):
            exporter = OTLPSpanExporter(endpoint=f"https://{host}:{port}/v1/traces",
                                        certificate_file=str(certificate.cert), headers=basic("vllm", password))
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            span = provider.get_tracer("vllm.llm_engine").start_span("llm_request", start_time=1_000_000_000)
            span.set_attributes({"gen_ai.latency.time_to_first_token": 0.5, "gen_ai.request.id": password})
            span.end(end_time=2_000_000_000)
            provider.shutdown()
            assert [r.request_id for r in records.drain()] == (["s3cret"] if expected else [])
        assert counts(rx) == {("unauthorized",): 1.0, ("ok",): 1.0}
        # plain HTTP to the TLS port gets nowhere
        reply, _ = exchange(port, head(b"0"), timeout=2.0)
        assert not reply.startswith(b"HTTP/1.1 200")
    finally:
        rx.close()


def test_http_tables_reach_the_servers(tmp_path: Path) -> None:
    from kvscope.agent.app.wiring import build_agent, components
    from kvscope.agent.config.settings import load_config

    text = ("[exporters.prometheus]\nlisten = '127.0.0.1:0'\n[exporters.prometheus.http]\nmax_connections = 7\n"
            "idle_timeout = 30.0\n[collectors.otlp_traces]\nenabled = true\n[collectors.otlp_traces.http]\n"
            "workers = 2\n")
    config = load_config(text, components(), environ={"KVSCOPE_COLLECTORS__OTLP_TRACES__HTTP__READ_TIMEOUT": "3"})
    otlp = config.collectors["otlp_traces"][1]
    assert (otlp.listen, otlp.http.workers, otlp.http.read_timeout) == ("127.0.0.1:4318", 2, 3.0)
    agent = build_agent(config)
    assert agent.server is not None
    limits = agent.server.httpd.limits
    assert (limits.max_connections, limits.idle_timeout, limits.workers) == (7, 30.0, 4)
    agent.server.stop()


def test_config_check_loads_the_receivers_web_config(tmp_path: Path) -> None:
    import subprocess
    import sys

    web, config = tmp_path / "web.yml", tmp_path / "kvscope.toml"
    web.write_text("basic_auth_users:\n  vllm: plaintext\n")
    config.write_text(f"[collectors.otlp_traces]\nenabled = true\nweb_config_file = '{web}'\n")
    proc = subprocess.run([sys.executable, "-m", "kvscope.agent.app.cli", "config", "check", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (f"kvscope: collectors.otlp_traces.web_config_file: {web}: "
                                   "basic_auth_users.vllm: expected a bcrypt hash ($2y$...)")
