"""The interfaces of kvscope's pipeline: sources (collectors) → store → analyses → sinks.

- A **collector** reads one source and returns readings (`collect()`); optional `start()` (push sources
  with a background thread or listener) and `close()`. It is built by its spec's factory from its
  options and a `CollectorContext`: everything it touches is in there, typed, and nothing else.
- The **store** (store.py) keeps the current value of every series and owns counter resets and staleness.
- An **analysis** reads the store and the request records and returns readings of its own metrics
  (`run()`, once per interval); per-request results go to its request sinks. The scheduler runs it with
  its own interval, timeout and health series, as it runs collectors.
- A **sink** takes what the store and the analyses hold out of the process (`start()`/`stop()`):
  the Prometheus endpoint, the JSON Lines file. A `RequestSink` receives attributed requests.
- A collector or sink may have `reload()`: on SIGHUP it re-reads what can change without a restart (the
  HTTP servers' web config files), raising ConfigError and keeping what it had when that fails.

Imports point one way: collectors → core ← analyses ← sinks. The wiring (wiring.py) is the one place
that builds and connects them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from kvscope.agent.core.catalogue import MetricSpec
from kvscope.agent.core.kv_access import KvAccessLog
from kvscope.agent.core.readings import Reading
from kvscope.agent.core.records import AttributedRequest, RecentRequests, RecordBuffer
from kvscope.agent.core.store import Store

Root = Literal["proc", "sys"]


class Collector(Protocol):
    def collect(self) -> Iterable[Reading]: ...


@dataclass(frozen=True, slots=True)
class CollectorContext:
    """What the wiring hands every collector factory."""

    proc_root: str = "/proc"
    sys_root: str = "/sys"
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time
    # where per-request sources (OTLP spans) put their records for the correlation analysis
    request_records: RecordBuffer = field(default_factory=RecordBuffer)
    # the collectors config enables (engine autodetection stands down when an engine adapter is among them)
    enabled_collectors: frozenset[str] = frozenset()
    # where the KV-event collector hands its sampled G1 accesses to the what-if analysis (None: it is off)
    kv_access: KvAccessLog | None = None


@dataclass(frozen=True, slots=True)
class CollectorSpec:
    """A registry entry: options schema (a dataclass), factory, the metrics it emits."""

    name: str
    description: str
    options: type
    factory: Callable[[Any, CollectorContext], Collector]
    metrics: tuple[MetricSpec, ...]
    enabled_by_default: bool = True
    # the host trees it reads below agent.proc_root / agent.sys_root ("proc", "sys"): checked before a run
    roots: tuple[Root, ...] = ()
    # its readings are counters its source keeps (the kernel's): collected when read, not on a timer
    # (agent.collect_on_read, agent/runtime/scheduler.py)
    on_read: bool = False


class GpuIntervals(Protocol):
    """Recent busy/idle samples per GPU (the NVML collector, or the reference engine's device slot)."""

    def gpus(self) -> dict[str, str]: ...
    def recent_samples(self, gpu: str) -> list[tuple[float, float, float]]: ...


class RequestSink(Protocol):
    """Receives each window's attributed requests (called from the analysis' thread; must not block long)."""

    def write(self, results: Sequence[AttributedRequest]) -> None: ...


class Analysis(Protocol):
    def run(self) -> Iterable[Reading]: ...


@dataclass(frozen=True, slots=True)
class AnalysisInputs:
    """What the wiring hands every analysis factory."""

    store: Store
    request_records: RecordBuffer
    gpu_intervals: GpuIntervals | None = None
    request_sinks: Sequence[RequestSink] = ()
    wall_clock: Callable[[], float] = time.time
    # the KV-event collector's sampled G1 accesses, and the latest attributed requests (the what-if analysis)
    kv_access: KvAccessLog | None = None
    recent_requests: RecentRequests | None = None


@dataclass(frozen=True, slots=True)
class AnalysisSpec:
    """An analysis the agent can run: options schema, factory, the metrics it emits."""

    name: str
    description: str
    options: type
    factory: Callable[[Any, AnalysisInputs], Analysis]
    metrics: tuple[MetricSpec, ...]
    enabled_by_default: bool = True


class Sink(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Components:
    """Every collector and analysis the agent knows, by the names config enables them with."""

    collectors: Mapping[str, CollectorSpec]
    analyses: Mapping[str, AnalysisSpec]

    def __post_init__(self) -> None:
        both = set(self.collectors) & set(self.analyses)
        if both:
            raise ValueError(f"names used by a collector and an analysis: {', '.join(sorted(both))}")

    def metrics(self) -> list[MetricSpec]:
        out: list[MetricSpec] = []
        for spec in self.collectors.values():
            out.extend(spec.metrics)
        for analysis in self.analyses.values():
            out.extend(analysis.metrics)
        return out
