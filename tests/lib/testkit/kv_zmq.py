"""Helpers of the KV-event subscriber's socket tests: vLLM's publisher and replay server over real ZMQ
sockets, and readers of the collector's readings."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import zmq

from kvscope.agent.core.readings import Sample
from kvscope.agent.tools.reference.vllm_kv_wire import Vllm033AllBlocksCleared, Vllm033Batch, Vllm033BlockStored
from kvscope.collectors.kv_events.collector import NAME, VllmKvEventsCollector, VllmKvEventsOptions
from kvscope.collectors.kv_events.schema import END_SEQ
from testkit.paths import FIXTURES

FIX = FIXTURES / "kv_events"
LAB = ("vllm", "test-model", "0")


def fixture(name: str) -> bytes:
    return bytes.fromhex((FIX / name).read_text().strip())


def gpu_batch(*hashes: int, medium: str = "GPU", clear: bool = False) -> bytes:
    events: list[Any] = [Vllm033BlockStored([h], None, [1] * 16, 16, None, medium, None) for h in hashes]
    if clear:
        events.insert(0, Vllm033AllBlocksCleared())
    return msgspec.msgpack.encode(Vllm033Batch(time.time(), events, 0))


class Publisher:
    """vLLM's PUB side; an XPUB so the test can wait for the subscription instead of sleeping."""

    def __init__(self, ctx: zmq.Context[Any], endpoint: str = "tcp://127.0.0.1:*", topic: bytes = b"") -> None:
        self.sock = ctx.socket(zmq.XPUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        deadline = time.monotonic() + 5.0
        while True:  # a just-closed socket frees its port asynchronously (ZMQ's I/O thread)
            try:
                self.sock.bind(endpoint)
                break
            except zmq.ZMQError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.topic = topic
        self.buffer: dict[int, bytes] = {}  # what vLLM's replay ring would hold

    def wait_subscribed(self, timeout: float = 5.0) -> None:
        assert self.sock.poll(int(timeout * 1000)), "no subscription arrived"
        assert self.sock.recv()[0] == 1

    def send(self, seq: int, payload: bytes, live: bool = True) -> None:
        self.buffer[seq] = payload
        if live:
            self.sock.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])

    def send_raw(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)

    def close(self) -> None:
        self.sock.close(0)


class ReplayServer:
    """vLLM's replay ROUTER (facts §2.2): 0.26+ replies carry the topic, <= 0.25 ones do not."""

    def __init__(self, ctx: zmq.Context[Any], buffer: dict[int, bytes], with_topic: bool = True) -> None:
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind("tcp://127.0.0.1:*")
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.buffer, self.with_topic = buffer, with_topic
        self.requests: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.sock.poll(20):
                continue
            frames = self.sock.recv_multipart()
            if len(frames) != 3 or frames[1] != b"":
                continue  # vLLM logs and ignores invalid requests
            ident, start = frames[0], int.from_bytes(frames[2], "big")
            self.requests.append(start)
            topic = [b""] if self.with_topic else []
            for seq in sorted(s for s in self.buffer if s >= start):
                self.sock.send_multipart([ident, b"", *topic, seq.to_bytes(8, "big"), self.buffer[seq]])
            self.sock.send_multipart([ident, b"", *topic, END_SEQ, b""])

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close(0)


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
