"""The wiring: from a Config to a running agent. The one place that builds and connects the pipeline.

sources (collectors) → store → analyses → sinks. Shared objects are made here and handed to their
users as typed constructor arguments: the request-record buffer (OTLP receiver → correlation
analysis, sized by `analyses.correlation.record_buffer`), the GPU busy intervals (NVML collector, or
whatever the caller passes, → correlation analysis), the request sinks (correlation analysis →
JSON Lines, OTLP traces, and the latest requests the what-if analysis reads) and, with the what-if
analysis on, the KV access log (KV-event collector → what-if analysis; its profile route goes on the
/metrics server). Nothing on this path imports the reference pipeline, the self-test or the
offline reports, nor the OpenTelemetry SDK unless an OTLP exporter is enabled (the `otlp` extra).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kvscope import __version__
from kvscope.agent.analyses.correlation.analysis import SPEC as CORRELATION_SPEC
from kvscope.agent.analyses.correlation.options import CorrelationOptions
from kvscope.agent.analyses.whatif.analysis import SPEC as WHATIF_SPEC
from kvscope.agent.analyses.whatif.analysis import WhatIfAnalysis
from kvscope.agent.config import extras
from kvscope.agent.config.settings import Config, ConfigError, parse_listen
from kvscope.agent.core.catalogue import AGENT_METRICS, Catalogue, MetricSpec
from kvscope.agent.core.contract import CONTRACT_METRICS
from kvscope.agent.core.kv_access import KvAccessLog
from kvscope.agent.core.pipeline import (
    Analysis,
    AnalysisInputs,
    Collector,
    CollectorContext,
    Components,
    GpuIntervals,
    RequestSink,
    Sink,
)
from kvscope.agent.core.records import RecentRequests, RecordBuffer
from kvscope.agent.core.store import Store
from kvscope.agent.http.webconfig import load_web_config
from kvscope.agent.runtime.scheduler import Scheduler, analysis_job, collector_job
from kvscope.collectors.gpu.nvml import NvmlCollector
from kvscope.collectors.registry import collector_specs
from kvscope.exporters import jsonl
from kvscope.exporters.jsonl import JsonlSink
from kvscope.exporters.otlp import settings as otlp_settings
from kvscope.exporters.prometheus import server as metrics_http
from kvscope.exporters.prometheus.server import MetricsServer

KV_EVENTS = "vllm_kv_events"  # the collector whose access stream the what-if analysis replays
log = logging.getLogger("kvscope.wiring")
SINK_METRICS: tuple[MetricSpec, ...] = (*jsonl.METRICS, *otlp_settings.METRICS, *metrics_http.METRICS)


def components() -> Components:
    """Every collector and analysis kvscope can run, by the names its configuration uses."""
    return Components(collectors=collector_specs(),
                      analyses={CORRELATION_SPEC.name: CORRELATION_SPEC, WHATIF_SPEC.name: WHATIF_SPEC})


def all_metric_specs(parts: Components | None = None) -> list[MetricSpec]:
    parts = components() if parts is None else parts
    return [*AGENT_METRICS, *CONTRACT_METRICS, *parts.metrics(), *SINK_METRICS]


def build_catalogue(parts: Components | None = None) -> Catalogue:
    return Catalogue(all_metric_specs(parts))


@dataclass
class Agent:
    config: Config
    store: Store
    scheduler: Scheduler
    collectors: dict[str, Collector]
    analyses: dict[str, Analysis]
    request_records: RecordBuffer
    server: MetricsServer | None
    sinks: list[Sink] = field(default_factory=list)  # the server included, when enabled

    def start(self) -> None:
        self.store.set_gauge("kvscope_build_info", (__version__,), 1.0, time.time())
        for sink in self.sinks:
            sink.start()
        self.scheduler.start()

    def stop(self) -> None:
        self.scheduler.stop()
        for sink in reversed(self.sinks):
            sink.stop()

    def reload(self) -> list[str]:
        """On SIGHUP: every stage with a `reload()` (the HTTP servers: their web config files) re-reads what
        it can without a restart. Returns one line per stage that could not; its old settings stay."""
        problems = []
        for name, part in [*(("exporters", s) for s in self.sinks), *self.collectors.items()]:
            reload = getattr(part, "reload", None)
            if reload is None:
                continue
            try:
                reload()
            except ConfigError as exc:
                problems.append(f"{name}: {exc}")
        return problems


def build_agent(
    config: Config,
    parts: Components | None = None,
    *,
    gpu_intervals: GpuIntervals | None = None,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
    environ: Mapping[str, str] | None = None,
) -> Agent:
    """Builds every enabled stage. `gpu_intervals` stands in for the NVML collector's busy/idle samples
    (the self-test passes the reference engine's device slot); `environ` is where the OTLP exporters read
    the standard OTEL_* variables (the process environment by default)."""
    parts = components() if parts is None else parts
    store = Store(build_catalogue(parts), stale_after=config.agent.stale_after)
    correlation = config.analyses.get(CORRELATION_SPEC.name)
    capacity = correlation[1].record_buffer if correlation is not None else CorrelationOptions().record_buffer
    records = RecordBuffer(capacity)
    # the what-if analysis' inputs: the KV-event collector's sampled G1 accesses, the latest attributed requests
    whatif = config.analyses.get(WHATIF_SPEC.name)
    enabled = frozenset(name for name, (settings, _) in config.collectors.items() if settings.enabled)
    kv_access = (KvAccessLog(whatif[1].queue_blocks)
                 if whatif is not None and whatif[0].enabled and KV_EVENTS in enabled else None)
    recent = RecentRequests(whatif[1].requests) if kv_access is not None and whatif is not None else None
    context = CollectorContext(config.agent.proc_root, config.agent.sys_root, clock, wall_clock, records, enabled,
                               kv_access)

    # readers of the store (the /metrics server, the OTLP exporter) go through the scheduler: the host
    # collectors run when read (agent.collect_on_read)
    scheduler = Scheduler(store, [], max_backoff=config.agent.max_backoff, clock=clock, wall_clock=wall_clock)
    collectors: dict[str, Collector] = {}
    for name, (settings, options) in config.collectors.items():
        if settings.enabled:
            spec = parts.collectors[name]
            collectors[name] = spec.factory(options, context)
            scheduler.add(collector_job(name, collectors[name], config.interval_of(name), config.timeout_of(name),
                                        spec.on_read and config.agent.collect_on_read))
    nvml = collectors.get("nvml")
    if gpu_intervals is None and isinstance(nvml, NvmlCollector):
        gpu_intervals = nvml

    sinks: list[Sink] = []
    request_sinks: list[RequestSink] = []
    if config.exporters.jsonl.enabled:
        writer = JsonlSink(config.exporters.jsonl.path, store, wall_clock=wall_clock)
        sinks.append(writer)
        request_sinks.append(writer)
    environ = os.environ if environ is None else environ
    otlp = otlp_settings.resolve(config.exporters.otlp, environ)
    if otlp.metrics is not None or otlp.traces is not None:
        sinks.extend(_otlp_sinks(otlp, store, request_sinks, environ, wall_clock, scheduler.refresh))
    if recent is not None:
        request_sinks.append(recent)
    inputs = AnalysisInputs(store, records, gpu_intervals, tuple(request_sinks), wall_clock, kv_access, recent)
    analyses: dict[str, Analysis] = {}
    for name, (settings, options) in config.analyses.items():
        if settings.enabled:
            analyses[name] = parts.analyses[name].factory(options, inputs)
            scheduler.add(analysis_job(name, analyses[name], config.interval_of(name), config.timeout_of(name)))

    server = None
    prom = config.exporters.prometheus
    if prom.enabled:
        host, port = parse_listen("exporters.prometheus.listen", prom.listen)
        routes = {path: route for a in analyses.values() if isinstance(a, WhatIfAnalysis)
                  for path, route in a.routes().items()}
        server = MetricsServer(store, host, port, load_web_config(prom.web_config_file), prom.http, routes,
                               scheduler=scheduler)
        sinks.append(server)
    return Agent(config, store, scheduler, collectors, analyses, records, server, sinks)


def _otlp_sinks(settings: otlp_settings.OtlpSettings, store: Store, request_sinks: list[RequestSink],
                environ: Mapping[str, str], wall_clock: Callable[[], float],
                refresh: Callable[[], None]) -> list[Sink]:
    """The OTLP metrics and trace exporters that are enabled; the SDK is imported only here."""
    extras.require("otlp", "exporters.otlp")
    from kvscope.exporters.otlp import sdk as otlp_sdk
    from kvscope.exporters.otlp.metrics import OtlpMetricsSink, StoreMetrics
    from kvscope.exporters.otlp.spans import AttributionSpans, OtlpTracesSink

    resource, scope = otlp_sdk.resource(environ, __version__), otlp_sdk.scope(__version__)
    out: list[Sink] = []
    if settings.metrics is not None:
        dest = settings.metrics
        out.append(OtlpMetricsSink(store, StoreMetrics(store, resource, scope), otlp_sdk.metric_exporter(dest),
                                   settings.interval, dest.timeout, wall_clock, refresh))
        log.info("exporting %s every %g s", dest.describe(), settings.interval)
    if settings.traces is not None:
        dest = settings.traces
        traces = OtlpTracesSink(store, AttributionSpans(resource, scope), otlp_sdk.span_exporter(dest),
                                settings.queue_size, settings.batch_size, wall_clock)
        out.append(traces)
        request_sinks.append(traces)
        log.info("exporting %s, one trace per attributed request", dest.describe())
    return out
