"""A job on threads of its own: what the scheduler gives a job once a call of it has run past its inline
budget (agent/runtime/scheduler.py).

A runner thread keeps the job's schedule (its interval, or the readers' requests for an on-read job),
times its calls and reports them; a worker thread makes the calls. The runner starts with the call that
overran, still running on the thread that began it, and waits for it as for any call: its outcome is
reported if it comes within the job's timeout; otherwise the run failed, and the next call waits until
the stuck one has returned (never two calls of one job at once). A worker that ends is replaced, and
that run reports up=0: a dead worker is never waited on as if it were a hung call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from kvscope.agent.core.readings import Reading
from kvscope.agent.runtime.jobs import Call, JobState


class _Worker:
    """A daemon thread that makes one call of a job at a time, on request."""

    def __init__(self, name: str, run: Callable[[], Iterable[Reading]], clock: Callable[[], float]) -> None:
        self._run = run
        self._clock = clock
        self._request = threading.Event()
        self._call: Call | None = None
        self.thread = threading.Thread(target=self._loop, name=f"collect-{name}", daemon=True)
        self.thread.start()

    def submit(self) -> Call:
        call = self._call = Call(self._clock())
        self._request.set()
        return call

    def _loop(self) -> None:
        while True:
            self._request.wait()
            self._request.clear()
            call = self._call
            if call is not None:
                call.execute(self._run, self._clock)
                call.done.set()


class DedicatedRunner:
    """Runs one job on a runner and a worker thread of its own; `call` is a call in progress to adopt (made
    on `call_thread`), or None."""

    def __init__(self, state: JobState, stop: threading.Event, clock: Callable[[], float], call: Call | None,
                 call_thread: threading.Thread | None = None, refresh: Callable[[], None] | None = None) -> None:
        self._state = state
        self._stop = stop
        self._clock = clock
        self._refresh = refresh  # before each run of an analysis that reads on-read series
        self._asked = threading.Event()  # an on-read run was asked for
        self._pending = call
        self._call_thread = call_thread
        self._worker: _Worker | None = None
        self.thread = threading.Thread(target=self._loop, name=f"run-{state.job.name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def threads(self) -> int:
        return 1 + (self._worker is not None)

    def ask(self) -> None:
        """A reader wants an on-read job's values refreshed."""
        self._asked.set()

    def _wait_turn(self) -> bool:
        """Until the next run: its time, or a reader's request for an on-read job; False at stop."""
        if self._state.job.on_read:
            self._asked.wait()  # stop() asks too
            self._asked.clear()
            return not self._stop.is_set()
        return not self._stop.wait(max(0.0, self._state.next_due - self._clock()))

    def _loop(self) -> None:
        state, clock = self._state, self._clock
        job = state.job
        pending, runs_on = self._pending, self._call_thread
        while True:
            if pending is None or runs_on is None:
                if not self._wait_turn():
                    return
                if job.reads_on_read and self._refresh is not None:
                    self._refresh()
                began = clock()
                error = state.begin()
                if not error and self._worker is not None and not self._worker.thread.is_alive():
                    self._worker = _Worker(job.name, job.run, clock)
                    error = "its worker thread had stopped; started a new one"
                if error:
                    state.finish(began, error)
                    continue
                if self._worker is None:
                    self._worker = _Worker(job.name, job.run, clock)
                pending, runs_on = self._worker.submit(), self._worker.thread
            if pending.done.wait(max(0.0, pending.began + job.timeout - clock())):
                state.finish_call(pending)
                if job.idle and state.failures == 0:
                    return  # it ran once, as an idle job does
            else:
                state.finish(pending.began, f"no answer within its {job.timeout:g} s timeout" if runs_on.is_alive()
                             else "its worker thread stopped during the call")
                # a hung call is waited out: never two calls into one job at once
                while not pending.done.is_set() and runs_on.is_alive() and not self._stop.wait(min(state.delay, 1.0)):
                    pass
            pending = None
