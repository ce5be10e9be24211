"""The tiny interface every collector implements, and how the agent finds collectors by name.

A collector is constructed with everything it touches injected (paths, HTTP client, NVML module,
ZMQ context, clock) and offers `collect()`, which returns readings. Optional `start()` (for push
sources with a background thread) and `close()` are called when present. Parsing lives in pure
functions beside the collector, tested on literal captured input.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvscope.agent.catalogue import MetricSpec
from kvscope.agent.readings import Reading


class Collector(Protocol):
    def collect(self) -> Iterable[Reading]: ...


@dataclass(frozen=True, slots=True)
class CollectorContext:
    """What the agent hands every collector factory."""

    proc_root: str = "/proc"
    sys_root: str = "/sys"
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CollectorSpec:
    """A registry entry: options schema (a dataclass), factory, the metrics it emits."""

    name: str
    description: str
    options: type
    factory: Callable[[Any, CollectorContext], Collector]
    metrics: tuple[MetricSpec, ...]
    enabled_by_default: bool = True
