"""Fetch stall: GPU idle time while requests wait on KV fetch and nothing computes (correlation.md §5)."""

from __future__ import annotations

from collections import deque

from kvscope.agent.analyses.correlation import cross_layer as signals
from kvscope.agent.analyses.correlation import metrics as m
from kvscope.agent.analyses.correlation.state import Outputs
from kvscope.agent.core.pipeline import GpuIntervals
from kvscope.agent.core.records import Interval

MAX_PENDING_REQUESTS = 100_000  # requests' phase intervals held until the stall horizon passes them


class StallTracker:
    def __init__(self, gpus: GpuIntervals | None, settle_seconds: float, outputs: Outputs) -> None:
        self._gpus, self._settle, self._out = gpus, settle_seconds, outputs
        self._intervals: deque[tuple[list[Interval], list[Interval]]] = deque(maxlen=MAX_PENDING_REQUESTS)
        self._done: float | None = None

    def add(self, intervals: list[tuple[list[Interval], list[Interval]]]) -> None:
        self._intervals.extend(intervals)

    def step(self, now: float) -> None:
        """Fetch stall over [done, now − settle]: late records (spans come at request end) still count."""
        horizon = now - self._settle
        if self._done is None:
            self._done = horizon
            return
        if self._gpus is None or horizon <= self._done or not self._intervals:
            return
        fetching = signals.union(i for f, _ in self._intervals for i in f)
        computing = signals.union(i for _, c in self._intervals for i in c)
        fetch_only = signals.clip(signals.subtract(fetching, computing), self._done, horizon)
        for gpu in self._gpus.gpus():
            self._out.counters[(m.FETCH_STALL, (gpu,))] += signals.stall_seconds(
                self._gpus.recent_samples(gpu), fetch_only)
        self._done = horizon
        while self._intervals and max((e for _, e in self._intervals[0][0] + self._intervals[0][1]),
                                      default=horizon) <= horizon:
            self._intervals.popleft()
