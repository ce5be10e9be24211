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
- What passes between stages beside the store (request records, KV block accesses, GPU intervals,
  attributed requests, extra HTTP routes) is a typed stream (streams.py); each spec says in its
  `StreamUse` which it writes, reads and offers, and the wiring connects them from that alone.
- A collector or sink may have `reload()`: on SIGHUP it re-reads what can change without a restart (the
  HTTP servers' web config files), raising ConfigError and keeping what it had when that fails.

Imports point one way: collectors → core ← analyses ← sinks. The wiring (wiring.py) is the one place
that builds and connects them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar

from kvscope.agent.core.catalogue import MetricSpec
from kvscope.agent.core.readings import Reading
from kvscope.agent.core.store import Store
from kvscope.agent.core.streams import GpuIntervals, RequestSink, Streams, StreamUse

__all__ = ["Analysis", "AnalysisInputs", "AnalysisSpec", "Collector", "CollectorContext", "CollectorSpec",
           "Components", "GpuIntervals", "RequestSink", "Root", "Sink", "SinkInputs", "SinkSpec", "StoreReads"]

Root = Literal["proc", "sys"]
T = TypeVar("T")


class Collector(Protocol):
    def collect(self) -> Iterable[Reading]: ...


@dataclass(frozen=True, slots=True)
class CollectorContext:
    """What the wiring hands every collector factory."""

    proc_root: str = "/proc"
    sys_root: str = "/sys"
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time
    # the collectors config enables (engine autodetection stands down when an engine adapter is among them)
    enabled_collectors: frozenset[str] = frozenset()
    # the streams its spec writes (StreamUse.writes): request records, KV block accesses
    streams: Streams = field(default_factory=Streams)


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
    streams: StreamUse = field(default_factory=StreamUse)


class Analysis(Protocol):
    def run(self) -> Iterable[Reading]: ...


@dataclass(frozen=True, slots=True)
class AnalysisInputs:
    """What the wiring hands every analysis factory."""

    store: Store
    # the streams its spec reads and writes: request records, GPU intervals, the receivers of attributed
    # requests, KV block accesses
    streams: Streams = field(default_factory=Streams)
    wall_clock: Callable[[], float] = time.time
    # the names of the enabled analyses, for one that only reads another's results (None: not known)
    analyses: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class AnalysisSpec:
    """An analysis the agent can run: options schema, factory, the metrics it emits."""

    name: str
    description: str
    options: type
    factory: Callable[[Any, AnalysisInputs], Analysis]
    metrics: tuple[MetricSpec, ...]
    enabled_by_default: bool = True
    streams: StreamUse = field(default_factory=StreamUse)


class Sink(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...


class StoreReads(Protocol):
    """How a sink reads the store through the scheduler (agent/runtime/scheduler.py), so that collectors run
    when read (agent.collect_on_read) have caught up first."""

    inline_budget: float

    def read(self, fn: Callable[[], Any], refresh: bool = True) -> Future[Any]: ...
    def refresh(self) -> None: ...
    def poke(self) -> None: ...


@dataclass(frozen=True, slots=True)
class SinkInputs:
    """What the wiring hands every sink factory."""

    store: Store
    streams: Streams = field(default_factory=Streams)
    reads: StoreReads | None = None
    wall_clock: Callable[[], float] = time.time
    environ: Mapping[str, str] = field(default_factory=dict)  # where the OTEL_* variables are read


@dataclass(frozen=True, slots=True)
class SinkSpec(Generic[T]):
    """A sink the agent can run: the options of its `[exporters.NAME]` section (a dataclass), a factory
    that builds the sinks those options enable (none when off), and the metrics they emit."""

    name: str
    description: str
    options: type[T]
    factory: Callable[[T, SinkInputs], Sequence[Sink]]
    metrics: tuple[MetricSpec, ...]
    streams: StreamUse = field(default_factory=StreamUse)


@dataclass(frozen=True, slots=True)
class Components:
    """Every collector, analysis and sink the agent knows, by the names config enables them with."""

    collectors: Mapping[str, CollectorSpec]
    analyses: Mapping[str, AnalysisSpec]
    sinks: Mapping[str, SinkSpec[Any]] = field(default_factory=dict)

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
        for sink in self.sinks.values():
            out.extend(sink.metrics)
        return out
