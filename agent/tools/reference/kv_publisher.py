"""KV events over ZMQ, as vLLM ≥ 0.30 publishes them (shared/facts/vllm.md §2.2–2.6).

Wire: PUB multipart [topic, seq (8-byte big-endian), msgpack([ts, [event maps], dp_rank])]; events
are maps whose first key is "type", required fields always present (nil allowed), optional fields only
when set (msgspec omit_defaults, as vLLM's structs). A ROUTER answers replay requests
[identity, b"", start_seq8] with [identity, b"", topic, seq8, payload] per buffered batch with
seq ≥ start, then [identity, b"", b"", END_SEQ, b""].

One thread owns both sockets (ZMQ sockets are not thread-safe): the engine hands it lists of events
through a queue; each list becomes one batch, as vLLM sends one batch per engine step.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable

import msgspec
import zmq

from kvscope.agent.tools.reference.tierstore import MEDIUM, BlockEvent
from kvscope.agent.tools.reference.vllm_kv_wire import Vllm033AllBlocksCleared as AllBlocksCleared
from kvscope.agent.tools.reference.vllm_kv_wire import Vllm033Batch as KVEventBatch
from kvscope.agent.tools.reference.vllm_kv_wire import Vllm033BlockRemoved as BlockRemoved
from kvscope.agent.tools.reference.vllm_kv_wire import Vllm033BlockStored as BlockStored

log = logging.getLogger("kvscope.reference.kv_events")
END_SEQ = (-1).to_bytes(8, "big", signed=True)


# vLLM 0.33's wire structs (vllm_kv_wire.py: byte-exact against the facts' examples)
Event = BlockStored | BlockRemoved | AllBlocksCleared


def to_wire(e: BlockEvent) -> BlockStored | BlockRemoved:
    medium, locality = MEDIUM[e.tier]
    if e.kind in ("stored", "reused"):  # a reuse is announced again as a store (kv_cache_report_mode=full)
        return BlockStored([e.block.key], e.block.parent, list(e.block.token_ids), len(e.block.token_ids),
                           None, medium, None, locality=locality)
    return BlockRemoved([e.block.key], medium, locality=locality)


class KVEventPublisher:
    """PUB + replay ROUTER on a background thread. `endpoint` like tcp://127.0.0.1:0 (port chosen by the OS)."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]], endpoint: str, replay_endpoint: str | None = None,
                 topic: str = "", buffer_steps: int = 10_000, data_parallel_rank: int = 0,
                 clock: Callable[[], float] = time.time) -> None:
        self.topic = topic.encode()
        self.rank = data_parallel_rank
        self.clock = clock
        self._encoder = msgspec.msgpack.Encoder()
        self._pub = context.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, 100_000)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind(endpoint)
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self._router: zmq.Socket[bytes] | None = None
        self.replay_endpoint: str | None = None
        if replay_endpoint:
            self._router = context.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.LINGER, 0)
            self._router.setsockopt(zmq.SNDHWM, 2 * (buffer_steps + 1))
            self._router.bind(replay_endpoint)
            self.replay_endpoint = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._queue: queue.Queue[list[Event] | None] = queue.Queue()
        self._seq = 0
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self.batches_sent = 0

    def start(self) -> None:
        self._thread.start()

    def publish(self, events: list[Event]) -> None:
        """Thread-safe: queues one batch."""
        if events:
            self._queue.put(events)

    def publish_block_events(self, events: list[BlockEvent]) -> None:
        self.publish([to_wire(e) for e in events])

    def clear_all(self) -> None:
        self.publish([AllBlocksCleared()])

    def close(self) -> None:
        self._queue.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._pub.close()
        if self._router is not None:
            self._router.close()

    def _run(self) -> None:
        poller = zmq.Poller()
        if self._router is not None:
            poller.register(self._router, zmq.POLLIN)
        while True:
            if self._router is not None and poller.poll(timeout=0):
                self._serve_replay()
            try:
                events = self._queue.get(timeout=0.01)
            except queue.Empty:
                continue
            if events is None:
                return
            payload = self._encoder.encode(KVEventBatch(self.clock(), events, self.rank))
            seq = self._seq.to_bytes(8, "big")
            self._pub.send_multipart([self.topic, seq, payload])
            self._buffer.append((self._seq, payload))
            self._seq += 1
            self.batches_sent += 1

    def _serve_replay(self) -> None:
        assert self._router is not None
        frames = self._router.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning("ignoring an invalid replay request of %d frames", len(frames))
            return
        identity, start = frames[0], int.from_bytes(frames[2], "big")
        for seq, payload in list(self._buffer):
            if seq >= start:
                self._router.send_multipart([identity, b"", self.topic, seq.to_bytes(8, "big"), payload])
        self._router.send_multipart([identity, b"", b"", END_SEQ, b""])
