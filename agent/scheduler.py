"""The scheduler: every enabled collector and analysis on its own interval, with a timeout, in isolation.

Each job (a collector's `collect()` or an analysis' `run()`) has a runner thread (timing, health,
backoff) and a worker thread (the call itself). A job that raises, hangs past its timeout or returns
garbage affects only itself: it reports `kvscope_collector_up=0` (`kvscope_analysis_up` for an
analysis), counts `kvscope_collector_errors_total`, and is retried with exponential backoff. A hung
call is never abandoned into a second concurrent call: the job is retried only once the stuck call has
returned. Threads are daemons, so a collector stuck in a system call cannot keep the agent from
shutting down.

A worker thread never ends while the agent runs (it takes whatever a call raises as that call's
error). Should it end all the same, its job reports up=0 for that run and gets a fresh worker: a dead
worker is never waited on as if it were a hung call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from kvscope.agent.pipeline import Analysis, Collector
from kvscope.agent.readings import Reading
from kvscope.agent.store import Store

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


def collector_job(name: str, collector: Collector, interval: float, timeout: float) -> Job:
    # start() and close() are optional parts of the collector interface (push sources have them)
    return Job(name, collector.collect, interval, timeout, "collector",
               getattr(collector, "start", None), getattr(collector, "close", None))


def analysis_job(name: str, analysis: Analysis, interval: float, timeout: float) -> Job:
    return Job(name, analysis.run, interval, timeout, "analysis", None, getattr(analysis, "close", None))


class _Worker:
    """A daemon thread that runs one collect() at a time on request."""

    def __init__(self, name: str, call: Callable[[], list[Reading]]) -> None:
        self._call = call
        self._request = threading.Event()
        self.done = threading.Event()
        self.done.set()
        self.result: list[Reading] | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=f"collect-{name}", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self) -> None:
        self.result, self.error = None, None
        self.done.clear()
        self._request.set()

    def _loop(self) -> None:
        while True:
            self._request.wait()
            self._request.clear()
            try:
                self.result = self._call()
            except BaseException as exc:  # a collector may raise anything; it is data here
                self.error = exc
            self.done.set()


class Scheduler:
    def __init__(
        self,
        store: Store,
        jobs: list[Job],
        max_backoff: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.jobs = jobs
        self.max_backoff = max_backoff
        self._clock = clock
        self._wall = wall_clock
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for job in self.jobs:
            self._health(job, up=True, duration=0.0, error=False, run=False)
            thread = threading.Thread(target=self._run, args=(job,), name=f"run-{job.name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        deadline = self._clock() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - self._clock()))
        for job in self.jobs:
            if job.close is not None:
                try:
                    job.close()
                except Exception:
                    log.exception("%s %s failed to close", job.kind, job.name)

    def _health(self, job: Job, up: bool, duration: float, error: bool, run: bool = True) -> None:
        now = self._wall()
        labels, prefix = (job.name,), f"kvscope_{job.kind}"
        self.store.set_gauge(f"{prefix}_up", labels, 1.0 if up else 0.0, now)
        self.store.set_gauge(f"{prefix}_duration_seconds", labels, duration, now)
        self.store.bump(f"{prefix}_errors_total", labels, 1.0 if error else 0.0, now)
        self.store.bump(f"{prefix}_runs_total", labels, 1.0 if run else 0.0, now)
        held, exported = self.store.size()
        self.store.set_gauge("kvscope_store_series", ("held",), float(held), now)
        self.store.set_gauge("kvscope_store_series", ("exported",), float(exported), now)

    def _run(self, job: Job) -> None:
        def call() -> list[Reading]:
            return list(job.run())

        worker = _Worker(job.name, call)
        start = job.start
        invalid_logged = False
        failures = 0
        next_due = self._clock()
        last_error = ""
        while not self._stop.wait(max(0.0, next_due - self._clock())):
            began = self._clock()
            error = ""
            ingested = False
            if start is not None:
                try:
                    start()
                    start = None
                except Exception as exc:
                    error = f"start failed: {exc!r}"
            if not error and not worker.alive:
                worker = _Worker(job.name, call)
                error = "its worker thread had stopped; started a new one"
            elif not error:
                worker.submit()
                if not worker.done.wait(job.timeout):
                    error = (f"no answer within its {job.timeout:g} s timeout" if worker.alive
                             else "its worker thread stopped during the call")
                elif worker.error is not None:
                    # str() of an OSError names the file (a missing /host/proc/diskstats); repr() does not
                    error = f"raised {type(worker.error).__name__}: {worker.error}"
                else:
                    result = self.store.ingest(job.name, worker.result or [], self._wall())
                    ingested = True
                    if result.rejected:
                        error = f"returned {result.rejected} readings that are not catalogued"
                    if result.invalid and not invalid_logged:
                        invalid_logged = True
                        log.warning("%s %s: %d reading(s) with an impossible value (a negative or non-finite "
                                    "counter, ...) were left out (kvscope_store_invalid_values_total; logged "
                                    "once)", job.kind, job.name, result.invalid)
            duration = self._clock() - began
            if error:
                failures += 1
                if not ingested:  # readings that were stored stay fresh even when some were rejected
                    self.store.collection_failed(job.name, self._wall())
                if error != last_error:
                    log.warning("%s %s: %s (retrying with backoff)", job.kind, job.name, error)
                last_error = error
                self._health(job, up=False, duration=duration, error=True)
                delay = min(job.interval * 2.0 ** min(failures, 16), self.max_backoff)
                next_due = self._clock() + delay
                # a hung call is waited out: never two calls into one collector at once
                while not worker.done.is_set() and worker.alive and not self._stop.wait(min(delay, 1.0)):
                    pass
            else:
                if last_error:
                    log.info("%s %s: recovered", job.kind, job.name)
                failures, last_error = 0, ""
                self._health(job, up=True, duration=duration, error=False)
                next_due += job.interval
                if next_due < self._clock():  # fell behind: skip missed ticks instead of bursting
                    next_due = self._clock() + job.interval
