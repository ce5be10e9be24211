"""Where and how the OTLP exporters send: kvscope's `[exporters.otlp]` keys, then the standard
`OTEL_*` variables, then defaults — and the resource that says which sidecar sent it.

Pure (no OpenTelemetry import), so `kvscope config check` can resolve and check all of it without the
`otlp` extra. A key set in kvscope's configuration (file, `KVSCOPE_EXPORTERS__OTLP__*`, flag) wins over
every `OTEL_*` variable, as an SDK's constructor arguments win over its environment; among the
variables, the per-signal one wins over the general one (the OTel SDK's rule).
"""

from __future__ import annotations

import logging
import socket
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from kvscope import __version__
from kvscope.agent.config import extras
from kvscope.agent.config.binding import ConfigError, positive
from kvscope.agent.core.catalogue import counter
from kvscope.agent.core.pipeline import Sink, SinkInputs, SinkSpec
from kvscope.agent.core.store import Store
from kvscope.agent.core.streams import ATTRIBUTED_REQUESTS, StreamUse

log = logging.getLogger("kvscope.otlp")

Signal = Literal["metrics", "traces"]
Protocol = Literal["http/protobuf", "grpc"]

DEFAULT_HTTP = "http://localhost:4318"
DEFAULT_GRPC = "http://localhost:4317"
DEFAULT_TIMEOUT = 10.0  # seconds, the OTel default
# kvscope's own default (the SDK's is 60 s): the dashboards' rate windows are built for a 15 s scrape
DEFAULT_INTERVAL = 15.0
DEFAULT_QUEUE = 2048
DEFAULT_BATCH = 512

# resource attribute -> environment variables the Kubernetes downward API is commonly mapped to
POD_IDENTITY: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("k8s.pod.name", ("K8S_POD_NAME", "POD_NAME")),
    ("k8s.namespace.name", ("K8S_NAMESPACE_NAME", "POD_NAMESPACE")),
    ("k8s.node.name", ("K8S_NODE_NAME", "NODE_NAME")),
)

EXPORTS = "kvscope_otlp_exporter_exports_total"
TRACES = "kvscope_otlp_exporter_traces_total"

OtlpProtocol = Literal["", "http/protobuf", "grpc"]
OtlpCompression = Literal["", "none", "gzip"]


@dataclass
class OtlpOptions:
    """OTLP export: the store's metrics and one attribution trace per request, each on or off by itself.

    An empty or unset key falls back to the standard OTEL_EXPORTER_OTLP_* variable, then to the OTel
    default (exporters/otlp/settings.py resolves them; docs/otlp-export.md lists them).
    """

    metrics: bool = False  # export every catalogued metric
    traces: bool = False  # export each attributed request as a trace
    endpoint: str = ""  # base URL for both signals (HTTP appends /v1/metrics, /v1/traces)
    metrics_endpoint: str = ""  # full URL for metrics, used as it is
    traces_endpoint: str = ""  # full URL for traces, used as it is
    protocol: OtlpProtocol = ""  # http/protobuf (the default) or grpc (the otlp-grpc extra)
    headers: dict[str, str] = field(default_factory=dict)
    compression: OtlpCompression = ""
    certificate: str = ""  # CA bundle for an https endpoint
    timeout: float | None = None  # seconds one export may take, retries included
    interval: float | None = None  # seconds between metric exports
    queue_size: int | None = None  # attributed requests waiting for export; more are dropped and counted
    batch_size: int | None = None  # attributed requests per trace export

    def validate(self, path: str) -> None:
        for name in ("timeout", "interval"):
            value = getattr(self, name)
            if value is not None:
                positive(f"{path}.{name}", value)
        for name in ("queue_size", "batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{path}.{name}: must be >= 1, got {value}")


METRICS = (
    counter(EXPORTS, "", ("signal", "result"),
            "OTLP export calls by signal (metrics, traces) and result: ok, or failed (refused, or unreachable "
            "until the timeout, retries included).", "OTLP exporter"),
    counter(TRACES, "", ("result",),
            "Attribution traces (one per attributed request) by result: exported, failed (their export failed), "
            "dropped (the export queue was full, or the agent stopped before they were sent).", "OTLP exporter"),
)


class ExportCounter:
    """Counts one signal's exports in the store, and logs when they start failing and when they recover
    (once each: the counts say how often)."""

    def __init__(self, store: Store, signal: Signal, wall_clock: Callable[[], float]) -> None:
        self._store, self._signal, self._wall = store, signal, wall_clock
        self._failing = False

    def start(self) -> None:
        for result in ("ok", "failed"):
            self._store.bump(EXPORTS, (self._signal, result), 0, self._wall())

    def count(self, ok: bool) -> None:
        self._store.bump(EXPORTS, (self._signal, "ok" if ok else "failed"), 1, self._wall())
        if ok == self._failing:
            self._failing = not ok
            if self._failing:
                log.warning("OTLP %s export failing (counted in %s)", self._signal, EXPORTS)
            else:
                log.info("OTLP %s export recovered", self._signal)


@dataclass(frozen=True, slots=True)
class Destination:
    """One signal's OTLP endpoint, as the exporter will be built."""

    signal: Signal
    protocol: Protocol
    endpoint: str  # HTTP: the full URL, signal path included; gRPC: scheme://host:port
    headers: dict[str, str]
    timeout: float  # seconds one export may take, retries included
    compression: Literal["none", "gzip"]
    certificate: str  # CA bundle for https; "" = the system's

    @property
    def insecure(self) -> bool:
        """gRPC: plain text unless the endpoint says https (a bare host:port is plain text, as for the SDK)."""
        return not self.endpoint.startswith("https://")

    def describe(self) -> str:
        return f"{self.signal} over OTLP {self.protocol} to {self.endpoint}"


@dataclass(frozen=True, slots=True)
class OtlpSettings:
    metrics: Destination | None  # None when that exporter is off
    traces: Destination | None
    interval: float  # seconds between metric exports
    queue_size: int  # attributed requests waiting for the trace exporter
    batch_size: int  # attributed requests per trace export


def _env(environ: Mapping[str, str], signal: Signal, name: str) -> tuple[str, str] | None:
    """(variable, value) of OTEL_EXPORTER_OTLP_<SIGNAL>_<NAME>, else OTEL_EXPORTER_OTLP_<NAME>; None if unset."""
    for var in (f"OTEL_EXPORTER_OTLP_{signal.upper()}_{name}", f"OTEL_EXPORTER_OTLP_{name}"):
        value = environ.get(var, "").strip()
        if value:
            return var, value
    return None


def _millis(var: str, text: str) -> float:
    try:
        value = float(text) / 1000.0
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(f"{var}: expected a positive number of milliseconds, got {text!r}")
    return value


def _count(var: str, text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"{var}: expected a positive integer, got {text!r}")
    return int(text)


def _one_of(var: str, text: str, allowed: tuple[str, ...]) -> str:
    value = text.strip().lower()
    if value not in allowed:
        raise ConfigError(f"{var}: expected one of {', '.join(allowed)}, got {text!r}")
    return value


def parse_headers(var: str, text: str) -> dict[str, str]:
    """`k1=v1,k2=v2` (values percent-decoded), the OTEL_EXPORTER_OTLP_HEADERS format."""
    out = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{var}: expected key=value pairs separated by commas, got {item.strip()!r}")
        out[urllib.parse.unquote(key.strip())] = urllib.parse.unquote(value.strip())
    return out


def _check_url(key: str, url: str, protocol: Protocol) -> None:
    parsed = urllib.parse.urlsplit(url if "://" in url else f"//{url}")
    if protocol == "http/protobuf" and parsed.scheme not in ("http", "https"):
        raise ConfigError(f"{key}: an OTLP/HTTP endpoint is an http:// or https:// URL, got {url!r}")
    if parsed.scheme not in ("", "http", "https") or not parsed.hostname:
        raise ConfigError(f"{key}: expected [http[s]://]host[:port], got {url!r}")
    try:
        _ = parsed.port  # raises on a port that is not a number in range
    except ValueError:
        raise ConfigError(f"{key}: bad port in {url!r}") from None


def _endpoint(section: OtlpOptions, environ: Mapping[str, str], signal: Signal, protocol: Protocol) -> str:
    own = section.metrics_endpoint if signal == "metrics" else section.traces_endpoint
    specific = f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT"
    candidates = ((f"exporters.otlp.{signal}_endpoint", own, False),
                  ("exporters.otlp.endpoint", section.endpoint, True),
                  (specific, environ.get(specific, "").strip(), False),
                  ("OTEL_EXPORTER_OTLP_ENDPOINT", environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip(), True),
                  ("", DEFAULT_GRPC if protocol == "grpc" else DEFAULT_HTTP, True))
    key, url, base = next(c for c in candidates if c[1])
    if key:
        _check_url(key, url, protocol)
    # a base URL gets the signal's path over HTTP (gRPC has no paths); a per-signal URL is used as it is
    return url.rstrip("/") + f"/v1/{signal}" if base and protocol == "http/protobuf" else url


def destination(section: OtlpOptions, environ: Mapping[str, str], signal: Signal) -> Destination:
    found = _env(environ, signal, "PROTOCOL")
    if section.protocol:
        protocol: Protocol = section.protocol
    elif found is not None:
        protocol = "grpc" if _one_of(found[0], found[1], ("http/protobuf", "grpc")) == "grpc" else "http/protobuf"
    else:
        protocol = "http/protobuf"

    def setting(name: str, own: str, parse: Callable[[str, str], str], default: str) -> str:
        if own:
            return own
        env = _env(environ, signal, name)
        return default if env is None else parse(*env)

    found = _env(environ, signal, "HEADERS")
    headers = dict(section.headers) if section.headers else ({} if found is None else parse_headers(*found))
    found = _env(environ, signal, "TIMEOUT")
    timeout = section.timeout or (DEFAULT_TIMEOUT if found is None else _millis(*found))
    compression = setting("COMPRESSION", section.compression,
                          lambda var, text: _one_of(var, text, ("none", "gzip")), "none")
    return Destination(signal, protocol, _endpoint(section, environ, signal, protocol), headers, timeout,
                       "gzip" if compression == "gzip" else "none",
                       setting("CERTIFICATE", section.certificate, lambda _var, text: text, ""))


def resolve(section: OtlpOptions, environ: Mapping[str, str]) -> OtlpSettings:
    """The settings both exporters run with; raises ConfigError naming the key or variable at fault."""
    interval_env = environ.get("OTEL_METRIC_EXPORT_INTERVAL", "").strip()
    interval = section.interval or (_millis("OTEL_METRIC_EXPORT_INTERVAL", interval_env) if interval_env
                                    else DEFAULT_INTERVAL)
    return OtlpSettings(
        metrics=destination(section, environ, "metrics") if section.metrics else None,
        traces=destination(section, environ, "traces") if section.traces else None,
        interval=interval,
        queue_size=section.queue_size or DEFAULT_QUEUE,
        batch_size=section.batch_size or DEFAULT_BATCH,
    )


def resource_attributes(environ: Mapping[str, str], version: str,
                        hostname: Callable[[], str] = socket.gethostname) -> dict[str, str]:
    """service.*, the pod identity the downward API put in the environment, then OTEL_RESOURCE_ATTRIBUTES and
    OTEL_SERVICE_NAME on top (what the operator wrote wins over what kvscope found)."""
    attrs = {"service.name": "kvscope", "service.version": version}
    for attribute, names in POD_IDENTITY:
        value = next((environ[n].strip() for n in names if environ.get(n, "").strip()), "")
        if value:
            attrs[attribute] = value
    # Prometheus-compatible backends make service.instance.id the `instance` label: one per sidecar
    attrs["service.instance.id"] = attrs.get("k8s.pod.name") or hostname()
    text = environ.get("OTEL_RESOURCE_ATTRIBUTES", "").strip()
    if text:
        attrs.update(parse_headers("OTEL_RESOURCE_ATTRIBUTES", text))
    service = environ.get("OTEL_SERVICE_NAME", "").strip()
    if service:
        attrs["service.name"] = service
    return attrs


def build(section: OtlpOptions, inputs: SinkInputs) -> list[Sink]:
    """The OTLP metrics and trace exporters the settings enable; the SDK is imported only here, and only
    when one is (the `otlp` extra)."""
    settings = resolve(section, inputs.environ)
    if settings.metrics is None and settings.traces is None:
        return []
    extras.require("otlp", "exporters.otlp")
    from kvscope.exporters.otlp import sdk
    from kvscope.exporters.otlp.metrics import OtlpMetricsSink, StoreMetrics
    from kvscope.exporters.otlp.spans import AttributionSpans, OtlpTracesSink

    store, wall_clock = inputs.store, inputs.wall_clock
    refresh = inputs.reads.refresh if inputs.reads is not None else (lambda: None)
    resource, scope = sdk.resource(inputs.environ, __version__), sdk.scope(__version__)
    out: list[Sink] = []
    if settings.metrics is not None:
        dest = settings.metrics
        out.append(OtlpMetricsSink(store, StoreMetrics(store, resource, scope), sdk.metric_exporter(dest),
                                   settings.interval, dest.timeout, wall_clock, refresh))
        log.info("exporting %s every %g s", dest.describe(), settings.interval)
    if settings.traces is not None:
        dest = settings.traces
        out.append(OtlpTracesSink(store, AttributionSpans(resource, scope), sdk.span_exporter(dest),
                                  settings.queue_size, settings.batch_size, wall_clock))
        log.info("exporting %s, one trace per attributed request", dest.describe())
    return out


def _request_receiver(sink: Sink) -> Sink | None:
    """The trace exporter takes attributed requests (it has `write`); the metrics exporter does not."""
    return sink if callable(getattr(sink, "write", None)) else None


SPEC = SinkSpec(
    name="otlp",
    description="OTLP export of the metrics and of each request's TTFT attribution as a trace (the otlp extra)",
    options=OtlpOptions,
    factory=build,
    metrics=METRICS,
    streams=StreamUse(offers={ATTRIBUTED_REQUESTS: _request_receiver}),
)
