"""The agent's own cost, under the standard `process_*` names every Prometheus client library exports.

A sidecar in every inference pod has to show what it costs, in the same exposition as its data, under
the names dashboards for any exporter already chart (`process_cpu_seconds_total`,
`process_resident_memory_bytes`, ...). The figures are those of prometheus-client's `ProcessCollector`,
for the agent's own process whatever `agent.proc_root` says (a host /proc mounted elsewhere does not
contain the agent's view of itself), read for less: the CPU time from the process clock (the same
user + system time, to the nanosecond instead of the 10 ms tick), the memory sizes from /proc/self/statm
kept open, the descriptor limit from getrlimit, the start time once. What reads them is injected, so
tests can hand in another.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvscope.agent.core.catalogue import counter, gauge
from kvscope.agent.core.pipeline import CollectorContext, CollectorSpec
from kvscope.agent.core.readings import Reading, Sample
from kvscope.collectors.host.inputs import KernelFile

_SOURCE = "the agent's own process (/proc/self, getrlimit, its CPU clock)"
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


def start_time(stat: str, proc_stat: str, ticks: float) -> float:
    """Seconds since the epoch the process started: /proc/<pid>/stat's starttime (clock ticks after boot)
    plus /proc/stat's btime."""
    since_boot = float(stat.rsplit(")", 1)[1].split()[19]) / ticks
    btime = next(float(line.split()[1]) for line in proc_stat.splitlines() if line.startswith("btime "))
    return btime + since_boot


class SelfStats:
    """This process' figures, by their exposed names."""

    def __init__(self) -> None:
        self._statm = KernelFile("/proc/self/statm")
        self._page = resource.getpagesize()
        with open("/proc/self/stat") as stat, open("/proc/stat") as proc_stat:
            self._start = start_time(stat.read(), proc_stat.read(), os.sysconf("SC_CLK_TCK"))

    def __call__(self) -> dict[str, float]:
        size, resident = self._statm.read().split()[:2]
        return {
            "process_cpu_seconds_total": time.process_time(),
            "process_resident_memory_bytes": float(int(resident) * self._page),
            "process_virtual_memory_bytes": float(int(size) * self._page),
            "process_start_time_seconds": self._start,
            "process_open_fds": float(len(os.listdir("/proc/self/fd"))),
            "process_max_fds": float(resource.getrlimit(resource.RLIMIT_NOFILE)[0]),
        }


@dataclass
class ProcessOptions:
    pass  # nothing to choose: it always describes this process


class ProcessCollector:
    def __init__(self, read: Callable[[], dict[str, float]]) -> None:
        self._read = read

    def collect(self) -> list[Reading]:
        return [Sample(name, (), value) for name, value in self._read().items() if name in _NAMES]


def build(options: ProcessOptions, context: CollectorContext) -> ProcessCollector:
    return ProcessCollector(SelfStats())


SPEC = CollectorSpec(
    name="process",
    description="The agent's own CPU time, memory and file descriptors (standard process_* metrics)",
    options=ProcessOptions,
    factory=build,
    metrics=METRICS,
    on_read=True,
)
