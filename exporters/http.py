"""The /metrics HTTP endpoint (keep-alive, gzip, OpenMetrics negotiation, optional TLS/basic auth).

The serving itself — connections, TLS, auth, timeouts and limits — is agent/http_server.py; this module
is what /metrics answers.
"""

from __future__ import annotations

import gzip
import logging
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_TYPE
from prometheus_client.openmetrics.exposition import generate_latest as _generate_openmetrics

from kvscope.agent.http_messages import Request, Response, text
from kvscope.agent.http_server import HttpLimits, HttpServer
from kvscope.agent.store import Store
from kvscope.agent.webconfig import WebConfig, load_web_config
from kvscope.exporters.prometheus import StoreCollector, TextRenderer

log = logging.getLogger("kvscope.http")
generate_openmetrics: Callable[[CollectorRegistry], bytes] = _generate_openmetrics

# Our names are all legacy-valid, so the classic text format is exact; every Prometheus reads it.
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_BODY_BYTES = 4096  # /metrics takes no body; a small one is read and ignored
# a read-only document an analysis serves beside /metrics (the what-if profile): () -> (body, content type)
Route = Callable[[], tuple[bytes, str]]

_INDEX = b"""<html><head><title>kvscope</title></head><body><h1>kvscope</h1>
<p><a href="/metrics">metrics</a></p></body></html>
"""


class MetricsServer:
    """Serves the store on HOST:PORT from its own thread (a sink: `start()`, `stop()`, `reload()`)."""

    def __init__(self, store: Store, host: str, port: int, web: WebConfig | None = None,
                 limits: HttpLimits | None = None, routes: Mapping[str, Route] | None = None) -> None:
        self.store = store
        self.routes = dict(routes or {})  # GET path -> document, behind the same TLS and auth as /metrics
        self.renderer = TextRenderer(store)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(StoreCollector(store))
        self.httpd = HttpServer("metrics", host, port, self.serve, limits=limits, web=web,
                                max_body_bytes=MAX_BODY_BYTES)

    @property
    def port(self) -> int:
        return self.httpd.port

    def start(self) -> None:
        self.httpd.start()

    def stop(self) -> None:
        self.httpd.stop()

    def reload(self) -> None:
        """Re-reads the web config file (SIGHUP); raises ConfigError and keeps the old one when it is wrong."""
        self.httpd.reload(load_web_config(self.httpd.web.path))

    def exposition(self, accept: str) -> tuple[bytes, str]:
        if "application/openmetrics-text" in accept:
            return generate_openmetrics(self.registry), OPENMETRICS_TYPE
        return self.renderer.render(), TEXT_CONTENT_TYPE

    def serve(self, request: Request) -> Response:
        if request.method not in ("GET", "HEAD"):
            response = text(405, "method not allowed")
            response.headers.append(("Allow", "GET, HEAD"))
            return response
        path = request.path
        route = self.routes.get(path)
        if path == "/metrics" or route is not None:
            if route is None:
                body, ctype = self.exposition(request.headers.get("accept", "") or "")
            else:
                body, ctype = route()
            if "gzip" in (request.headers.get("accept-encoding") or "") and len(body) > 512:
                return Response(200, gzip.compress(body, compresslevel=1), ctype, [("Content-Encoding", "gzip")])
            return Response(200, body, ctype)
        if path in ("/-/healthy", "/health"):
            return text(200, "ok")
        if path == "/":
            return Response(200, _INDEX, "text/html; charset=utf-8")
        return text(404, "not found")
