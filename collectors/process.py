"""The agent's own cost, under the standard `process_*` names every Prometheus client library exports.

A sidecar in every inference pod has to show what it costs, in the same exposition as its data, under
the names dashboards for any exporter already chart (`process_cpu_seconds_total`,
`process_resident_memory_bytes`, ...). prometheus-client's own `ProcessCollector` reads them from
/proc/self: the agent's own process, whatever `agent.proc_root` says (a host /proc mounted elsewhere
does not contain the agent's view of itself). The source is injected so tests can hand in another.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.metrics_core import Metric
from prometheus_client.process_collector import ProcessCollector as ClientProcessCollector

from kvscope.agent.catalogue import counter, gauge
from kvscope.agent.pipeline import CollectorContext, CollectorSpec
from kvscope.agent.readings import Reading, Sample

_SOURCE = "prometheus-client ProcessCollector (/proc/self)"
METRICS = (
    counter("process_cpu_seconds_total", "seconds", (), "Total user and system CPU time spent in seconds.", _SOURCE),
    gauge("process_resident_memory_bytes", "bytes", (), "Resident memory size in bytes.", _SOURCE),
    gauge("process_virtual_memory_bytes", "bytes", (), "Virtual memory size in bytes.", _SOURCE),
    gauge("process_start_time_seconds", "seconds", (), "Start time of the process since unix epoch in seconds.",
          _SOURCE),
    gauge("process_open_fds", "", (), "Number of open file descriptors.", _SOURCE),
    gauge("process_max_fds", "", (), "Maximum number of open file descriptors.", _SOURCE),
)
_NAMES = frozenset(spec.name for spec in METRICS)


class MetricSource(Protocol):
    """A prometheus-client collector: families whose samples carry the exposed names."""

    def collect(self) -> Iterable[Metric]: ...


@dataclass
class ProcessOptions:
    pass  # nothing to choose: it always describes this process


class ProcessCollector:
    def __init__(self, source: MetricSource) -> None:
        self._source = source

    def collect(self) -> list[Reading]:
        return [Sample(s.name, (), float(s.value)) for family in self._source.collect()
                for s in family.samples if s.name in _NAMES]


def build(options: ProcessOptions, context: CollectorContext) -> ProcessCollector:
    return ProcessCollector(ClientProcessCollector(registry=None))


SPEC = CollectorSpec(
    name="process",
    description="The agent's own CPU time, memory and file descriptors (standard process_* metrics)",
    options=ProcessOptions,
    factory=build,
    metrics=METRICS,
    on_read=True,
)
