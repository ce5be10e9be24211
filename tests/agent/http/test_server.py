"""The shared HTTP server on real sockets: malformed requests, idle and slow peers, TLS per connection,
bounded connections, the listen backlog and shutdown. /metrics (MetricsServer) is the server under test."""

from __future__ import annotations

import logging
import socket
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvscope.agent.http.messages import Request, Response
from kvscope.agent.http.server import HttpLimits, HttpServer
from kvscope.agent.http.webconfig import load_web_config
from kvscope.exporters.prometheus.server import MetricsServer
from testkit.environment import require_tool
from testkit.http import Certificate, exchange, read_until_closed, scrape, self_signed
from testkit.stores import filled_store

FAST = HttpLimits(handshake_timeout=0.5, read_timeout=0.5, idle_timeout=0.5, write_timeout=2.0)


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    srv = MetricsServer(filled_store(), "127.0.0.1", 0)
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def fast() -> Iterator[MetricsServer]:
    srv = MetricsServer(filled_store(), "127.0.0.1", 0, limits=FAST)
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> Certificate:
    return self_signed(tmp_path_factory.mktemp("tls"))


def tls_server(certificate: Certificate, tmp_path: Path, limits: HttpLimits | None = None) -> MetricsServer:
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"tls_server_config:\n  cert_file: {certificate.cert}\n  key_file: {certificate.key}\n")
    srv = MetricsServer(filled_store(), "127.0.0.1", 0, load_web_config(str(cfg)), limits=limits)
    srv.start()
    return srv


def no_tracebacks(caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    assert "Traceback" not in capsys.readouterr().err
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records if r.exc_info]


def test_client_reset_is_quiet(server: MetricsServer, caplog: pytest.LogCaptureFixture,
                               capsys: pytest.CaptureFixture[str]) -> None:
    with caplog.at_level(logging.DEBUG, logger="kvscope.http"):
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # the request line, then a reset
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()
        time.sleep(0.3)
    no_tracebacks(caplog, capsys)
    assert any("connection ended" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /\r\n", b"400"),  # HTTP/0.9: answered, not held open waiting for headers
        (b"GARBAGE\r\n\r\n", b"400"),
        (b"GET / HTTP/2.0\r\n\r\n", b"505"),
        (b"GET /metrics HTTP/1.1\r\nX: " + b"y" * 10000 + b"\r\n\r\n", b"431"),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: -1\r\n\r\n", b"400"),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: abc\r\n\r\n", b"400"),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 4611686018427387904\r\n\r\n", b"413"),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", b"400"),
    ],
)
def test_malformed_requests_are_answered_and_closed(server: MetricsServer, request_bytes: bytes, status: bytes,
                                                    caplog: pytest.LogCaptureFixture,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    with caplog.at_level(logging.DEBUG):
        reply, closed = exchange(server.port, request_bytes, timeout=3.0)
    assert reply.startswith(b"HTTP/1.1 " + status), reply[:200]
    assert closed, "the connection should be closed after a malformed request"
    no_tracebacks(caplog, capsys)
    assert scrape(server.port)[0] == 200  # and the server still serves


def test_negative_content_length_does_not_read_to_eof(server: MetricsServer) -> None:
    """Content-Length: -1 followed by a stream of bytes: answered 400 at once, the stream is not swallowed."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n" + b"\0" * 65536)
        start = time.monotonic()
        reply, _ = read_until_closed(sock, 3.0)
        assert reply.startswith(b"HTTP/1.1 400"), reply[:100]
        assert time.monotonic() - start < 2.0
        with pytest.raises(OSError):  # the server closed: what we keep sending is refused
            for _ in range(256):
                sock.sendall(b"\0" * 65536)


def test_keep_alive_pipelining_and_head(server: MetricsServer) -> None:
    reply, _ = exchange(server.port, b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n"
                                     b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
                                     b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout=3.0)
    parts = reply.split(b"HTTP/1.1 ")
    assert [p[:3] for p in parts[1:]] == [b"200", b"200", b"404"]
    assert parts[1].endswith(b"\r\n\r\nok\n")
    assert parts[2].endswith(b"\r\n\r\n")  # HEAD: the length of the page, no page
    assert b"Content-Length: " + str(len(server.renderer.render())).encode() in parts[2]


def test_http10_closes_unless_asked_to_keep_alive(server: MetricsServer) -> None:
    reply, closed = exchange(server.port, b"GET /-/healthy HTTP/1.0\r\n\r\n", timeout=3.0)
    assert reply.startswith(b"HTTP/1.1 200") and closed
    reply, closed = exchange(server.port, b"GET /-/healthy HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", timeout=1.0)
    assert b"Connection: keep-alive" in reply and not closed


def test_methods_other_than_get_are_refused(server: MetricsServer) -> None:
    reply, _ = exchange(server.port, b"DELETE /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 405") and b"Allow: GET, HEAD" in reply


def test_a_silent_connection_is_closed_after_the_read_timeout(fast: MetricsServer) -> None:
    for opening in (b"", b"GET /metrics HTTP/1.1\r\nHost:"):  # nothing, then a head that never ends
        with socket.create_connection(("127.0.0.1", fast.port)) as sock:
            sock.sendall(opening)
            start = time.monotonic()
            reply, closed = read_until_closed(sock, 5.0)
        assert closed and reply == b""
        assert 0.4 < time.monotonic() - start < 2.0


def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout(fast: MetricsServer) -> None:
    with socket.create_connection(("127.0.0.1", fast.port)) as sock:
        sock.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
        start = time.monotonic()
        reply, closed = read_until_closed(sock, 5.0)
    assert reply.startswith(b"HTTP/1.1 200") and closed
    assert 0.4 < time.monotonic() - start < 2.0


def test_idle_tls_connections_do_not_delay_a_scrape(certificate: Certificate, tmp_path: Path) -> None:
    """Issue 11 #3: the handshake ran inside accept(), so one silent connection held every HTTPS scrape."""
    srv = tls_server(certificate, tmp_path, HttpLimits(handshake_timeout=1.0))
    try:
        silent = socket.create_connection(("127.0.0.1", srv.port))
        partial = socket.create_connection(("127.0.0.1", srv.port))
        partial.sendall(b"\x16\x03\x01")  # 3 bytes of a ClientHello's record header
        time.sleep(0.1)
        context = certificate.client_context()
        results = [scrape(srv.port, context=context, timeout=5) for _ in range(3)]
        assert [status for status, _ in results] == [200] * 3
        assert max(seconds for _, seconds in results) < 0.5  # measured: ~3 ms, as without the idle connections
        # and the handshake timeout closes both
        for sock in (silent, partial):
            _, closed = read_until_closed(sock, 3.0)
            assert closed
            sock.close()
        start = time.monotonic()
        idle = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(3)]
    finally:
        srv.stop()
    assert time.monotonic() - start < 2.0  # stop() does not wait for idle peers
    for sock in idle:
        assert read_until_closed(sock, 2.0)[1]
        sock.close()


def test_a_new_https_connection_is_answered_without_delay(certificate: Certificate, tmp_path: Path) -> None:
    """TLS 1.3 session tickets left unsent after the handshake held each first response ~40 ms."""
    srv = tls_server(certificate, tmp_path)
    try:
        context = certificate.client_context()
        seconds = [scrape(srv.port, context=context)[1] for _ in range(5)]
    finally:
        srv.stop()
    assert statistics.median(seconds) < 0.025, seconds  # measured: 2-4 ms (with tickets: 41-46 ms)


def test_plain_http_to_a_tls_port_is_closed_quietly(certificate: Certificate, tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    srv = tls_server(certificate, tmp_path)
    try:
        with caplog.at_level(logging.DEBUG):
            reply, closed = exchange(srv.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", timeout=3.0)
        assert closed and not reply.startswith(b"HTTP/1.1 200")
        assert scrape(srv.port, context=certificate.client_context())[0] == 200
    finally:
        srv.stop()
    no_tracebacks(caplog, capsys)


def test_a_thousand_idle_connections_do_not_take_metrics_down() -> None:
    """Connections beyond max_connections take the place of those that waited longest; no thread per socket."""
    srv = MetricsServer(filled_store(), "127.0.0.1", 0, limits=HttpLimits(max_connections=64))
    srv.start()
    idle: list[socket.socket] = []
    try:
        threads_before = threading.active_count()
        for _ in range(1100):
            idle.append(socket.create_connection(("127.0.0.1", srv.port), timeout=5))
        time.sleep(0.3)
        results = [scrape(srv.port, timeout=5) for _ in range(5)]
        assert [status for status, _ in results] == [200] * 5
        assert max(seconds for _, seconds in results) < 1.0
        assert srv.httpd.connections() <= 64 and srv.httpd.evicted >= 1100 - 64
        assert threading.active_count() <= threads_before + 4  # the workers, not a thread per connection
        # the oldest were closed to make room
        assert read_until_closed(idle[0], 2.0)[1]
    finally:
        for sock in idle:
            sock.close()
        srv.stop()


def test_connections_being_served_are_not_closed_for_newcomers() -> None:
    release = threading.Event()
    started = threading.Semaphore(0)

    def slow(request: Request) -> Response:
        started.release()
        release.wait(10)
        return Response(200, b"done\n")

    srv = HttpServer("test", "127.0.0.1", 0, slow, limits=HttpLimits(max_connections=2, workers=2))
    srv.start()
    replies: list[bytes] = []

    def client() -> None:
        replies.append(exchange(srv.port, b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n", timeout=10)[0])

    busy = [threading.Thread(target=client) for _ in range(2)]
    try:
        for t in busy:
            t.start()
        assert started.acquire(timeout=5) and started.acquire(timeout=5)
        reply, closed = exchange(srv.port, b"", timeout=2.0)  # a third: no room, closed at once
        assert closed and reply == b"" and srv.turned_away == 1
        release.set()
        for t in busy:
            t.join(10)
        assert [r[:12] for r in replies] == [b"HTTP/1.1 200"] * 2
    finally:
        release.set()
        srv.stop()


def test_handler_errors_are_500_and_logged() -> None:
    def broken(request: Request) -> Response:
        raise RuntimeError("a bug")

    srv = HttpServer("test", "127.0.0.1", 0, broken)
    srv.start()
    try:
        reply, _ = exchange(srv.port, b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 500")
    finally:
        srv.stop()


def test_streamed_responses_are_chunked_for_http11_and_close_delimited_for_http10() -> None:
    def stream(request: Request) -> Response:
        return Response(200, iter([b"one ", b"", b"two"]))

    srv = HttpServer("test", "127.0.0.1", 0, stream)
    srv.start()
    try:
        reply, _ = exchange(srv.port, b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert b"Transfer-Encoding: chunked" in reply and reply.endswith(b"\r\n\r\n4\r\none \r\n3\r\ntwo\r\n0\r\n\r\n")
        reply, closed = exchange(srv.port, b"GET / HTTP/1.0\r\n\r\n")
        assert closed and b"Transfer-Encoding" not in reply and reply.endswith(b"\r\n\r\none two")
    finally:
        srv.stop()


def test_the_listen_backlog_is_the_configured_one() -> None:
    """Issue 11 #6: the backlog was 5, so a burst of connects waited ~1 s for a SYN retransmit."""
    ss = require_tool("ss")
    srv = MetricsServer(filled_store(), "127.0.0.1", 0, limits=HttpLimits(backlog=300))
    srv.start()
    try:
        out = subprocess.run([ss, "-Hltn", f"sport = :{srv.port}"], capture_output=True, text=True, check=True)
        # for a listening socket ss shows the backlog as Send-Q (the third column)
        assert out.stdout.split()[2] == "300", out.stdout
    finally:
        srv.stop()


def test_limits_are_checked() -> None:
    from kvscope.agent.config.settings import ConfigError

    with pytest.raises(ConfigError, match=r"x\.workers: must be >= 1"):
        HttpLimits(workers=0).validate("x")
    with pytest.raises(ConfigError, match=r"x\.read_timeout: must be > 0"):
        HttpLimits(read_timeout=0).validate("x")


def _refused_counts(port: int) -> dict[str, float]:
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    prefix = 'kvscope_http_refused_total{reason="'
    return {line[len(prefix):line.index('"', len(prefix))]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith(prefix)}


def test_what_the_metrics_server_turns_away_is_counted_by_reason() -> None:
    """An operator sees a misconfigured or hostile client on /metrics itself: each kind of refusal in its series."""
    from kvscope.agent.app.wiring import all_metric_specs
    from kvscope.agent.core.catalogue import Catalogue
    from kvscope.agent.core.store import Store

    srv = MetricsServer(Store(Catalogue(all_metric_specs())), "127.0.0.1", 0, limits=HttpLimits(max_connections=3))
    srv.start()
    try:
        reasons = ("bad_request", "evicted", "full", "too_large", "unauthorized")
        assert _refused_counts(srv.port) == dict.fromkeys(reasons, 0.0)
        assert exchange(srv.port, b"BREW /metrics HTCPCP/1.0\r\n\r\n", timeout=3.0)[0].startswith(b"HTTP/1.1 400")
        head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n"
        assert exchange(srv.port, head, timeout=3.0)[0].startswith(b"HTTP/1.1 431")
        idle = [socket.create_connection(("127.0.0.1", srv.port), timeout=5) for _ in range(5)]
        try:
            time.sleep(0.3)
            counts = _refused_counts(srv.port)  # (its own connection may make room too, as the accepts fall)
        finally:
            for sock in idle:
                sock.close()
        assert counts["bad_request"] == 1 and counts["too_large"] == 1 and counts["unauthorized"] == 0
        # five idle connections into three slots: at least two closed, each counted on the page — evicted for
        # room, or turned away while the others were still being set up (a loaded machine)
        assert counts["evicted"] == srv.httpd.evicted and counts["full"] == srv.httpd.turned_away
        assert counts["evicted"] + counts["full"] >= 2
    finally:
        srv.stop()


@pytest.mark.parametrize("fields", [
    b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
    b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
    b"Content-Length: 5\r\nTransfer-Encoding: gzip\r\n",
])
def test_transfer_encoding_with_content_length_is_refused_and_counted(fields: bytes) -> None:
    """The request-smuggling shape: 400, the connection closed without reading the body as either framing,
    and counted as a bad request on /metrics."""
    from kvscope.agent.app.wiring import all_metric_specs
    from kvscope.agent.core.catalogue import Catalogue
    from kvscope.agent.core.store import Store

    srv = MetricsServer(Store(Catalogue(all_metric_specs())), "127.0.0.1", 0)
    srv.start()
    try:
        request = b"POST /metrics HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n5\r\nhello\r\n0\r\n\r\n"
        reply, closed = exchange(srv.port, request, timeout=3.0)
        assert reply.startswith(b"HTTP/1.1 400") and b"Transfer-Encoding and Content-Length together" in reply
        assert closed and reply.count(b"HTTP/1.1 ") == 1  # nothing of the body was read as a next request
        assert _refused_counts(srv.port)["bad_request"] == 1
    finally:
        srv.stop()
