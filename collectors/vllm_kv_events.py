"""vLLM KV-cache events: a ZMQ subscriber that tracks block residency per tier (facts/vllm.md §2).

One SUB socket per data-parallel rank (vLLM offsets the port by the rank). A background thread started
by `start()` receives `[topic, seq (8 bytes, big-endian), msgpack batch]`, decodes the batch in either wire
format and applies it to that rank's Residency; `collect()` reports the aggregates, including the KV bytes
each tier holds (resident blocks × the events' block_size × the `kv_bytes_per_token` option) where all
three are known. Aggregating in the socket thread is the fastest bounded design here: a second Python
thread would only add a hand-off under the GIL. The bound is ZMQ's own receive queue (RCVHWM); when it and
the publisher's send queue are full, vLLM's PUB drops whole batches without blocking the engine, and the
gap shows in the sequence numbers.

Sequence numbers (per publisher, from 0, +1 per batch, restart at 0 with the process):
- a gap is counted as dropped; with a replay endpoint the missing batches are asked of vLLM's ROUTER
  (DEALER, `[b"", start_seq8]`) and applied in order before the batch that revealed the gap; whatever
  could not be recovered is counted as missed and makes residency unknown;
- a subscriber that joins late (first seq > 0) asks for a replay from 0: residency is known only if the
  replay buffer still reaches back to seq 0;
- a seq lower than expected is an engine restart: that rank's residency is cleared (a new process starts
  with empty caches) and the stream is treated as starting at 0.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import zmq

from kvscope.agent.catalogue import counter, gauge, histogram
from kvscope.agent.contract import ENGINE_LABELS, KV_RESIDENT_BLOCKS, TIER_USED_BYTES
from kvscope.agent.pipeline import CollectorContext, CollectorSpec
from kvscope.agent.readings import HistogramSample, Reading, Sample
from kvscope.agent.tiers import STORAGE_TIERS, Tier
from kvscope.collectors.kv_event_schema import END_SEQ, EVENT_TYPES, BatchDecoder, DecodedBatch, MalformedBatch
from kvscope.collectors.kv_residency import BLOCK_SIZE_MIXED, BLOCK_SIZE_NOT_SENT, Residency

log = logging.getLogger("kvscope.vllm_kv_events")

NAME = "vllm_kv_events"
_E = ENGINE_LABELS
STORED_TOTAL = "kvscope_kv_blocks_stored_total"
REMOVED_TOTAL = "kvscope_kv_blocks_removed_total"
REMOVED_UNKNOWN_TOTAL = "kvscope_kv_blocks_removed_unknown_total"
EVENTS_TOTAL = "kvscope_kv_events_total"
DROPPED_TOTAL = "kvscope_kv_events_dropped_total"
MALFORMED_TOTAL = "kvscope_kv_events_malformed_total"
MISSED_TOTAL = "kvscope_kv_events_missed_total"
REPLAYED_TOTAL = "kvscope_kv_events_replayed_total"
RESTARTS_TOTAL = "kvscope_kv_publisher_restarts_total"
RESIDENCY_KNOWN = "kvscope_kv_residency_known"
REUSE_DISTANCE = "kvscope_kv_block_reuse_distance_blocks"
REUSE_EVICTED_TOTAL = "kvscope_kv_reuse_tracker_evicted_blocks_total"
REUSE_STORES_TOTAL = "kvscope_kv_reuse_tracker_stores_blocks_total"

_SRC = "vLLM KV events"
METRICS = (
    counter(STORED_TOTAL, "blocks", (*_E, "tier"),
            "Blocks that became resident in the tier (a store of a block already resident is not counted).",
            _SRC),
    counter(REMOVED_TOTAL, "blocks", (*_E, "tier"),
            "Resident blocks that left the tier (BlockRemoved, AllBlocksCleared for G1, engine restart).",
            _SRC),
    counter(REMOVED_UNKNOWN_TOTAL, "blocks", (*_E, "tier"),
            "BlockRemoved of blocks not resident in our view (stored before we joined or in a lost batch); "
            "ignored.", _SRC),
    counter(EVENTS_TOTAL, "events", (*_E, "type"),
            "KV events applied, by type (BlockStored, BlockRemoved, AllBlocksCleared, unknown).", _SRC),
    counter(DROPPED_TOTAL, "", _E,
            "Event batches missing from the live stream (sequence gaps), recovered by replay or not.", _SRC),
    counter(MISSED_TOTAL, "", _E,
            "Event batches lost for good: sequence gaps that replay did not recover.", _SRC),
    counter(REPLAYED_TOTAL, "", _E,
            "Event batches fetched from vLLM's replay endpoint and applied (gap fills and late-join catch-up).",
            _SRC),
    counter(MALFORMED_TOTAL, "", _E,
            "ZMQ messages skipped as garbage: wrong frame count, bad sequence frame, bad msgpack, wrong shape.",
            _SRC),
    counter(RESTARTS_TOTAL, "", _E, "Publisher restarts seen (the sequence number went backwards).", _SRC),
    gauge(RESIDENCY_KNOWN, "", (*_E, "tier"),
          "1 when the tier's residency is complete (seen from seq 0, or G1 since an AllBlocksCleared); "
          "0 for a late joiner or after lost batches. kvscope_kv_resident_blocks is absent while 0.", _SRC),
    histogram(REUSE_DISTANCE, "blocks", (*_E, "tier"),
              "Distinct blocks stored in the tier between two stores of the same block (LRU stack distance). "
              "Estimated from a hash-sampled subset of blocks (reuse_sample_rate; distances and counts scaled "
              "by 1/rate), exact at rate 1.", _SRC),
    counter(REUSE_EVICTED_TOTAL, "blocks", (*_E, "tier"),
            "Blocks the reuse-distance tracker forgot to stay within its memory cap (oldest first; sampled "
            "blocks scaled by 1/reuse_sample_rate).", _SRC),
    counter(REUSE_STORES_TOTAL, "blocks", (*_E, "tier"),
            "Block stores the reuse-distance tracker saw, first uses and reuses (sampled stores scaled by "
            "1/reuse_sample_rate). LRU miss ratio of a b+1 block cache = 1 - reuse_distance bucket{le=b} / this.",
            _SRC),
)

# why a tier with resident blocks has no used bytes (logged once per rank and tier)
_NO_SIZE_WHY = {
    BLOCK_SIZE_MIXED: "its resident blocks were stored with different block sizes",
    BLOCK_SIZE_NOT_SENT: "its BlockStored events carry no block_size and default_block_size is 0",
}

_TCP = re.compile(r"^tcp://(?P<host>\[[^\]]+\]|[^:/]+):(?P<port>\d+)$")


def rank_endpoint(endpoint: str, rank: int) -> str:
    """vLLM's per-rank address: TCP port + rank, `inproc://x` → `inproc://x_dp<rank>` (facts §2.1)."""
    if rank == 0:
        return endpoint
    m = _TCP.match(endpoint)
    if m:
        return f"tcp://{m['host']}:{int(m['port']) + rank}"
    if endpoint.startswith("inproc://"):
        return f"{endpoint}_dp{rank}"
    raise ValueError(f"{endpoint}: per-rank endpoints are known only for tcp:// and inproc://")


def _check_endpoint(key: str, endpoint: str, ranks: int) -> None:
    m = _TCP.match(endpoint)
    if m:
        if m["host"] in ("*", "0.0.0.0", "[::]", "::"):
            raise ValueError(f"{key}: {endpoint!r} is a bind address; give the address this host connects "
                             "to, e.g. tcp://127.0.0.1:5557")
        if not 0 < int(m["port"]) + ranks - 1 < 65536:
            raise ValueError(f"{key}: port out of range for {ranks} rank(s)")
    elif endpoint.startswith("ipc://") and ranks > 1:
        raise ValueError(f"{key}: ipc:// endpoints are supported only with data_parallel_size = 1")
    elif not endpoint.startswith(("ipc://", "inproc://")):
        raise ValueError(f"{key}: expected tcp://HOST:PORT, ipc://PATH or inproc://NAME, got {endpoint!r}")


@dataclass
class VllmKvEventsOptions:
    endpoint: str = ""  # vLLM's --kv-events-config endpoint as this host reaches it (rank 0's)
    replay_endpoint: str = ""  # vLLM's replay_endpoint (ROUTER), rank 0's; "" = no replay
    topic: str = ""  # vLLM's topic; "" receives every topic
    data_parallel_size: int = 1  # one SUB per rank 0..n-1, port offset by the rank
    engine: str = "vllm"
    model: str = ""  # served model name (events do not carry it)
    rcvhwm: int = 100000  # ZMQ receive high-water mark, in messages (vLLM's PUB default hwm)
    replay_timeout: float = 2.0  # seconds to wait for a replay before counting the gap as missed
    reuse_max_tracked_blocks: int = 131072  # sampled blocks remembered per rank and tier; ~150 B each
    reuse_sample_rate: float = 1 / 16  # fraction of blocks the reuse-distance histogram tracks (SHARDS)
    # KV bytes one token occupies, from the model's KV geometry (`kvscope kv-size --model M` prints it);
    # not on the wire. 0 = unknown: kvscope_tier_used_bytes is not exported.
    kv_bytes_per_token: int = 0
    # tokens per block hash for stores whose BlockStored carries no block_size (0 on the wire, as vLLM's
    # offload placeholder events send); a size the events carry always wins. 0 = unknown.
    default_block_size: int = 0

    def validate(self, path: str) -> None:
        if not self.endpoint:
            raise ValueError("endpoint: required when the collector is enabled (vLLM's kv-events endpoint "
                             "as this host connects to it, e.g. tcp://127.0.0.1:5557)")
        if not self.model:
            raise ValueError("model: required when the collector is enabled (the served model name; "
                             "KV events do not carry it)")
        if self.data_parallel_size < 1:
            raise ValueError(f"data_parallel_size: must be >= 1, got {self.data_parallel_size}")
        _check_endpoint("endpoint", self.endpoint, self.data_parallel_size)
        if self.replay_endpoint:
            _check_endpoint("replay_endpoint", self.replay_endpoint, self.data_parallel_size)
        if self.rcvhwm < 1:
            raise ValueError(f"rcvhwm: must be >= 1 (0 would make ZMQ's queue unbounded), got {self.rcvhwm}")
        if self.replay_timeout <= 0:
            raise ValueError(f"replay_timeout: must be > 0, got {self.replay_timeout}")
        if self.reuse_max_tracked_blocks < 1:
            raise ValueError("reuse_max_tracked_blocks: must be >= 1")
        if not 1e-6 <= self.reuse_sample_rate <= 1:
            raise ValueError(f"reuse_sample_rate: must be in [1e-6, 1] (1 = exact), got {self.reuse_sample_rate}")
        if self.kv_bytes_per_token < 0:
            raise ValueError(f"kv_bytes_per_token: must be >= 0 (0 = unknown), got {self.kv_bytes_per_token}")
        if self.default_block_size < 0:
            raise ValueError(f"default_block_size: must be >= 0 (0 = unknown), got {self.default_block_size}")


class _Stream:
    """One publisher (data-parallel rank): its socket address, sequence state and aggregates."""

    def __init__(self, rank: int, endpoint: str, replay: str, max_tracked: int, sample_rate: float) -> None:
        self.rank = rank
        self.labels = ("", "", str(rank))
        self.endpoint = endpoint
        self.replay = replay
        self.residency = Residency(max_tracked, sample_rate)
        self.expected: int | None = None
        self.dropped = self.missed = self.replayed = self.malformed = self.restarts = 0
        self.logged: set[str] = set()


class VllmKvEventsCollector:
    def __init__(self, options: VllmKvEventsOptions, zmq_context: zmq.Context[Any] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._opts = options
        self._own_ctx = zmq_context is None
        self._ctx: zmq.Context[Any] = zmq_context if zmq_context is not None else zmq.Context()
        self._clock = clock
        self._decoder = BatchDecoder()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.ready = threading.Event()  # set once every SUB socket is connected and subscribed
        self._thread: threading.Thread | None = None
        n = options.data_parallel_size
        self.streams = [
            _Stream(r, rank_endpoint(options.endpoint, r),
                    rank_endpoint(options.replay_endpoint, r) if options.replay_endpoint else "",
                    options.reuse_max_tracked_blocks, options.reuse_sample_rate)
            for r in range(n)
        ]
        for s in self.streams:
            s.labels = (options.engine, options.model, str(s.rank))

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"{NAME}-sub", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        if self._own_ctx:
            self._ctx.term()

    # -- socket thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        socks: dict[zmq.Socket[Any], _Stream] = {}
        try:
            for stream in self.streams:
                sock = self._ctx.socket(zmq.SUB)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.RCVHWM, self._opts.rcvhwm)
                sock.setsockopt(zmq.SUBSCRIBE, self._opts.topic.encode())
                sock.connect(stream.endpoint)
                poller.register(sock, zmq.POLLIN)
                socks[sock] = stream
            self.ready.set()
            while not self._stop.is_set():
                for sock, _ in poller.poll(100):
                    stream = socks[sock]
                    for _ in range(1024):  # drain, but let other ranks and stop() have a turn
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self.handle(stream, frames)
        except zmq.ContextTerminated:
            pass
        finally:
            for sock in socks:
                sock.close(0)

    def handle(self, stream: _Stream, frames: list[bytes]) -> None:
        """One live message: validate, decode, reconcile the sequence number, apply."""
        if len(frames) != 3 or len(frames[1]) != 8:
            self._malformed(stream, f"{len(frames)} frames (seq frame {len(frames[1]) if len(frames) > 1 else 0}"
                                    " bytes); expected [topic, seq(8), payload]")
            return
        try:
            batch = self._decoder.decode(frames[2])
        except MalformedBatch as exc:
            self._malformed(stream, f"payload: {exc}")
            return
        seq = int.from_bytes(frames[1], "big")
        if seq == stream.expected:  # the common case: in order (never true before the first batch: None)
            with self._lock:
                stream.residency.apply(batch.events, batch.unknown_events, batch.gpu_stores_only)
            stream.expected = seq + 1
            return
        self._reconcile(stream, seq, batch)
        stream.expected = seq + 1

    def _reconcile(self, stream: _Stream, seq: int, batch: DecodedBatch) -> None:
        """Out-of-order seq (first message, gap or restart): replay what is missing, then apply it and
        `batch` in one locked step, so a collection never sees half of it."""
        expected = stream.expected
        first = expected is None
        restart = expected is not None and seq < expected
        start = 0 if expected is None or restart else expected
        want = seq - start
        recovered = self._fetch_replay(stream, start, seq) if want and stream.replay else []
        missing = want - len(recovered)
        with self._lock:
            res = stream.residency
            if restart:
                stream.restarts += 1
                res.restart()
            for old in recovered:
                res.apply(old.events, old.unknown_events, old.gpu_stores_only)
            stream.replayed += len(recovered)
            if not first:  # a late joiner's earlier batches were never ours to lose
                stream.dropped += want
                stream.missed += missing
            if missing:
                res.set_complete(False)
            elif first or restart:
                res.set_complete(True)  # every batch since seq 0 is applied
            res.apply(batch.events, batch.unknown_events, batch.gpu_stores_only)
        if restart:
            self._log_once(stream, "restart", "publisher restarted (seq %d after %d)", seq, expected)
        if missing and not first:
            self._log_once(stream, "missed", "lost %d event batch(es) before seq %d; residency unknown "
                           "until the next AllBlocksCleared or restart", missing, seq)
        elif missing:
            self._log_once(stream, "late", "joined at seq %d without a full replay; residency unknown", seq)

    def _fetch_replay(self, stream: _Stream, start: int, stop: int) -> list[DecodedBatch]:
        """Batches start..stop-1 from vLLM's ROUTER, in seq order (holes possible)."""
        got: dict[int, DecodedBatch] = {}
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(stream.replay)
            sock.send_multipart([b"", start.to_bytes(8, "big")])
            deadline = self._clock() + self._opts.replay_timeout
            while True:
                remaining = deadline - self._clock()
                if remaining <= 0 or not sock.poll(int(remaining * 1000) + 1):
                    self._log_once(stream, "replay-timeout", "replay from %s timed out", stream.replay)
                    break
                frames = sock.recv_multipart()
                # 0.26+: [b"", topic, seq, payload]; <= 0.25: [b"", seq, payload]; end: empty payload
                if len(frames) not in (3, 4) or frames[0] != b"" or len(frames[-2]) != 8:
                    self._malformed(stream, f"replay reply of {len(frames)} frames")
                    continue
                seq_bytes, payload = frames[-2], frames[-1]
                if seq_bytes == END_SEQ or not payload:
                    break
                seq = int.from_bytes(seq_bytes, "big")
                if start <= seq < stop:
                    try:
                        got[seq] = self._decoder.decode(payload)
                    except MalformedBatch as exc:
                        self._malformed(stream, f"replayed payload: {exc}")
                if seq >= stop - 1:
                    break  # the rest of the buffer will arrive live
        finally:
            sock.close(0)
        return [got[s] for s in sorted(got)]

    def _malformed(self, stream: _Stream, why: str) -> None:
        with self._lock:
            stream.malformed += 1
        self._log_once(stream, "malformed", "skipping malformed message: %s", why)

    def _log_once(self, stream: _Stream, kind: str, msg: str, *args: object) -> None:
        if kind not in stream.logged:
            stream.logged.add(kind)
            log.warning("rank %d (%s): " + msg + " (logged once)", stream.rank, stream.endpoint, *args)

    # -- collection --------------------------------------------------------------------------------

    def collect(self) -> Iterable[Reading]:
        out: list[Reading] = []
        with self._lock:
            for s in self.streams:
                out.extend(self._readings(s))
        return out

    def _readings(self, s: _Stream) -> list[Reading]:
        lab = s.labels
        res = s.residency
        bytes_per_token = self._opts.kv_bytes_per_token
        out: list[Reading] = [
            Sample(DROPPED_TOTAL, lab, s.dropped),
            Sample(MISSED_TOTAL, lab, s.missed),
            Sample(REPLAYED_TOTAL, lab, s.replayed),
            Sample(MALFORMED_TOTAL, lab, s.malformed),
            Sample(RESTARTS_TOTAL, lab, s.restarts),
        ]
        for name, n in zip(EVENT_TYPES, res.events, strict=True):
            out.append(Sample(EVENTS_TOTAL, (*lab, name), n))
        out.append(Sample(EVENTS_TOTAL, (*lab, "unknown"), res.unknown_events))
        for tier in STORAGE_TIERS:
            res.tier(tier)
        for tier, st in res.tiers.items():
            if tier is Tier.UNATTRIBUTED and not st.stored and not st.removed_unknown:
                continue
            tl = (*lab, tier.value)
            out.append(Sample(RESIDENCY_KNOWN, tl, 1.0 if st.known else 0.0))
            if st.known:
                blocks = len(st.resident)
                out.append(Sample(KV_RESIDENT_BLOCKS, tl, blocks))
                if bytes_per_token:
                    tokens = st.block_tokens(self._opts.default_block_size)
                    if tokens or not blocks:
                        out.append(Sample(TIER_USED_BYTES, tl, blocks * tokens * bytes_per_token))
                    elif st.block_size in _NO_SIZE_WHY:  # not while pending: a sized batch is near
                        self._log_once(s, f"block-size-{tier.value}", "no kvscope_tier_used_bytes for %s: %s",
                                       tier.value, _NO_SIZE_WHY[st.block_size])
            out.append(Sample(STORED_TOTAL, tl, st.stored))
            out.append(Sample(REMOVED_TOTAL, tl, st.removed))
            out.append(Sample(REMOVED_UNKNOWN_TOTAL, tl, st.removed_unknown))
            buckets, total, count = st.reuse.cumulative()
            out.append(HistogramSample(REUSE_DISTANCE, tl, buckets, total, count))
            out.append(Sample(REUSE_EVICTED_TOTAL, tl, st.reuse.estimated_evicted))
            out.append(Sample(REUSE_STORES_TOTAL, tl, st.reuse.estimated_uses))
        return out


def _factory(options: VllmKvEventsOptions, context: CollectorContext) -> VllmKvEventsCollector:
    return VllmKvEventsCollector(options, None, context.clock)


SPEC = CollectorSpec(
    name=NAME,
    description="vLLM KV-cache events over ZMQ: block residency per tier, reuse distance, loss accounting",
    options=VllmKvEventsOptions,
    factory=_factory,
    metrics=METRICS,
    enabled_by_default=False,
)
