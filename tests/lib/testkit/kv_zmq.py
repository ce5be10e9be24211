"""Helpers of the KV-event subscriber's socket tests: the shared vLLM publisher and its replay ROUTER
(kvscope.agent.tools.reference.kv_publisher) as the tests use them over real ZMQ sockets, and readers of the
collector's readings."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import zmq

from kvscope.agent.core.readings import Sample
from kvscope.agent.tools.reference.kv_publisher import (
    AllBlocksCleared,
    BlockStored,
    KVEventBatch,
    KVEventPublisher,
    ReplayBuffer,
    ReplayRouter,
)
from kvscope.collectors.kv_events.collector import NAME, VllmKvEventsCollector, VllmKvEventsOptions
from testkit.paths import FIXTURES

FIX = FIXTURES / "kv_events"
LAB = ("vllm", "test-model", "0")


def fixture(name: str) -> bytes:
    return bytes.fromhex((FIX / name).read_text().strip())


def gpu_batch(*hashes: int, medium: str = "GPU", clear: bool = False) -> bytes:
    events: list[Any] = [BlockStored([h], None, [1] * 16, 16, None, medium, None) for h in hashes]
    if clear:
        events.insert(0, AllBlocksCleared())
    return msgspec.msgpack.encode(KVEventBatch(time.time(), events, 0))


class Publisher(KVEventPublisher):
    """The shared publisher as the socket tests use it: an XPUB on a loopback port, so that a test waits for
    the subscription instead of sleeping, that binds again to the port a closed one has just left (an
    engine restarted in place)."""

    def __init__(self, ctx: zmq.Context[Any], endpoint: str = "tcp://127.0.0.1:*") -> None:
        super().__init__(ctx, endpoint, watch_subscriptions=True, bind_timeout=5.0)


class ReplayServer:
    """vLLM's replay ROUTER over a publisher's buffer, answered on a thread of its own while the test goes
    on: 0.26+ replies carry the topic, <= 0.25 ones do not. `requests`: the start of each request."""

    def __init__(self, ctx: zmq.Context[Any], buffer: ReplayBuffer, with_topic: bool = True) -> None:
        self.requests: list[int] = []
        self.router = ReplayRouter(ctx, "tcp://127.0.0.1:*", buffer, b"" if with_topic else None,
                                   on_request=self.requests.append)
        self.endpoint = self.router.endpoint
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            self.router.serve(0.02)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.router.close()


class Subscribers:
    """Makes started collectors against one ZMQ context and closes them all at the end of a test."""

    def __init__(self, ctx: zmq.Context[Any]) -> None:
        self.ctx = ctx
        self.made: list[VllmKvEventsCollector] = []

    def __call__(self, endpoint: str, **kw: Any) -> VllmKvEventsCollector:
        kw.setdefault("replay_timeout", 2.0)
        options = VllmKvEventsOptions(endpoint=endpoint, model="test-model", **kw)
        options.validate(NAME)
        collector = VllmKvEventsCollector(options, self.ctx)
        collector.start()
        assert collector.ready.wait(5)
        self.made.append(collector)
        return collector

    def close(self) -> None:
        for c in self.made:
            c.close()


@contextlib.contextmanager
def subscribers() -> Iterator[Subscribers]:
    """A ZMQ context and a Subscribers factory on it (the `ctx`/`make_sub` fixtures of the tests)."""
    ctx: zmq.Context[Any] = zmq.Context()
    made = Subscribers(ctx)
    try:
        yield made
    finally:
        made.close()
        ctx.destroy(0)


def values(c: VllmKvEventsCollector) -> dict[tuple[str, tuple[str, ...]], float]:
    return {(r.name, r.labels): r.value for r in c.collect() if isinstance(r, Sample)}


def wait_for(c: VllmKvEventsCollector, name: str, labels: tuple[str, ...], target: float) -> dict[Any, float]:
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        v = values(c)
        if v.get((name, labels)) == target:
            return v
        time.sleep(0.005)
    raise AssertionError(f"{name}{labels} never reached {target}: {v.get((name, labels))}")


def events_seen(v: dict[Any, float], rank: str = "0") -> float:
    return sum(val for (n, lab), val in v.items() if n == "kvscope_kv_events_total" and lab[2] == rank)


def tier(v: dict[Any, float], name: str, t: str, rank: str = "0") -> float | None:
    return v.get((name, ("vllm", "test-model", rank, t)))
