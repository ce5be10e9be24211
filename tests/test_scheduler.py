"""Failure isolation: a collector that raises, hangs or returns garbage affects only itself."""

from __future__ import annotations

import ctypes
import http.client
import threading
import time
from collections.abc import Iterable

import pytest

from kvscope.agent.catalogue import AGENT_METRICS, Catalogue, counter
from kvscope.agent.readings import Reading, Sample
from kvscope.agent.scheduler import Scheduler, collector_job
from kvscope.agent.store import Store
from kvscope.exporters.http import MetricsServer

TICKS = "kvscope_ticks_total"


class Healthy:
    def __init__(self) -> None:
        self.n = 0

    def collect(self) -> Iterable[Reading]:
        self.n += 1
        return [Sample(TICKS, ("healthy",), float(self.n))]


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
    store = Store(Catalogue([*AGENT_METRICS, counter(TICKS, "", ("collector",), "ticks", "test")]))
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
    """Raise SystemExit in `thread` at its next Python instruction: the worker is idle in Event.wait(),
    outside the try that takes a call's exceptions, so the next request ends the thread."""
    assert thread.ident is not None
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(SystemExit))
    assert done == 1


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the fault itself
def test_a_worker_thread_that_died_is_reported_and_replaced() -> None:
    store = Store(Catalogue([*AGENT_METRICS, counter(TICKS, "", ("collector",), "ticks", "test")]))
    healthy = Healthy()
    scheduler = Scheduler(store, [collector_job("worker-dies", healthy, 0.02, 0.2)], max_backoff=0.05)
    scheduler.start()
    try:
        wait_for(lambda: healthy.n >= 3)
        (worker,) = [t for t in threading.enumerate() if t.name == "collect-worker-dies"]
        _kill_when_it_next_wakes(worker)
        worker.join(5)
        assert not worker.is_alive()
        wait_for(lambda: store.value("kvscope_collector_errors_total", ("worker-dies",)) == 1.0)
        calls = healthy.n
        wait_for(lambda: healthy.n >= calls + 3)  # a new worker runs it again
        assert store.value("kvscope_collector_up", ("worker-dies",)) == 1.0
        assert [t for t in threading.enumerate() if t.name == "collect-worker-dies"] != [worker]
    finally:
        scheduler.stop(timeout=2)
