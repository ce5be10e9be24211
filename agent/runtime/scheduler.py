"""The scheduler: every enabled collector and analysis, each with a timeout, in isolation, on as few
threads as it can.

When a job runs:

- **On its interval** (engine adapters, KV events, analyses): every `interval` seconds.
- **When read** (`Job.on_read`: the host collectors, whose values are the kernel's own counters): when a
  reader asks for fresh values (a scrape of /metrics, an OTLP metrics export, or an analysis that reads
  host series) and its last run is at least 3/4 of its interval old. Nobody reading, nothing collected: a
  sidecar scraped every 15 s reads the kernel once per scrape, as node_exporter does, not 15 times. Each
  on-read job also runs once at start, so a missing source is reported at once.

Readers: `read(fn)` runs `fn` (rendering /metrics) on the scheduler thread right after the stale on-read
runs it asked for, so a scrape costs two thread switches (the server's event loop to this thread and
back) and no more; `refresh()` is the blocking form for readers on threads of their own.

Where it runs: one scheduler thread makes every call inline, in order of due time, so an idle agent
wakes once per tick however many collectors it has. A watchdog thread watches the call in progress: a
call that runs longer than INLINE_BUDGET (or its job's timeout, if shorter) is handed to threads of its
own, and a fresh scheduler thread carries on with the other jobs. That job keeps its own threads from
then on (agent/runtime/job_threads.py). A quick collector thus costs one call and no thread switch; a slow
or hanging one costs what it did before, a runner and a worker of its own, and never delays the others
by more than INLINE_BUDGET.

Isolation is the same either way. A job that raises, hangs past its timeout or returns garbage affects
only itself: it reports `kvscope_collector_up=0` (`kvscope_analysis_up` for an analysis), counts
`kvscope_collector_errors_total`, and is retried with exponential backoff. A hung call is never
abandoned into a second concurrent call: the job is retried only once the stuck call has returned.
Threads are daemons, so a collector stuck in a system call cannot keep the agent from shutting down.
A reader waits for the runs it asked for at most REFRESH_WAIT seconds, then reads what the store holds.

The scheduler thread takes whatever a call raises as that call's error. Should it end all the same, the
watchdog starts a new one; a dedicated worker that ends is replaced by its runner.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from kvscope.agent.core.store import Store
from kvscope.agent.runtime.job_threads import DedicatedRunner
from kvscope.agent.runtime.jobs import Call, Job, JobState, analysis_job, collector_job

__all__ = ["INLINE_BUDGET", "REFRESH_WAIT", "Job", "Scheduler", "analysis_job", "collector_job"]

log = logging.getLogger("kvscope.scheduler")

INLINE_BUDGET = 0.1  # seconds an inline call may run before its job gets threads of its own
REFRESH_WAIT = 1.0  # seconds a reader waits at most for the runs it asked for


@dataclass(eq=False)
class _Read:
    """A reader's function, to run once the on-read runs it asked for have finished (or `deadline` passed)."""

    fn: Callable[[], Any]
    future: Future[Any]
    asked: list[tuple[JobState, int]]  # each job asked for, with its run count when asked
    deadline: float

    def ready(self, now: float) -> bool:
        return now >= self.deadline or all(state.runs > runs for state, runs in self.asked)


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
        self.jobs: list[Job] = []
        self.max_backoff = max_backoff
        self.inline_budget = inline_budget
        self._clock = clock
        self._wall = wall_clock
        self._stop = threading.Event()
        self._wake = threading.Event()  # a reader asked for on-read runs, or stop
        self._lock = threading.Lock()  # guards the call in progress, the queues and the run counts
        self._states: list[JobState] = []
        self._due: list[tuple[float, int, JobState]] = []  # timer runs, earliest first (a heap)
        self._asked: list[JobState] = []  # on-read runs readers asked for, to make before any timer run
        self._reads: list[_Read] = []  # readers waiting for their on-read runs, oldest first
        self._current: Call | None = None  # the inline call in progress
        self._current_state: JobState | None = None
        self._idle_until = 0.0  # when the scheduler thread next wakes by itself, while it sleeps
        self._thread: threading.Thread | None = None
        self._generation = 0  # scheduler threads started; a thread whose number is not this one ends
        self._watchdog: threading.Thread | None = None
        self._watch_wake = threading.Event()  # poke(): a reader waits longer than the budget; look now
        self.dedicated: dict[str, DedicatedRunner] = {}  # jobs that run on threads of their own, by name
        for job in jobs:
            self.add(job)

    def add(self, job: Job) -> None:
        """Adds a job (before start)."""
        self.jobs.append(job)
        self._states.append(JobState(job, self.store, self._clock, self._wall, self.max_backoff,
                                     len(self._states), self._finished))

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        now = self._clock()
        for state in self._states:
            state.health(up=True, duration=0.0, error=False, run=False)
            state.next_due = now
            state.in_flight = state.job.on_read  # its first run, below
            self._due.append((now, state.order, state))
        heapq.heapify(self._due)
        with self._lock:
            self._start_thread()
        self._watchdog = threading.Thread(target=self._watch, name="kvscope-watchdog", daemon=True)
        self._watchdog.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        self._watch_wake.set()
        for runner in list(self.dedicated.values()):
            runner.ask()
        deadline = self._clock() + timeout
        threads = [self._thread, self._watchdog, *(r.thread for r in list(self.dedicated.values()))]
        for thread in threads:
            if thread is not None:
                thread.join(max(0.0, deadline - self._clock()))
        with self._lock:
            reads, self._reads = self._reads, []
        for read in reads:  # a last answer with what the store holds, rather than none
            self._answer(read)
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

    # -- readers -----------------------------------------------------------------------------------

    def read(self, fn: Callable[[], Any], refresh: bool = True) -> Future[Any]:
        """Runs `fn` on the scheduler thread, after the on-read jobs whose values are stale when `refresh`; its
        result comes in the future. A job already running (slow or hung) is not asked again, and one on a
        thread of its own is waited for at most REFRESH_WAIT: the reader then gets the last values."""
        future: Future[Any] = Future()
        with self._lock:
            if not self._stop.is_set():
                now = self._clock()
                asked = self._ask_stale(now) if refresh and self._thread is not None else []
                self._reads.append(_Read(fn, future, asked, now + REFRESH_WAIT))
                self._wake.set()
                return future
        self._answer(_Read(fn, future, [], 0.0))  # stopped: what the store holds, answered here
        return future

    def refresh(self) -> None:
        """Before a reader on a thread of its own reads the store: `read()` of nothing, waited for."""
        future = self.read(lambda: None)
        try:
            future.result(self.inline_budget)
        except TimeoutError:
            self.poke()
            try:
                future.result(REFRESH_WAIT + 5 * self.inline_budget + 1.0)
            except TimeoutError:  # the scheduler is not running (not started yet): read what is there
                log.debug("refresh: no answer from the scheduler; reading the store as it is")

    def poke(self) -> None:
        """A reader's answer is late: the watchdog looks at the call in progress now. (Runs that readers ask
        for do not wake the watchdog when they begin, unlike the runs it plans for: a reader pokes it if it
        waits longer than the inline budget, which costs nothing when the answer comes in time.)"""
        self._watch_wake.set()

    def _ask_stale(self, now: float) -> list[tuple[JobState, int]]:
        """Queues the stale on-read jobs (with the lock held); returns them with their run counts."""
        asked = []
        for state in self._states:
            if state.job.on_read and not state.in_flight and state.stale(now):
                state.in_flight = True
                asked.append((state, state.runs))
                runner = self.dedicated.get(state.job.name)
                if runner is not None:
                    runner.ask()
                else:
                    self._asked.append(state)
        if self._asked:
            self._wake.set()
        return asked

    def _finished(self, state: JobState) -> None:
        with self._lock:
            state.runs += 1
            state.in_flight = False
            if self._reads:
                self._wake.set()  # a reader may be waiting for this run

    @staticmethod
    def _answer(read: _Read) -> None:
        try:
            read.future.set_result(read.fn())
        except BaseException as exc:  # the reader's to handle, like any call's outcome
            read.future.set_exception(exc)

    # -- the scheduler thread ----------------------------------------------------------------------

    def _next(self, now: float) -> JobState | _Read | None:
        """What to do now (with the lock held): asked on-read runs first, then readers whose runs are done,
        then a timer run that is due. An analysis that reads host series goes back behind the on-read runs
        it asks for."""
        if self._asked:
            return self._asked.pop(0)
        for i, read in enumerate(self._reads):
            if read.ready(now):
                return self._reads.pop(i)
        if not self._due or self._due[0][0] > now:
            return None
        state = heapq.heappop(self._due)[2]
        if state.job.reads_on_read and self._ask_stale(now) and self._asked:
            heapq.heappush(self._due, (now, state.order, state))
            return self._asked.pop(0)
        return state

    def _loop(self, generation: int) -> None:
        while not self._stop.is_set():
            now = self._clock()
            with self._lock:
                if generation != self._generation:
                    return
                task = self._next(now)
                if task is None:
                    self._idle_until = min([self._due[0][0] if self._due else now + 3600.0,
                                            *(r.deadline for r in self._reads)])
                elif isinstance(task, JobState):
                    call = self._current = Call(now)
                    self._current_state = task
            if task is None:
                self._wake.wait(max(0.0, self._idle_until - now))
                self._wake.clear()
            elif isinstance(task, _Read):
                self._answer(task)
            elif not self._run(task, call):
                return

    def _run(self, state: JobState, call: Call) -> bool:
        """One inline call and its outcome; False when the watchdog handed the job over (this thread ends)."""
        error = state.begin()
        if not error:
            call.execute(state.job.run, self._clock)
        with self._lock:
            handed_off = self._current is not call
            if not handed_off:
                self._current = self._current_state = None
        call.done.set()
        if handed_off:
            return False  # the job's own runner takes the call's outcome; a new thread runs the rest
        next_due = state.finish(call.began, error) if error else state.finish_call(call)
        with self._lock:
            if call.ended - call.began > self.inline_budget and not self._stop.is_set():
                # slow, though it finished: from now on it runs beside the others
                self._dedicate(state, None, f"its last run took {call.ended - call.began:.3f} s")
            elif not state.job.on_read and not (state.job.idle and state.failures == 0):  # an idle job ran once
                heapq.heappush(self._due, (next_due, state.order, state))
        return True

    # -- the watchdog ------------------------------------------------------------------------------

    def _watch(self) -> None:
        """Wakes when the call in progress could first overrun its budget, and when the scheduler thread may
        have died: hands an overrunning job to threads of its own, restarts a dead scheduler thread."""
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
                    budget = min((min(self.inline_budget, s.job.timeout) for s in self._states),
                                 default=self.inline_budget)
                    wait = max(self._idle_until - now, 0.0) + budget
            self._watch_wake.wait(wait)
            self._watch_wake.clear()
            if self._stop.is_set():
                return

    def _dedicate(self, state: JobState, call: Call | None, why: str,
                  call_thread: threading.Thread | None = None) -> None:
        """Moves a job to threads of its own (with the lock held); `call` is its call in progress on
        `call_thread`, if any."""
        log.info("%s %s: %s; it runs on a thread of its own from now on", state.job.kind, state.job.name, why)
        runner = DedicatedRunner(state, self._stop, self._clock, call, call_thread, self.refresh)
        self.dedicated[state.job.name] = runner
        runner.start()
