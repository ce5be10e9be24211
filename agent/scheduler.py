"""The scheduler: every enabled collector and analysis on its own interval, with a timeout, in isolation.

One thread runs every job's `collect()` / `run()` inline, in order of due time, so an idle agent wakes
once per tick however many collectors it has. A watchdog thread watches the call in progress: a call that
runs longer than INLINE_BUDGET (or its job's timeout, if that is shorter) is handed to a thread of its
own, and a fresh scheduler thread carries on with the other jobs. That job keeps its own thread from then
on (agent/scheduler_threads.py: a runner and a worker, the call's timeout enforced by the runner). A
quick collector thus costs one call per tick and no thread switch; a slow or hanging one costs what it
cost before, a runner and a worker of its own, and never delays the others by more than INLINE_BUDGET.

Isolation is the same either way. A job that raises, hangs past its timeout or returns garbage affects
only itself: it reports `kvscope_collector_up=0` (`kvscope_analysis_up` for an analysis), counts
`kvscope_collector_errors_total`, and is retried with exponential backoff. A hung call is never
abandoned into a second concurrent call: the job is retried only once the stuck call has returned.
Threads are daemons, so a collector stuck in a system call cannot keep the agent from shutting down.

The scheduler thread takes whatever a call raises as that call's error. Should it end all the same, the
watchdog starts a new one (the job whose call it was running reports up=0 for that run); a dedicated
worker that ends is replaced by its runner in the same way.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable

from kvscope.agent.scheduler_jobs import Call, Job, JobState, analysis_job, collector_job
from kvscope.agent.scheduler_threads import DedicatedRunner
from kvscope.agent.store import Store

__all__ = ["INLINE_BUDGET", "Job", "Scheduler", "analysis_job", "collector_job"]

log = logging.getLogger("kvscope.scheduler")

INLINE_BUDGET = 0.1  # seconds an inline call may run before its job gets a thread of its own


class Scheduler:
    def __init__(
        self,
        store: Store,
        jobs: list[Job],
        max_backoff: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        inline_budget: float = INLINE_BUDGET,
    ) -> None:
        self.store = store
        self.jobs = jobs
        self.max_backoff = max_backoff
        self.inline_budget = inline_budget
        self._clock = clock
        self._wall = wall_clock
        self._stop = threading.Event()
        self._lock = threading.Lock()  # guards the hand-over of the call in progress
        self._states = [JobState(job, store, clock, wall_clock, max_backoff) for job in jobs]
        self._due: list[tuple[float, int, JobState]] = []  # the inline jobs' next runs (a heap)
        self._current: Call | None = None  # the inline call in progress
        self._current_state: JobState | None = None
        self._idle_until = 0.0  # when the scheduler thread next wakes, while it sleeps
        self._thread: threading.Thread | None = None
        self._generation = 0  # scheduler threads started; a thread whose number is not this one ends
        self._watchdog: threading.Thread | None = None
        self.dedicated: dict[str, DedicatedRunner] = {}  # jobs that run on threads of their own, by name

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        now = self._clock()
        for order, state in enumerate(self._states):
            state.health(up=True, duration=0.0, error=False, run=False)
            state.next_due = now
            self._due.append((now, order, state))
        heapq.heapify(self._due)
        with self._lock:
            self._start_thread()
        self._watchdog = threading.Thread(target=self._watch, name="kvscope-watchdog", daemon=True)
        self._watchdog.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        deadline = self._clock() + timeout
        threads = [self._thread, self._watchdog, *(r.thread for r in list(self.dedicated.values()))]
        for thread in threads:
            if thread is not None:
                thread.join(max(0.0, deadline - self._clock()))
        for job in self.jobs:
            if job.close is not None:
                try:
                    job.close()
                except Exception:
                    log.exception("%s %s failed to close", job.kind, job.name)

    def threads(self) -> int:
        """Threads the scheduler runs now: its own, the watchdog, and the dedicated jobs' runners and workers."""
        return 2 + sum(r.threads() for r in list(self.dedicated.values()))

    def _start_thread(self) -> None:
        """A new scheduler thread (called with the lock held); an older one ends at its next look."""
        self._generation += 1
        self._thread = threading.Thread(target=self._loop, args=(self._generation,), name="kvscope-scheduler",
                                        daemon=True)
        self._thread.start()

    # -- the scheduler thread ----------------------------------------------------------------------

    def _loop(self, generation: int) -> None:
        due = self._due
        while True:
            with self._lock:
                if generation != self._generation:
                    return
                next_due, _, state = due[0] if due else (self._clock() + 3600.0, 0, None)
                self._idle_until = next_due
            if self._stop.wait(max(0.0, next_due - self._clock())):
                return
            if state is None:
                continue
            with self._lock:
                if generation != self._generation:
                    return
                order = heapq.heappop(due)[1]
                call = self._current = Call(self._clock())
                self._current_state = state
            error = state.begin()
            if not error:
                call.execute(state.job.run, self._clock)
            with self._lock:
                handed_off = self._current is not call
                if not handed_off:
                    self._current = self._current_state = None
            call.done.set()
            if handed_off:
                return  # the job's own runner takes the call's outcome; a new thread runs the rest
            next_due = state.finish(call.began, error) if error else state.finish_call(call)
            if call.ended - call.began > self.inline_budget and not self._stop.is_set():
                with self._lock:  # slow, though it finished: from now on it runs beside the others
                    self._dedicate(state, None, f"its last run took {call.ended - call.began:.3f} s")
                continue
            with self._lock:
                heapq.heappush(due, (next_due, order, state))

    # -- the watchdog ------------------------------------------------------------------------------

    def _watch(self) -> None:
        """Wakes when the call in progress could first overrun its budget, and when the scheduler thread may
        have died: hands an overrunning job to a thread of its own, restarts a dead scheduler thread."""
        while True:
            now = self._clock()
            with self._lock:
                call, state, thread = self._current, self._current_state, self._thread
                if call is not None and state is not None:
                    limit = min(self.inline_budget, state.job.timeout)
                    if now - call.began >= limit:
                        self._current = self._current_state = None
                        self._dedicate(state, call, f"its call ran past {limit:g} s", thread)
                        self._start_thread()
                        wait = 0.0
                    else:
                        wait = call.began + limit - now
                elif thread is not None and not thread.is_alive() and not self._stop.is_set():
                    log.warning("the scheduler thread had stopped; started a new one")
                    self._start_thread()
                    wait = 0.0
                else:
                    budget = min((min(self.inline_budget, s.job.timeout) for _, _, s in self._due),
                                 default=self.inline_budget)
                    wait = max(self._idle_until - now, 0.0) + budget
            if self._stop.wait(wait):
                return

    def _dedicate(self, state: JobState, call: Call | None, why: str,
                  call_thread: threading.Thread | None = None) -> None:
        """Moves a job to threads of its own (with the lock held); `call` is its call in progress on
        `call_thread`, if any."""
        log.info("%s %s: %s; it runs on a thread of its own from now on", state.job.kind, state.job.name, why)
        runner = DedicatedRunner(state, self._stop, self._clock, call, call_thread)
        self.dedicated[state.job.name] = runner
        runner.start()

