"""Wiring: from a Config to a running agent (store, scheduler, exporters)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from kvscope import __version__
from kvscope.agent.catalogue import AGENT_METRICS, Catalogue, MetricSpec
from kvscope.agent.config import Config, parse_listen
from kvscope.agent.contract import CONTRACT_METRICS
from kvscope.agent.scheduler import Job, Scheduler
from kvscope.agent.store import Store
from kvscope.collectors.base import CollectorContext, CollectorSpec
from kvscope.collectors.registry import collector_specs
from kvscope.exporters.http import MetricsServer
from kvscope.exporters.webconfig import load_web_config

log = logging.getLogger("kvscope")


def all_metric_specs(specs: Mapping[str, CollectorSpec] | None = None) -> list[MetricSpec]:
    specs = collector_specs() if specs is None else specs
    out: list[MetricSpec] = [*AGENT_METRICS, *CONTRACT_METRICS]
    for spec in specs.values():
        out.extend(spec.metrics)
    return out


def build_catalogue(specs: Mapping[str, CollectorSpec] | None = None) -> Catalogue:
    return Catalogue(all_metric_specs(specs))


@dataclass
class Agent:
    config: Config
    store: Store
    scheduler: Scheduler
    server: MetricsServer | None
    context: CollectorContext = field(default_factory=CollectorContext)

    def start(self) -> None:
        self.store.set_gauge("kvscope_build_info", (__version__,), 1.0, time.time())
        self.scheduler.start()
        if self.server is not None:
            self.server.start()

    def stop(self) -> None:
        self.scheduler.stop()
        if self.server is not None:
            self.server.stop()


def build_agent(
    config: Config,
    specs: Mapping[str, CollectorSpec] | None = None,
    context: CollectorContext | None = None,
) -> Agent:
    specs = collector_specs() if specs is None else specs
    context = context or CollectorContext(proc_root=config.agent.proc_root, sys_root=config.agent.sys_root)
    store = Store(build_catalogue(specs), history=config.agent.history)
    # What collectors share: the correlation engine reads the store and the GPU collector's idle
    # intervals; the OTLP receiver and the engine share a record buffer they create themselves.
    context.extras["store"] = store
    jobs = []
    for name, (settings, options) in config.collectors.items():
        if not settings.enabled:
            continue
        collector = specs[name].factory(options, context)
        if hasattr(collector, "recent_samples") and hasattr(collector, "gpus"):
            context.extras["gpu_intervals"] = collector
        jobs.append(Job(name, collector, config.interval_of(name), config.timeout_of(name)))
    scheduler = Scheduler(store, jobs, max_backoff=config.agent.max_backoff)
    server = None
    prom = config.exporters.prometheus
    if prom.enabled:
        host, port = parse_listen("exporters.prometheus.listen", prom.listen)
        server = MetricsServer(store, host, port, load_web_config(prom.web_config_file))
    return Agent(config, store, scheduler, server, context)
