"""A job of the scheduler (a collector's `collect()` or an analysis' `run()`), one call of it, and what
follows a call: ingest, health series, backoff. Shared by the scheduler thread and the dedicated runners
(agent/runtime/scheduler.py, agent/runtime/job_threads.py), so a job reports the same way wherever it runs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from kvscope.agent.core.pipeline import Analysis, Collector
from kvscope.agent.core.readings import Reading
from kvscope.agent.core.store import Store

log = logging.getLogger("kvscope.scheduler")

JobKind = Literal["collector", "analysis"]


@dataclass
class Job:
    name: str
    run: Callable[[], Iterable[Reading]]
    interval: float
    timeout: float
    kind: JobKind = "collector"  # which health series it reports under
    start: Callable[[], None] | None = None  # called (and retried) before the first run
    close: Callable[[], None] | None = None  # called once at stop
    # run when its values are read (Scheduler.refresh), at most once per 3/4 interval, not on a timer
    on_read: bool = False
    # an analysis that reads on-read collectors' series: they are refreshed before each of its runs
    reads_on_read: bool = False
    # runs once at start (reporting up) and never again: an analysis none of whose inputs is enabled, which
    # would otherwise wake the agent every interval for nothing
    idle: bool = False


def collector_job(name: str, collector: Collector, interval: float, timeout: float, on_read: bool = False) -> Job:
    # start() and close() are optional parts of the collector interface (push sources have them)
    return Job(name, collector.collect, interval, timeout, "collector",
               getattr(collector, "start", None), getattr(collector, "close", None), on_read)


def analysis_job(name: str, analysis: Analysis, interval: float, timeout: float) -> Job:
    return Job(name, analysis.run, interval, timeout, "analysis", None, getattr(analysis, "close", None),
               reads_on_read=bool(getattr(analysis, "reads_host_series", False)),
               idle=bool(getattr(analysis, "idle", False)))


class Call:
    """One call of a job's run(): when it began and ended, what it returned or raised. `done` is set once
    the thread that made it has recorded the outcome."""

    __slots__ = ("began", "done", "ended", "error", "result")

    def __init__(self, began: float) -> None:
        self.began = began
        self.ended = began
        self.result: list[Reading] | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()

    def execute(self, run: Callable[[], Iterable[Reading]], clock: Callable[[], float]) -> None:
        try:
            self.result = list(run())
        except BaseException as exc:  # a collector may raise anything; it is data here
            self.error = exc
        self.ended = clock()


class JobState:
    """A job's state between its runs: failures, backoff, the error last logged, when it is next due."""

    def __init__(self, job: Job, store: Store, clock: Callable[[], float], wall: Callable[[], float],
                 max_backoff: float, order: int = 0, finished: Callable[[JobState], None] | None = None) -> None:
        self.job = job
        self.order = order  # ties between jobs due at once go to the one listed first
        self._finished = finished
        self._store = store
        self._clock = clock
        self._wall = wall
        self._max_backoff = max_backoff
        self._start = job.start
        self._invalid_logged = False
        self._last_error = ""
        self.failures = 0
        self.delay = job.interval  # the wait before the next run: the interval, or the backoff after a failure
        self.next_due = clock()
        prefix = f"kvscope_{job.kind}"
        self._health_names = (f"{prefix}_up", f"{prefix}_duration_seconds", f"{prefix}_errors_total",
                              f"{prefix}_runs_total")
        self.runs = 0  # runs finished, failed ones included
        self.in_flight = False  # an on-read job asked for or running (set and cleared under the scheduler's lock)

    def stale(self, now: float) -> bool:
        """Whether an on-read job's values are old enough to collect again: 3/4 of its interval after its last
        run (so two readers an interval apart share each run), or when its backoff after a failure ends."""
        return now >= self.next_due - self.job.interval / 4

    def begin(self) -> str:
        """Before a call: the job's start(), until it has succeeded once. Returns an error, or ""."""
        if self._start is None:
            return ""
        try:
            self._start()
        except Exception as exc:
            return f"start failed: {exc!r}"
        self._start = None
        return ""

    def finish_call(self, call: Call) -> float:
        """After a call that returned or raised; returns when the job is next due."""
        if call.error is not None:
            # str() of an OSError names the file (a missing /host/proc/diskstats); repr() does not
            return self.finish(call.began, f"raised {type(call.error).__name__}: {call.error}")
        return self.finish(call.began, "", call.result or [])

    def finish(self, began: float, error: str, result: list[Reading] | None = None) -> float:
        """After a run (`error` "" and its readings, or why it failed); returns when the job is next due."""
        job, store = self.job, self._store
        ingested = False
        if not error and result is not None:
            outcome = store.ingest(job.name, result, self._wall())
            ingested = True
            if outcome.rejected:
                error = f"returned {outcome.rejected} readings that are not catalogued"
            if outcome.invalid and not self._invalid_logged:
                self._invalid_logged = True
                log.warning("%s %s: %d reading(s) with an impossible value (a negative or non-finite counter, "
                            "...) were left out (kvscope_store_invalid_values_total; logged once)",
                            job.kind, job.name, outcome.invalid)
        duration = self._clock() - began
        if error:
            self.failures += 1
            if not ingested:  # readings that were stored stay fresh even when some were rejected
                store.collection_failed(job.name, self._wall())
            if error != self._last_error:
                log.warning("%s %s: %s (retrying with backoff)", job.kind, job.name, error)
            self._last_error = error
            self.health(up=False, duration=duration, error=True)
            self.delay = min(job.interval * 2.0 ** min(self.failures, 16), self._max_backoff)
            self.next_due = self._clock() + self.delay
            return self._done()
        if self._last_error:
            log.info("%s %s: recovered", job.kind, job.name)
        self.failures, self._last_error, self.delay = 0, "", job.interval
        self.health(up=True, duration=duration, error=False)
        if job.on_read:  # its values are as fresh as this run
            self.next_due = began + job.interval
            return self._done()
        self.next_due += job.interval
        if self.next_due < self._clock():  # fell behind: skip missed ticks instead of bursting
            self.next_due = self._clock() + job.interval
        return self._done()

    def _done(self) -> float:
        if self._finished is not None:
            self._finished(self)
        return self.next_due

    def health(self, up: bool, duration: float, error: bool, run: bool = True) -> None:
        up_name, duration_name, errors_name, runs_name = self._health_names
        labels = (self.job.name,)
        self._store.update_internal(
            [(up_name, labels, 1.0 if up else 0.0), (duration_name, labels, duration)],
            [(errors_name, labels, 1.0 if error else 0.0), (runs_name, labels, 1.0 if run else 0.0)], self._wall())
