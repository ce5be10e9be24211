"""The agent's own cost: CPU seconds, resident memory and open file descriptors of this process.

A sidecar in every inference pod has to show what it costs, in the same exposition as its data.
psutil reads /proc/self (the agent's own process, whatever `agent.proc_root` says: a host /proc
mounted elsewhere does not contain the agent's view of itself). The process handle is injected so
tests can hand in another one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import psutil

from kvscope.agent.catalogue import counter, gauge
from kvscope.agent.readings import Reading, Sample
from kvscope.collectors.base import CollectorContext, CollectorSpec

METRICS = (
    counter("kvscope_agent_cpu_seconds_total", "seconds", (),
            "CPU time (user + system) used by the kvscope process.", "psutil (/proc/self/stat)"),
    gauge("kvscope_agent_resident_memory_bytes", "bytes", (),
          "Resident set size of the kvscope process.", "psutil (/proc/self/statm)"),
    gauge("kvscope_agent_open_fds", "", (), "File descriptors open in the kvscope process.", "psutil (/proc/self/fd)"),
)


class _CpuTimes(Protocol):
    @property
    def user(self) -> float: ...
    @property
    def system(self) -> float: ...


class _Memory(Protocol):
    @property
    def rss(self) -> int: ...


class ProcessLike(Protocol):
    """The slice of `psutil.Process` this collector uses."""

    def cpu_times(self) -> _CpuTimes: ...
    def memory_info(self) -> _Memory: ...
    def num_fds(self) -> int: ...


@dataclass
class AgentSelfOptions:
    pass  # nothing to choose: it always describes this process


class AgentSelfCollector:
    def __init__(self, process: ProcessLike) -> None:
        self._process = process

    def collect(self) -> list[Reading]:
        times = self._process.cpu_times()
        return [
            Sample("kvscope_agent_cpu_seconds_total", (), times.user + times.system),
            Sample("kvscope_agent_resident_memory_bytes", (), float(self._process.memory_info().rss)),
            Sample("kvscope_agent_open_fds", (), float(self._process.num_fds())),
        ]


def build(options: AgentSelfOptions, context: CollectorContext) -> AgentSelfCollector:
    return AgentSelfCollector(psutil.Process())


SPEC = CollectorSpec(
    name="agent_self",
    description="The agent's own CPU time, resident memory and open file descriptors (psutil)",
    options=AgentSelfOptions,
    factory=build,
    metrics=METRICS,
)
