"""A client that hangs up mid-request is logged at debug, not printed as a traceback."""

from __future__ import annotations

import logging
import socket
import time

import pytest

from kvscope.agent.http_server import QuietHTTPServer
from kvscope.exporters.http import MetricsServer
from tests.test_exporter import filled_store


def test_client_reset_is_quiet(caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    srv = MetricsServer(filled_store(), "127.0.0.1", 0)
    assert isinstance(srv.httpd, QuietHTTPServer)
    srv.start()
    try:
        with caplog.at_level(logging.DEBUG, logger="kvscope.http"):
            sock = socket.create_connection(("127.0.0.1", srv.port))
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # the request line, then a reset
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            sock.close()
            time.sleep(0.3)
        assert "Traceback" not in capsys.readouterr().err
        assert any("went away" in r.getMessage() for r in caplog.records)
    finally:
        srv.stop()
