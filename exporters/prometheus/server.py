"""The /metrics HTTP endpoint (keep-alive, gzip, OpenMetrics negotiation, optional TLS/basic auth).

The serving itself — connections, TLS, auth, timeouts and limits — is agent/http/server.py; this module
is what /metrics answers.

Format negotiation follows the Accept header's preferences (RFC 9110 q-values): OpenMetrics 1.0.0 when
the client names `application/openmetrics-text` (version 1.0.0, 0.0.1 or none) with a weight above 0
and at least that of the text format; the text format 0.0.4 otherwise, also for no Accept header and
for `*/*`. Prometheus asks for OpenMetrics first (`application/openmetrics-text;version=1.0.0,...,
text/plain;version=0.0.4;q=0.5,*/*;q=0.1`), so that is what it gets: its `# EOF` lets Prometheus tell
a whole page from one cut short. Both formats come from the same renderer at the same cost per
sample (exporters/prometheus/exposition.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial

from kvscope.agent.config.settings import DEFAULT_PORT, parse_listen
from kvscope.agent.core.catalogue import counter
from kvscope.agent.core.pipeline import Sink, SinkInputs, SinkSpec, StoreReads
from kvscope.agent.core.store import Store
from kvscope.agent.core.streams import HTTP_ROUTES, Route, StreamUse
from kvscope.agent.http.messages import Request, Response, text
from kvscope.agent.http.server import DROP_REASONS, REFUSAL_REASONS, HttpLimits, HttpServer
from kvscope.agent.http.webconfig import WebConfig, load_web_config
from kvscope.exporters.prometheus.exposition import TextRenderer

log = logging.getLogger("kvscope.http")

# Our names are all legacy-valid, so the classic text format is exact; every Prometheus reads it.
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
MAX_BODY_BYTES = 4096  # /metrics takes no body; a small one is read and ignored
_OPENMETRICS_VERSIONS = (None, "1.0.0", "0.0.1")
_TEXT_VERSIONS = (None, "0.0.4")
_NEGOTIATED_CACHE = 64  # distinct Accept headers remembered (a scraper sends the same one each time)
REFUSED_TOTAL = "kvscope_http_refused_total"
METRICS = (
    counter(REFUSED_TOTAL, "", ("reason",),
            "Requests and connections the /metrics server turned away: bad_request (malformed or unsupported), "
            "unauthorized (basic auth refused, or not checked: too many password checks in flight), too_large "
            "(head or body over the limits), evicted (an idle connection closed to make room for a new one), "
            "full (a new connection closed at once: every slot was serving a request).", "HTTP exporter"),
)
# a read-only document an analysis serves beside /metrics (the what-if profile): () -> (body, content type)

_INDEX = b"""<html><head><title>kvscope</title></head><body><h1>kvscope</h1>
<p><a href="/metrics">metrics</a></p></body></html>
"""


class MetricsServer:
    """Serves the store on HOST:PORT from its own thread (a sink: `start()`, `stop()`, `reload()`)."""

    def __init__(self, store: Store, host: str, port: int, web: WebConfig | None = None,
                 limits: HttpLimits | None = None, routes: Mapping[str, Route] | None = None,
                 scheduler: StoreReads | None = None) -> None:
        self.store = store
        self._counted = store.catalogue.get(REFUSED_TOTAL) is not None  # not in a bare store (tests, tools)
        self.routes = dict(routes or {})  # GET path -> document, behind the same TLS and auth as /metrics
        self.renderer = TextRenderer(store)
        self._negotiated: dict[str, bool] = {}
        self._scheduler = scheduler
        run_app = None if scheduler is None else self._on_scheduler
        self.httpd = HttpServer("metrics", host, port, self.serve, limits=limits, web=web,
                                max_body_bytes=MAX_BODY_BYTES, run_app=run_app, refused=self._count,
                                dropped=self._count)

    @property
    def port(self) -> int:
        return self.httpd.port

    def start(self) -> None:
        for reason in (*REFUSAL_REASONS, *DROP_REASONS):  # every series from the start, at 0
            self._count(reason, 0)
        self.httpd.start()

    def _count(self, reason: str, by: int = 1) -> None:
        if self._counted:
            self.store.bump(REFUSED_TOTAL, (reason,), by, time.time())

    def stop(self) -> None:
        self.httpd.stop()

    def reload(self) -> None:
        """Re-reads the web config file (SIGHUP); raises ConfigError and keeps the old one when it is wrong."""
        self.httpd.reload(load_web_config(self.httpd.web.path))

    async def _on_scheduler(self, request: Request) -> Response:
        """A request answered on the scheduler's thread, a scrape right after the scheduler has collected
        what is collected when read (the host collectors). Should the answer be late, the scheduler's
        watchdog is asked to look at the call in progress (agent/runtime/scheduler.py)."""
        scheduler = self._scheduler
        assert scheduler is not None
        late = asyncio.get_running_loop().call_later(scheduler.inline_budget, scheduler.poke)
        try:
            return await asyncio.wrap_future(scheduler.read(partial(self.serve, request), request.path == "/metrics"))
        finally:
            late.cancel()

    def exposition(self, accept: str) -> tuple[bytes, str]:
        openmetrics = self._negotiated.get(accept)
        if openmetrics is None:
            openmetrics = wants_openmetrics(accept)
            if len(self._negotiated) >= _NEGOTIATED_CACHE:
                self._negotiated.clear()
            self._negotiated[accept] = openmetrics
        if openmetrics:
            return self.renderer.render_openmetrics(), OPENMETRICS_CONTENT_TYPE
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
                # zlib with gzip framing (wbits 31): gzip.compress's wrapper costs a third more on a small page
                return Response(200, zlib.compress(body, 1, 31), ctype, [("Content-Encoding", "gzip")])
            return Response(200, body, ctype)
        if path in ("/-/healthy", "/health"):
            return text(200, "ok")
        if path == "/":
            return Response(200, _INDEX, "text/html; charset=utf-8")
        return text(404, "not found")


def wants_openmetrics(accept: str) -> bool:
    """Whether an Accept header prefers OpenMetrics to the text format (see the module docstring)."""
    best_om = best_text = 0.0
    for item in accept.split(","):
        media, *params = (part.strip() for part in item.split(";"))
        q, version = 1.0, None
        for param in params:
            key, _, value = param.partition("=")
            key, value = key.strip().lower(), value.strip().strip('"')
            if key == "q":
                try:
                    q = min(max(float(value), 0.0), 1.0)
                except ValueError:
                    q = 0.0
            elif key == "version":
                version = value
        media = media.lower()
        if media == "application/openmetrics-text" and version in _OPENMETRICS_VERSIONS:
            best_om = max(best_om, q)
        elif (media == "text/plain" and version in _TEXT_VERSIONS) or media in ("text/*", "*/*"):
            best_text = max(best_text, q)
    return best_om > 0.0 and best_om >= best_text


@dataclass
class PrometheusOptions:
    """`[exporters.prometheus]`: the /metrics server."""

    enabled: bool = True
    listen: str = f"0.0.0.0:{DEFAULT_PORT}"
    # Prometheus exporter-toolkit web config (tls_server_config, basic_auth_users); "" = plain HTTP
    web_config_file: str = ""
    http: HttpLimits = field(default_factory=HttpLimits)  # connections, threads and timeouts (docs/security.md)

    def validate(self, path: str) -> None:
        parse_listen(f"{path}.listen", self.listen)
        self.http.validate(f"{path}.http")


def build(section: PrometheusOptions, inputs: SinkInputs) -> list[Sink]:
    """The /metrics server, with every route the analyses offer beside it (the what-if profile)."""
    if not section.enabled:
        return []
    host, port = parse_listen("exporters.prometheus.listen", section.listen)
    routes = {path: route for offered in inputs.streams.every(HTTP_ROUTES) for path, route in offered.items()}
    return [MetricsServer(inputs.store, host, port, load_web_config(section.web_config_file), section.http, routes,
                          scheduler=inputs.reads)]


SPEC = SinkSpec(
    name="prometheus",
    description="/metrics for Prometheus (text and OpenMetrics, gzip, TLS and basic auth from a web config)",
    options=PrometheusOptions,
    factory=build,
    metrics=METRICS,
    streams=StreamUse(reads={HTTP_ROUTES: None}),
)
