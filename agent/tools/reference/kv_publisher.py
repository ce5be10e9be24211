"""vLLM's KV-event publisher over ZMQ (shared/facts/vllm.md §2.2–2.6), the one that the reference engine, the
benchmarks' load and the socket tests all publish with.

Wire: PUB multipart [topic, seq (8-byte big-endian), msgpack([ts, [event maps], dp_rank])]; events are maps
whose first key is "type", required fields always present (nil allowed), optional fields only when set
(msgspec omit_defaults, as vLLM's structs; vllm_kv_wire.py holds them, byte-exact against the facts'
examples). Every batch sent is kept for replay (vLLM's buffer_steps). A ROUTER answers replay requests
[identity, b"", start_seq8] with [identity, b"", topic, seq8, payload] per buffered batch with seq ≥ start,
then [identity, b"", b"", END_SEQ, b""]; as vLLM ≤ 0.25 does, without the topic frames, if asked to.

- KVEventPublisher: the PUB socket (an XPUB where the caller waits for the subscription), its sequence
  numbers, the replay buffer and ROUTER; paced sending and redelivery of the last batch for load. One
  thread uses it: ZMQ sockets are not thread-safe.
- PublisherThread: the engine's, a KVEventPublisher on a thread of its own fed lists of events.
- NewBlockBatches: encoded batches of new GPU blocks, made cheaply enough for a flood.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from operator import itemgetter

import msgspec
import zmq

from kvscope.agent.tools.reference.tierstore import MEDIUM, BlockEvent
from kvscope.agent.tools.reference.vllm_kv_wire import Vllm033AllBlocksCleared as AllBlocksCleared
from kvscope.agent.tools.reference.vllm_kv_wire import Vllm033Batch as KVEventBatch
from kvscope.agent.tools.reference.vllm_kv_wire import Vllm033BlockRemoved as BlockRemoved
from kvscope.agent.tools.reference.vllm_kv_wire import Vllm033BlockStored as BlockStored
from kvscope.collectors.kv_events.schema import END_SEQ

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "Event", "KVEventBatch", "KVEventPublisher",
           "NewBlockBatches", "PublisherThread", "ReplayBuffer", "ReplayRouter", "to_wire"]

log = logging.getLogger("kvscope.reference.kv_events")

Event = BlockStored | BlockRemoved | AllBlocksCleared
Context = zmq.Context[zmq.Socket[bytes]]
VLLM_SNDHWM = 100_000  # KVEventsConfig.hwm
VLLM_BUFFER_STEPS = 10_000  # KVEventsConfig.buffer_steps
UNPACED_BURST = 64  # batches sent between two looks at the clock when unpaced
MIN_PACING_SLEEP = 0.0005  # a 2 kHz wake-up loop would load the subscriber's cores


def to_wire(e: BlockEvent) -> BlockStored | BlockRemoved:
    """The reference store's block event as vLLM 0.33 writes it; a reuse is announced again as a store
    (kv_cache_report_mode=full)."""
    medium, locality = MEDIUM[e.tier]
    if e.kind in ("stored", "reused"):
        return BlockStored([e.block.key], e.block.parent, list(e.block.token_ids), len(e.block.token_ids),
                           None, medium, None, locality=locality)
    return BlockRemoved([e.block.key], medium, locality=locality)


def seq_frame(seq: int) -> bytes:
    """A sequence number as its frame: 8 bytes, big-endian."""
    return seq.to_bytes(8, "big")


class ReplayBuffer:
    """The batches a replay can send again, by sequence number: the last `steps` kept (0 keeps none). Its
    writer and a replay thread may share it: each call is one dictionary operation, atomic under the GIL."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self._payloads: dict[int, bytes] = {}

    def put(self, seq: int, payload: bytes) -> None:
        if self.steps <= 0:
            return
        self._payloads[seq] = payload
        if len(self._payloads) > self.steps:
            del self._payloads[next(iter(self._payloads))]

    def __delitem__(self, seq: int) -> None:
        """Forgets one batch, as one that fell out of vLLM's ring."""
        del self._payloads[seq]

    def __len__(self) -> int:
        return len(self._payloads)

    def since(self, start: int) -> list[tuple[int, bytes]]:
        """The kept batches with seq ≥ start, in sequence order."""
        return sorted(((seq, p) for seq, p in list(self._payloads.items()) if seq >= start), key=itemgetter(0))


class ReplayRouter:
    """vLLM's replay ROUTER over a ReplayBuffer. `topic` is the topic frame of vLLM 0.26+'s replies; None
    answers as vLLM ≤ 0.25 does, without one. Invalid requests are logged and ignored, as vLLM does;
    `on_request` is told the start of each valid one before it is answered."""

    def __init__(self, context: Context, endpoint: str, buffer: ReplayBuffer, topic: bytes | None = b"",
                 on_request: Callable[[int], None] | None = None) -> None:
        self.socket = context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDHWM, 2 * (buffer.steps + 1))  # a whole buffer and its end marker
        self.socket.bind(endpoint)
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.buffer = buffer
        self.topic = topic
        self.on_request = on_request

    def serve(self, timeout: float = 0.0) -> bool:
        """Takes one request if one arrives within `timeout` seconds, and answers it if valid; whether one came."""
        if not self.socket.poll(int(timeout * 1000)):
            return False
        self._answer(self.socket.recv_multipart())
        return True

    def close(self) -> None:
        self.socket.close(0)

    def _answer(self, frames: list[bytes]) -> None:
        if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
            log.warning("ignoring an invalid replay request of %d frames", len(frames))
            return
        identity, start = frames[0], int.from_bytes(frames[2], "big")
        if self.on_request is not None:
            self.on_request(start)
        topic, end_topic = ([], []) if self.topic is None else ([self.topic], [b""])
        for seq, payload in self.buffer.since(start):
            self.socket.send_multipart([identity, b"", *topic, seq_frame(seq), payload])
        self.socket.send_multipart([identity, b"", *end_topic, END_SEQ, b""])


class KVEventPublisher:
    """vLLM's PUB side on `endpoint` (tcp://127.0.0.1:0 or :*: a port the OS chooses; `endpoint` then says
    which): one message per batch, every batch kept for replay in `buffer`, answered on `replay_endpoint`
    if given (serve_replay). Use it from one thread.

    `watch_subscriptions` makes the socket an XPUB, so that a caller can wait for the subscription instead of
    guessing (ZMQ's slow joiner); `bind_timeout` retries the bind that long while the address is in use (a
    just-closed socket frees its port asynchronously, in ZMQ's I/O thread: an engine restarted in place)."""

    def __init__(self, context: Context, endpoint: str = "tcp://127.0.0.1:*", *, topic: str = "",
                 replay_endpoint: str | None = None, buffer_steps: int = VLLM_BUFFER_STEPS,
                 sndhwm: int = VLLM_SNDHWM, data_parallel_rank: int | None = 0,
                 clock: Callable[[], float] = time.time, watch_subscriptions: bool = False,
                 bind_timeout: float = 0.0) -> None:
        self.socket = context.socket(zmq.XPUB if watch_subscriptions else zmq.PUB)
        self.socket.setsockopt(zmq.SNDHWM, sndhwm)
        self.socket.setsockopt(zmq.LINGER, 0)
        _bind(self.socket, endpoint, bind_timeout)
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.watches_subscriptions = watch_subscriptions
        self.topic = topic.encode()
        self.rank = data_parallel_rank
        self.clock = clock
        self.buffer = ReplayBuffer(buffer_steps)
        self.replay = ReplayRouter(context, replay_endpoint, self.buffer, self.topic) if replay_endpoint else None
        self.next_seq = 0
        self._last: list[bytes] | None = None
        self._encoder = msgspec.msgpack.Encoder()

    @property
    def replay_endpoint(self) -> str | None:
        return self.replay.endpoint if self.replay is not None else None

    # -- sending -------------------------------------------------------------------------------------------

    def send(self, seq: int, payload: bytes, live: bool = True) -> None:
        """Sends `payload` as batch `seq` and keeps it for replay; with `live` False it is only kept, as a
        batch lost on the way. The next batch is seq + 1 (a test may number any batch as it likes)."""
        self.buffer.put(seq, payload)
        if live:
            message = [self.topic, seq_frame(seq), payload]
            self.socket.send_multipart(message)
            self._last = message
        self.next_seq = seq + 1

    def send_next(self, payload: bytes) -> int:
        """Sends `payload` as the next batch; its sequence number."""
        seq = self.next_seq
        self.send(seq, payload)
        return seq

    def publish(self, events: list[Event]) -> int:
        """Sends `events` as the next batch, stamped with the clock and the data-parallel rank; its seq."""
        return self.send_next(self._encoder.encode(KVEventBatch(self.clock(), events, self.rank)))

    def stream(self, batch: Callable[[int], bytes], seconds: float, batches_per_second: float = 0.0) -> float:
        """Sends batch(seq) under the next sequence numbers for `seconds`: paced at `batches_per_second`
        (each batch once it is due, asleep until the next one is), or as fast as it can when 0. Returns the
        seconds it sent for."""
        start = time.perf_counter()
        sent = 0
        while (elapsed := time.perf_counter() - start) < seconds:
            due = int(elapsed * batches_per_second) + 1 if batches_per_second else sent + UNPACED_BURST
            for _ in range(due - sent):
                self.send_next(batch(self.next_seq))
            sent = max(sent, due)
            if batches_per_second:
                time.sleep(max(MIN_PACING_SLEEP, sent / batches_per_second - (time.perf_counter() - start)))
        return time.perf_counter() - start

    def redeliver_last(self, every: float, stop: Callable[[float], bool], at_most: float = math.inf) -> None:
        """Sends the last live batch again every `every` seconds until stop(every), which waits up to that
        long for the caller's signal, says so, or `at_most` seconds have passed. After a flood the last
        batch, the one that shows a subscriber any loss at the end, can be dropped like the others (ZMQ
        takes nothing into a full queue until the subscriber has drained half of it); a subscriber skips
        the copies as repeats."""
        if self._last is None:
            return
        deadline = time.monotonic() + at_most
        while time.monotonic() < deadline and not stop(every):
            self.socket.send_multipart(self._last)

    # -- the other side ------------------------------------------------------------------------------------

    def wait_subscribed(self, timeout: float = 5.0) -> None:
        """Waits for the next message of a watched socket, which must be a subscription. TimeoutError if
        none comes within `timeout` seconds, ConnectionError if an unsubscription comes instead."""
        if not self.watches_subscriptions:
            raise ValueError("only a publisher made with watch_subscriptions sees its subscriptions")
        if not self.socket.poll(int(timeout * 1000)):
            raise TimeoutError(f"no subscription arrived within {timeout:g} s")
        if self.socket.recv()[:1] != b"\x01":
            raise ConnectionError("an unsubscription arrived instead of a subscription")

    def serve_replay(self, timeout: float = 0.0) -> bool:
        """Answers one replay request if one arrives within `timeout` seconds; whether one came."""
        return self.replay is not None and self.replay.serve(timeout)

    def close(self, linger: float = 0.0) -> None:
        """Closes the sockets, leaving `linger` seconds to deliver what is queued (the context's term()
        waits for it)."""
        self.socket.close(int(linger * 1000))
        if self.replay is not None:
            self.replay.close()


def _bind(socket: zmq.Socket[bytes], endpoint: str, retry_for: float) -> None:
    """Binds `socket`, trying again for `retry_for` seconds while the address is in use."""
    deadline = time.monotonic() + retry_for
    while True:
        try:
            socket.bind(endpoint)
            return
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


class PublisherThread:
    """A KVEventPublisher on a thread of its own, which owns its sockets: the engine hands it lists of
    events through a queue, and each list becomes one batch, as vLLM sends one batch per engine step.
    Between batches the thread answers replay requests."""

    def __init__(self, publisher: KVEventPublisher) -> None:
        self.publisher = publisher
        self.endpoint = publisher.endpoint
        self.replay_endpoint = publisher.replay_endpoint
        self._queue: queue.Queue[list[Event] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def publish(self, events: list[Event]) -> None:
        """Thread-safe: queues one batch (none for no events)."""
        if events:
            self._queue.put(events)

    def publish_block_events(self, events: list[BlockEvent]) -> None:
        self.publish([to_wire(e) for e in events])

    def clear_all(self) -> None:
        self.publish([AllBlocksCleared()])

    def close(self) -> None:
        """Sends what is queued, stops the thread and closes the sockets."""
        self._queue.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.publisher.close()

    def _run(self) -> None:
        while True:
            self.publisher.serve_replay()
            try:
                events = self._queue.get(timeout=0.01)
            except queue.Empty:
                continue
            if events is None:
                return
            self.publisher.publish(events)


LOAD_TOKENS = list(range(100_000, 100_016))  # a 16-token block of 5-byte token ids
_PLACEHOLDER_HASH = 0xA5A5A5A5A5A5A5A5  # found in the encoded template and overwritten per batch
_GOLDEN = 0x9E3779B97F4A7C15


class NewBlockBatches:
    """Encoded vLLM 0.33 batches of `events` BlockStored of new GPU blocks (16 tokens of 5-byte ids, ~190
    bytes an event), for load: one batch encoded once as a template, and each batch's block hashes, derived
    from its sequence number and each event's place in it, written into a copy."""

    def __init__(self, events: int) -> None:
        stored: list[Event] = [BlockStored([_PLACEHOLDER_HASH], None, LOAD_TOKENS, 16, None, "GPU", None)
                               for _ in range(events)]
        self._template = bytearray(msgspec.msgpack.encode(KVEventBatch(time.time(), stored, 0)))
        self._offsets = self._hash_offsets()
        assert len(self._offsets) == events
        self.events = events

    def batch(self, seq: int) -> bytes:
        """Batch `seq`: every hash in it new (a uint64 written over a placeholder, so always 8 bytes)."""
        body, first = self._template, seq * self.events
        for place, at in enumerate(self._offsets):
            body[at:at + 8] = (((first + place + 1) * _GOLDEN) % 2**64 | 1).to_bytes(8, "big")
        return bytes(body)

    def _hash_offsets(self) -> list[int]:
        mark = b"\xcf" + _PLACEHOLDER_HASH.to_bytes(8, "big")  # msgpack uint64
        offsets, at = [], self._template.find(mark)
        while at >= 0:
            offsets.append(at + 1)
            at = self._template.find(mark, at + 1)
        return offsets
