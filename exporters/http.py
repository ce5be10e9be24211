"""The /metrics HTTP endpoint (keep-alive, gzip, OpenMetrics negotiation, optional TLS/basic auth)."""

from __future__ import annotations

import gzip
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_TYPE
from prometheus_client.openmetrics.exposition import generate_latest as _generate_openmetrics

from kvscope.agent.http_server import QuietHTTPServer
from kvscope.agent.store import Store
from kvscope.exporters.prometheus import StoreCollector, TextRenderer
from kvscope.exporters.webconfig import WebConfig

log = logging.getLogger("kvscope.http")
generate_openmetrics: Callable[[CollectorRegistry], bytes] = _generate_openmetrics

# Our names are all legacy-valid, so the classic text format is exact; every Prometheus reads it.
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_INDEX = b"""<html><head><title>kvscope</title></head><body><h1>kvscope</h1>
<p><a href="/metrics">metrics</a></p></body></html>
"""


class MetricsServer:
    """Serves the store on HOST:PORT in a daemon thread; `extra_routes` maps paths to handlers."""

    def __init__(
        self,
        store: Store,
        host: str,
        port: int,
        web: WebConfig | None = None,
        extra_routes: dict[str, Callable[[bytes], tuple[int, str, bytes]]] | None = None,
    ) -> None:
        self.store = store
        self.renderer = TextRenderer(store)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(StoreCollector(store))
        self.web = web or WebConfig()
        self.routes = extra_routes or {}
        handler = self._handler_class()
        self.httpd = QuietHTTPServer((host, port), handler)
        if self.web.tls is not None:
            self.httpd.socket = self.web.tls.wrap_socket(self.httpd.socket, server_side=True)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def exposition(self, accept: str) -> tuple[bytes, str]:
        if "application/openmetrics-text" in accept:
            return generate_openmetrics(self.registry), OPENMETRICS_TYPE
        return self.renderer.render(), TEXT_CONTENT_TYPE

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            server_version = "kvscope"
            # Headers and body go out in separate writes; with Nagle on, a keep-alive scraper's delayed
            # ACK would hold every body back ~40 ms.
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: object) -> None:
                log.debug("%s " + format, self.address_string(), *args)

            def _reply(self, status: int, ctype: str, body: bytes, gzip_ok: bool = False) -> None:
                if gzip_ok and len(body) > 512:
                    body = gzip.compress(body, compresslevel=1)
                    self.send_response(status)
                    self.send_header("Content-Encoding", "gzip")
                else:
                    self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _allowed(self) -> bool:
                if server.web.authorised(self.headers.get("Authorization")):
                    return True
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="kvscope"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return False

            def do_GET(self) -> None:
                if not self._allowed():
                    return
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    body, ctype = server.exposition(self.headers.get("Accept", ""))
                    self._reply(200, ctype, body, "gzip" in self.headers.get("Accept-Encoding", ""))
                elif path in ("/-/healthy", "/health"):
                    self._reply(200, "text/plain; charset=utf-8", b"ok\n")
                elif path == "/":
                    self._reply(200, "text/html; charset=utf-8", _INDEX)
                else:
                    self._reply(404, "text/plain; charset=utf-8", b"not found\n")

            do_HEAD = do_GET

            def do_POST(self) -> None:
                if not self._allowed():
                    return
                route = server.routes.get(self.path.split("?", 1)[0])
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if route is None:
                    self._reply(404, "text/plain; charset=utf-8", b"not found\n")
                    return
                status, ctype, reply = route(body)
                self._reply(status, ctype, reply)

        return Handler
