"""The wiring: from a Config to a running agent. The one place that builds and connects the pipeline.

sources (collectors) → store → analyses → sinks. Every stage comes from its spec (collectors/registry.py,
the analyses' SPECs, exporters/registry.py); what passes between stages beside the store is a typed
stream (agent/core/streams.py) that each spec declares it writes, reads or offers, and the wiring
connects them from those declarations alone: the request-record buffer (OTLP receiver → correlation
analysis, sized by `analyses.correlation.record_buffer`), the KV access log (KV-event collector → what-if
analysis, made only when both are on), the GPU busy intervals (the NVML collector, or whatever the caller
passes), the receivers of attributed requests (JSON Lines, OTLP traces, the what-if analysis), the routes
served beside /metrics. Nothing on this path imports the reference pipeline, the self-test or the
offline reports, nor the OpenTelemetry SDK unless an OTLP exporter is enabled (the `otlp` extra).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from kvscope import __version__
from kvscope.agent.analyses.correlation.analysis import SPEC as CORRELATION_SPEC
from kvscope.agent.analyses.value.analysis import SPEC as VALUE_SPEC
from kvscope.agent.analyses.whatif.analysis import SPEC as WHATIF_SPEC
from kvscope.agent.config.settings import Config, ConfigError
from kvscope.agent.core.catalogue import AGENT_METRICS, Catalogue, MetricSpec
from kvscope.agent.core.contract import CONTRACT_METRICS
from kvscope.agent.core.pipeline import (
    Analysis,
    AnalysisInputs,
    Collector,
    CollectorContext,
    Components,
    Sink,
    SinkInputs,
)
from kvscope.agent.core.records import RecordBuffer
from kvscope.agent.core.store import Store
from kvscope.agent.core.streams import GPU_INTERVALS, REQUEST_RECORDS, GpuIntervals, Streams, StreamUse
from kvscope.agent.runtime.scheduler import Scheduler, analysis_job, collector_job
from kvscope.collectors.registry import collector_specs
from kvscope.exporters.prometheus.server import SPEC as PROMETHEUS
from kvscope.exporters.prometheus.server import MetricsServer
from kvscope.exporters.registry import sink_specs

log = logging.getLogger("kvscope.wiring")


def components() -> Components:
    """Every collector, analysis and sink kvscope can run, by the names its configuration uses."""
    return Components(collectors=collector_specs(),
                      analyses={CORRELATION_SPEC.name: CORRELATION_SPEC, WHATIF_SPEC.name: WHATIF_SPEC,
                                VALUE_SPEC.name: VALUE_SPEC},
                      sinks=sink_specs())


def all_metric_specs(parts: Components | None = None) -> list[MetricSpec]:
    parts = components() if parts is None else parts
    return [*AGENT_METRICS, *CONTRACT_METRICS, *parts.metrics()]


def build_catalogue(parts: Components | None = None) -> Catalogue:
    return Catalogue(all_metric_specs(parts))


@dataclass
class Agent:
    config: Config
    store: Store
    scheduler: Scheduler
    collectors: dict[str, Collector]
    analyses: dict[str, Analysis]
    streams: Streams
    sinks: list[Sink] = field(default_factory=list)  # in start order: the /metrics server last
    sinks_by_spec: dict[str, list[Sink]] = field(default_factory=dict)

    @property
    def server(self) -> MetricsServer | None:
        """The /metrics server, when `[exporters.prometheus]` enables it."""
        built = self.sinks_by_spec.get(PROMETHEUS.name)
        return cast(MetricsServer, built[0]) if built else None

    @property
    def request_records(self) -> RecordBuffer | None:
        return self.streams.get(REQUEST_RECORDS)

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
    enabled_collectors = {name: (parts.collectors[name], options)
                          for name, (settings, options) in config.collectors.items() if settings.enabled}
    enabled_analyses = {name: (parts.analyses[name], options)
                        for name, (settings, options) in config.analyses.items() if settings.enabled}
    sections = {name: config.exporter(spec) for name, spec in parts.sinks.items()}
    streams = Streams()
    if gpu_intervals is not None:
        streams.offer(GPU_INTERVALS, gpu_intervals)  # offered first: it is the one readers get
    make_streams(streams, [*((spec.streams, options) for spec, options in enabled_collectors.values()),
                           *((spec.streams, options) for spec, options in enabled_analyses.values()),
                           *((spec.streams, sections[name]) for name, spec in parts.sinks.items())])

    # readers of the store (the /metrics server, the OTLP exporter) go through the scheduler: the host
    # collectors run when read (agent.collect_on_read)
    scheduler = Scheduler(store, [], max_backoff=config.agent.max_backoff, clock=clock, wall_clock=wall_clock)
    context = CollectorContext(config.agent.proc_root, config.agent.sys_root, clock, wall_clock,
                               frozenset(enabled_collectors), streams)
    collectors: dict[str, Collector] = {}
    for name, (spec, options) in enabled_collectors.items():
        collectors[name] = spec.factory(options, context)
        _offer(streams, spec.streams, [collectors[name]])
        scheduler.add(collector_job(name, collectors[name], config.interval_of(name), config.timeout_of(name),
                                    spec.on_read and config.agent.collect_on_read))
    inputs = AnalysisInputs(store, streams, wall_clock, frozenset(enabled_analyses))
    analyses: dict[str, Analysis] = {}
    for name, (aspec, options) in enabled_analyses.items():
        analyses[name] = aspec.factory(options, inputs)
        _offer(streams, aspec.streams, [analyses[name]])
        scheduler.add(analysis_job(name, analyses[name], config.interval_of(name), config.timeout_of(name)))
    sink_inputs = SinkInputs(store, streams, scheduler, wall_clock, os.environ if environ is None else environ)
    sinks: list[Sink] = []
    by_spec: dict[str, list[Sink]] = {}
    for name, sspec in parts.sinks.items():
        built = list(sspec.factory(sections[name], sink_inputs))
        _offer(streams, sspec.streams, built)
        sinks.extend(built)
        if built:
            by_spec[name] = built
    return Agent(config, store, scheduler, collectors, analyses, streams, sinks, by_spec)


def make_streams(streams: Streams, uses: Iterable[tuple[StreamUse, Any]]) -> None:
    """Makes each buffer stream that an enabled stage writes and one reads (or that a writer alone needs),
    at the largest size its readers ask for."""
    uses = list(uses)
    named = dict.fromkeys(s for use, _ in uses for s in (*use.writes, *use.reads) if s.make is not None)
    for stream in named:
        read = [(use.reads[stream], options) for use, options in uses if stream in use.reads]
        if any(stream in use.writes for use, _ in uses) and (read or not stream.needs_reader):
            sizes = [size(options) for size, options in read if size is not None]
            streams.make(stream, max(sizes, default=stream.default_size))


def _offer(streams: Streams, use: StreamUse, built: Iterable[Any]) -> None:
    for stage in built:
        for stream, offered in use.offers.items():
            value = offered(stage)
            if value is not None:
                streams.offer(stream, value)
