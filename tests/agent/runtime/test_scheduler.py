"""Failure isolation: a collector that raises, hangs or returns garbage affects only itself."""

from __future__ import annotations

import ctypes
import http.client
import threading
import time
from collections.abc import Iterable

import pytest

from kvscope.agent.core.catalogue import AGENT_METRICS, Catalogue, counter
from kvscope.agent.core.readings import Reading, Sample
from kvscope.agent.core.store import Store
from kvscope.agent.runtime.scheduler import Scheduler, analysis_job, collector_job
from kvscope.exporters.prometheus.server import MetricsServer

TICKS = "kvscope_ticks_total"


class Healthy:
    def __init__(self, label: str = "healthy") -> None:
        self.n = 0
        self.label = label

    def collect(self) -> Iterable[Reading]:
        self.n += 1
        return [Sample(TICKS, (self.label,), float(self.n))]


class Raises:
    def __init__(self) -> None:
        self.calls = 0

    def collect(self) -> Iterable[Reading]:
        self.calls += 1
        raise OSError("device vanished")


class Hangs:
    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def collect(self) -> Iterable[Reading]:
        self.calls += 1
        self.release.wait(30)
        return [Sample(TICKS, ("hangs",), 1.0)]


class Garbage:
    def collect(self) -> Iterable[Reading]:
        return [Sample("kvscope_not_catalogued_total", (), 1.0), Sample(TICKS, ("garbage",), 1.0)]


def wait_for(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached")


def test_failures_stay_isolated_and_metrics_keep_answering() -> None:
    store = ticks_store()
    healthy, raises, hangs = Healthy(), Raises(), Hangs()
    jobs = [
        collector_job("healthy", healthy, 0.02, 1.0),
        collector_job("raises", raises, 0.02, 1.0),
        collector_job("hangs", hangs, 0.02, 0.1),
        collector_job("garbage", Garbage(), 0.02, 1.0),
    ]
    scheduler = Scheduler(store, jobs, max_backoff=0.1)
    server = MetricsServer(store, "127.0.0.1", 0)
    scheduler.start()
    server.start()
    try:
        wait_for(lambda: healthy.n >= 20 and raises.calls >= 3)
        up = store.values("kvscope_collector_up")
        assert up[("healthy",)] == 1.0
        assert up[("raises",)] == 0.0
        assert up[("hangs",)] == 0.0
        assert up[("garbage",)] == 0.0
        errors = store.values("kvscope_collector_errors_total")
        assert errors[("raises",)] >= 3
        assert errors[("healthy",)] == 0
        # the hung call is never duplicated while it is stuck
        assert hangs.calls == 1
        # the garbage collector's valid reading still landed
        assert store.value(TICKS, ("garbage",)) == 1.0
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        conn.request("GET", "/metrics")
        body = conn.getresponse().read().decode()
        assert 'kvscope_collector_up{collector="raises"} 0.0' in body
        assert 'kvscope_ticks_total{collector="healthy"}' in body
        # once the stuck call returns, the collector is retried and recovers
        hangs.release.set()
        wait_for(lambda: store.value("kvscope_collector_up", ("hangs",)) == 1.0)
        assert hangs.calls >= 2
    finally:
        scheduler.stop(timeout=2)
        server.stop()


def test_backoff_spaces_retries() -> None:
    store = Store(Catalogue(list(AGENT_METRICS)))
    raises = Raises()
    scheduler = Scheduler(store, [collector_job("raises", raises, 0.05, 1.0)], max_backoff=10.0)
    scheduler.start()
    time.sleep(1.0)
    scheduler.stop(timeout=2)
    # delays 0.1, 0.2, 0.4, 0.8 s: at most 4 runs in one second, far fewer than 20 at the plain interval
    assert 2 <= raises.calls <= 5


def _kill_when_it_next_wakes(thread: threading.Thread) -> None:
    """Raise SystemExit in `thread` at its next Python instruction: the thread (a worker or the scheduler's)
    is idle in Event.wait(), outside the try that takes a call's exceptions, so its next wake-up ends it."""
    assert thread.ident is not None
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(SystemExit))
    assert done == 1


class Slow:
    """Takes `seconds` on its first `slow_calls` calls, then answers at once; notes the threads it ran on."""

    def __init__(self, seconds: float, slow_calls: int = 1) -> None:
        self.seconds = seconds
        self.slow_calls = slow_calls
        self.n = 0
        self.threads: list[str] = []

    def collect(self) -> Iterable[Reading]:
        self.n += 1
        self.threads.append(threading.current_thread().name)
        if self.n <= self.slow_calls:
            time.sleep(self.seconds)
        return [Sample(TICKS, ("slow",), float(self.n))]


class Recording(Healthy):
    def __init__(self) -> None:
        super().__init__()
        self.threads: set[str] = set()
        self.times: list[float] = []

    def collect(self) -> Iterable[Reading]:
        self.threads.add(threading.current_thread().name)
        self.times.append(time.monotonic())
        return super().collect()


def ticks_store() -> Store:
    return Store(Catalogue([*AGENT_METRICS, counter(TICKS, "", ("collector",), "ticks", "test")]))


def test_quick_jobs_share_one_thread() -> None:
    jobs = [Recording() for _ in range(6)]
    scheduler = Scheduler(ticks_store(), [collector_job(f"quick{i}", j, 0.02, 1.0) for i, j in enumerate(jobs)])
    scheduler.start()
    try:
        wait_for(lambda: all(j.n >= 10 for j in jobs))
        assert {name for j in jobs for name in j.threads} == {"kvscope-scheduler"}
        assert scheduler.threads() == 2  # the scheduler thread and its watchdog, whatever the number of jobs
        assert not scheduler.dedicated
    finally:
        scheduler.stop(timeout=2)


def test_a_slow_job_gets_its_own_thread_and_does_not_hold_up_the_others() -> None:
    store = ticks_store()
    slow, quick = Slow(0.6), Recording()
    scheduler = Scheduler(store, [collector_job("slow", slow, 0.05, 2.0), collector_job("quick", quick, 0.05, 1.0)],
                          inline_budget=0.05)
    scheduler.start()
    try:
        wait_for(lambda: slow.n >= 4 and quick.n >= 20)
        # the slow call began inline, was handed over after ~0.05 s, and its result still counted (within timeout)
        assert slow.threads[0] == "kvscope-scheduler" and set(slow.threads[1:]) == {"collect-slow"}
        assert set(scheduler.dedicated) == {"slow"}
        assert store.value("kvscope_collector_errors_total", ("slow",)) == 0
        assert store.value("kvscope_collector_up", ("slow",)) == 1.0
        gaps = [b - a for a, b in zip(quick.times, quick.times[1:], strict=False)]
        assert max(gaps) < 0.4  # the quick job waited for the hand-over (~0.05 s), not the slow call (0.6 s)
    finally:
        scheduler.stop(timeout=2)


def test_a_job_that_took_long_but_finished_moves_to_its_own_thread() -> None:
    """The call ends before the watchdog looks: the scheduler thread itself sees it ran past its budget."""
    skew = [0.0]

    def clock() -> float:
        return time.monotonic() + skew[0]

    class JumpsTheClock(Slow):
        def collect(self) -> Iterable[Reading]:
            if self.n == 0:
                skew[0] += 1.0  # the call "took" a second, in no time the watchdog could see
            return super().collect()

    slow = JumpsTheClock(0.0)
    scheduler = Scheduler(ticks_store(), [collector_job("slow", slow, 0.02, 5.0)], clock=clock, inline_budget=0.5)
    scheduler.start()
    try:
        wait_for(lambda: slow.n >= 3)
        assert slow.threads[0] == "kvscope-scheduler" and set(slow.threads[1:]) == {"collect-slow"}
        assert "slow" in scheduler.dedicated
    finally:
        scheduler.stop(timeout=2)


def test_stop_is_prompt_while_an_inline_call_hangs() -> None:
    hangs = Hangs()
    scheduler = Scheduler(ticks_store(), [collector_job("hangs", hangs, 0.02, 30.0)], inline_budget=30.0)
    scheduler.start()
    wait_for(lambda: hangs.calls == 1)
    began = time.monotonic()
    scheduler.stop(timeout=0.5)
    assert time.monotonic() - began < 1.0
    hangs.release.set()


class Exits:
    def __init__(self) -> None:
        self.calls = 0

    def collect(self) -> Iterable[Reading]:
        self.calls += 1
        raise SystemExit("a collector that calls sys.exit()")


def test_a_job_raising_systemexit_is_an_error_not_the_end_of_the_scheduler() -> None:
    store = ticks_store()
    exits, healthy = Exits(), Healthy()
    jobs = [collector_job("exits", exits, 0.02, 1.0), collector_job("healthy", healthy, 0.02, 1.0)]
    scheduler = Scheduler(store, jobs, max_backoff=0.05)
    scheduler.start()
    try:
        wait_for(lambda: exits.calls >= 3 and healthy.n >= 10)
        assert store.value("kvscope_collector_up", ("exits",)) == 0.0
        assert store.value("kvscope_collector_up", ("healthy",)) == 1.0
        assert not scheduler.dedicated
    finally:
        scheduler.stop(timeout=2)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the fault itself
def test_a_scheduler_thread_that_died_is_replaced() -> None:
    healthy = Healthy()
    scheduler = Scheduler(ticks_store(), [collector_job("healthy", healthy, 0.02, 0.2)], max_backoff=0.05)
    scheduler.start()
    try:
        wait_for(lambda: healthy.n >= 3)
        (thread,) = [t for t in threading.enumerate() if t.name == "kvscope-scheduler"]
        _kill_when_it_next_wakes(thread)
        thread.join(5)
        assert not thread.is_alive()
        calls = healthy.n
        wait_for(lambda: healthy.n >= calls + 3)  # a new scheduler thread runs it again
        assert [t for t in threading.enumerate() if t.name == "kvscope-scheduler"] != [thread]
    finally:
        scheduler.stop(timeout=2)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the fault itself
def test_a_dedicated_worker_thread_that_died_is_reported_and_replaced() -> None:
    store = ticks_store()
    slow = Slow(0.1)  # its first call overruns the budget: the job moves to threads of its own
    scheduler = Scheduler(store, [collector_job("worker-dies", slow, 0.02, 0.5)], max_backoff=0.05,
                          inline_budget=0.05)
    scheduler.start()
    try:
        wait_for(lambda: slow.n >= 3)
        (worker,) = [t for t in threading.enumerate() if t.name == "collect-worker-dies"]
        _kill_when_it_next_wakes(worker)
        worker.join(5)
        assert not worker.is_alive()
        wait_for(lambda: store.value("kvscope_collector_errors_total", ("worker-dies",)) == 1.0)
        calls = slow.n
        wait_for(lambda: slow.n >= calls + 3)  # a new worker runs it again
        assert store.value("kvscope_collector_up", ("worker-dies",)) == 1.0
        assert [t for t in threading.enumerate() if t.name == "collect-worker-dies"] != [worker]
    finally:
        scheduler.stop(timeout=2)


def runs(store: Store, name: str, kind: str = "collector") -> float:
    return store.value(f"kvscope_{kind}_runs_total", (name,)) or 0.0


def test_an_on_read_job_runs_at_start_then_only_when_read() -> None:
    store = ticks_store()
    host, timed = Healthy("host"), Healthy()
    scheduler = Scheduler(store, [collector_job("host", host, 0.2, 1.0, on_read=True),
                                  collector_job("timed", timed, 0.02, 1.0)])
    scheduler.start()
    try:
        wait_for(lambda: timed.n >= 20)
        assert host.n == 1  # its first run, at start; nobody read since
        scheduler.refresh()  # a reader: the values are stale (older than 3/4 of 0.2 s), so it runs, and we wait
        assert host.n == 2 and store.value(TICKS, ("host",)) == 2.0
        scheduler.refresh()  # fresh: a second reader right after shares that run
        assert host.n == 2
        time.sleep(0.16)
        scheduler.refresh()
        assert host.n == 3
        assert runs(store, "host") == 3 and scheduler.threads() == 2
    finally:
        scheduler.stop(timeout=2)


class Analysis(Healthy):
    def run(self) -> Iterable[Reading]:
        return self.collect()


class Idle(Analysis):
    idle = True  # none of its inputs is enabled


def test_an_idle_analysis_runs_once_and_never_wakes_the_scheduler_again() -> None:
    store = ticks_store()
    idle, timed = Idle("idle"), Analysis()
    scheduler = Scheduler(store, [analysis_job("idle", idle, 0.02, 1.0), analysis_job("timed", timed, 0.02, 1.0)])
    scheduler.start()
    try:
        wait_for(lambda: timed.n >= 20)
        assert idle.n == 1 and runs(store, "idle", "analysis") == 1
        assert store.value("kvscope_analysis_up", ("idle",)) == 1.0
    finally:
        scheduler.stop(timeout=2)


def test_a_scrape_collects_the_on_read_jobs_first() -> None:
    store = ticks_store()
    host = Healthy("host")
    scheduler = Scheduler(store, [collector_job("host", host, 0.05, 1.0, on_read=True)])
    server = MetricsServer(store, "127.0.0.1", 0, scheduler=scheduler)
    scheduler.start()
    server.start()
    try:
        wait_for(lambda: host.n == 1)
        for n in (2, 3, 4):
            time.sleep(0.05)
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
            conn.request("GET", "/metrics")
            assert f'kvscope_ticks_total{{collector="host"}} {n}.0' in conn.getresponse().read().decode()
    finally:
        scheduler.stop(timeout=2)
        server.stop()


class ReadsHost(Analysis):
    reads_host_series = True


def test_an_analysis_that_reads_host_series_refreshes_them_before_each_run() -> None:
    store = ticks_store()
    host, analysis = Healthy(), ReadsHost()
    scheduler = Scheduler(store, [collector_job("host", host, 0.02, 1.0, on_read=True),
                                  analysis_job("reads", analysis, 0.05, 1.0)])
    scheduler.start()
    try:
        wait_for(lambda: analysis.n >= 10)
        assert abs(host.n - analysis.n) <= 1  # one host run before each window of the analysis
    finally:
        scheduler.stop(timeout=2)


def test_a_reader_does_not_wait_long_for_a_hung_on_read_job() -> None:
    store = ticks_store()
    hangs, quick = Hangs(), Healthy()
    scheduler = Scheduler(store, [collector_job("hangs", hangs, 0.02, 0.5, on_read=True),
                                  collector_job("quick", quick, 0.02, 1.0, on_read=True)], max_backoff=0.1,
                          inline_budget=0.05)
    scheduler.start()
    try:
        wait_for(lambda: quick.n >= 1 and hangs.calls == 1)
        for _ in range(5):
            began = time.monotonic()
            scheduler.refresh()
            assert time.monotonic() - began < 0.8  # at most its timeout; once it is hung, not at all
            time.sleep(0.05)
        assert hangs.calls == 1 and quick.n >= 5  # never asked again while stuck; the other one ran each time
        wait_for(lambda: store.value("kvscope_collector_up", ("hangs",)) == 0.0)  # past its 0.5 s timeout
        hangs.release.set()
        wait_for(lambda: (scheduler.refresh(), store.value("kvscope_collector_up", ("hangs",)) == 1.0)[1])
        assert hangs.calls >= 2
    finally:
        hangs.release.set()
        scheduler.stop(timeout=2)


class HangsOnSecondCall(Hangs):
    def collect(self) -> Iterable[Reading]:
        if self.calls == 0:
            self.calls += 1
            return [Sample(TICKS, ("hangs",), 1.0)]
        return super().collect()


def test_a_scrape_is_answered_when_a_collector_it_asked_for_hangs() -> None:
    store = ticks_store()
    hangs, quick = HangsOnSecondCall(), Healthy("quick")
    scheduler = Scheduler(store, [collector_job("hangs", hangs, 0.02, 5.0, on_read=True),
                                  collector_job("quick", quick, 0.02, 1.0, on_read=True)], inline_budget=0.05)
    server = MetricsServer(store, "127.0.0.1", 0, scheduler=scheduler)
    scheduler.start()
    server.start()
    try:
        wait_for(lambda: hangs.calls == 1 and quick.n == 1)
        time.sleep(0.05)
        began = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("GET", "/metrics")
        body = conn.getresponse().read().decode()
        # the hung call was handed to a thread of its own once the scrape poked the watchdog; the scrape
        # waited at most REFRESH_WAIT for it, then got the last values, and the quick collector's fresh ones
        assert time.monotonic() - began < 2.0
        assert hangs.calls == 2 and "hangs" in scheduler.dedicated
        assert 'kvscope_ticks_total{collector="hangs"} 1.0' in body
        assert 'kvscope_ticks_total{collector="quick"} 2.0' in body
    finally:
        hangs.release.set()
        scheduler.stop(timeout=2)
        server.stop()


def test_a_reader_after_stop_is_answered_at_once() -> None:
    store = ticks_store()
    host = Healthy("host")
    scheduler = Scheduler(store, [collector_job("host", host, 0.05, 1.0, on_read=True)])
    scheduler.start()
    wait_for(lambda: host.n == 1)
    scheduler.stop(timeout=2)
    began = time.monotonic()
    scheduler.refresh()  # an exporter's last export, after the scheduler stopped: no wait, no error
    assert scheduler.read(lambda: 42).result(0.1) == 42
    assert time.monotonic() - began < 0.5 and host.n == 1
