"""vLLM KV-cache events: a ZMQ subscriber that tracks block residency per tier (facts/vllm.md §2).

One SUB socket per data-parallel rank (vLLM offsets the port by the rank). A background thread started
by `start()` receives `[topic, seq (8 bytes, big-endian), msgpack batch]` into a queue bounded in bytes
(subscriber.py, in this folder), decodes each batch in either wire format (schema.py), reconciles its
sequence number (sequence.py: gaps, replay, restarts, repeats, impossible numbers, a lost tail) and
applies it to that rank's Residency (residency.py); `collect()` reports the aggregates, including
the KV bytes each tier holds (resident blocks × the events' block_size × the `kv_bytes_per_token`
option) where all three are known.

After batches lost for good, resident blocks stay exported as an estimate beside
`kvscope_kv_residency_known` 0 (residency.py: a tier anchored once in a known state); a late joiner's
stay absent. With `tenants_top_n`, G1 lookups and hits per LoRA adapter (tenants.py).

Nothing a publisher sends stops the thread: every message it cannot take is counted and skipped. Should
the thread end all the same, the next collection fails (kvscope_collector_up 0) and starts a new one.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import zmq

from kvscope.agent.core.catalogue import counter, gauge, histogram
from kvscope.agent.core.contract import ENGINE_LABELS, KV_RESIDENT_BLOCKS, TIER_USED_BYTES
from kvscope.agent.core.kv_access import KvAccessLog
from kvscope.agent.core.pipeline import CollectorContext, CollectorSpec
from kvscope.agent.core.readings import HistogramSample, Reading, Sample
from kvscope.agent.core.streams import KV_ACCESS, StreamUse
from kvscope.agent.core.tenants import TenantCap, check_tenant_options
from kvscope.agent.core.tiers import STORAGE_TIERS, Tier
from kvscope.collectors.kv_events.residency import BLOCK_SIZE_MIXED, BLOCK_SIZE_NOT_SENT, Residency, tier_of
from kvscope.collectors.kv_events.schema import EVENT_TYPES, BatchDecoder, DecodedBatch, MalformedBatch
from kvscope.collectors.kv_events.sequence import Sequencer, Stream, log_once
from kvscope.collectors.kv_events.subscriber import Frames, Receiver, SocketOptions
from kvscope.collectors.kv_events.tenants import TENANT_METRICS, TenantAccounting, TenantBatchDecoder, tenant_readings

log = logging.getLogger("kvscope.vllm_kv_events")

NAME = "vllm_kv_events"
MIB = 1 << 20
_E = ENGINE_LABELS
STORED_TOTAL = "kvscope_kv_blocks_stored_total"
REMOVED_TOTAL = "kvscope_kv_blocks_removed_total"
REMOVED_UNKNOWN_TOTAL = "kvscope_kv_blocks_removed_unknown_total"
REANNOUNCED_TOTAL = "kvscope_kv_blocks_reannounced_total"
EVENTS_TOTAL = "kvscope_kv_events_total"
DROPPED_TOTAL = "kvscope_kv_events_dropped_total"
MALFORMED_TOTAL = "kvscope_kv_events_malformed_total"
MISSED_TOTAL = "kvscope_kv_events_missed_total"
REPLAYED_TOTAL = "kvscope_kv_events_replayed_total"
REPEATED_TOTAL = "kvscope_kv_events_repeated_total"
REJECTED_TOTAL = "kvscope_kv_events_rejected_total"
SHED_TOTAL = "kvscope_kv_events_shed_total"
QUEUED_BYTES = "kvscope_kv_events_queued_bytes"
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
    counter(REANNOUNCED_TOTAL, "blocks", (*_E, "tier"),
            "Stores of a block already resident in the tier: reused blocks vLLM re-announces for a request with "
            "kv_cache_report_mode=full (every store counted, not sampled).", _SRC),
    counter(REMOVED_TOTAL, "blocks", (*_E, "tier"),
            "Resident blocks that left the tier (BlockRemoved, AllBlocksCleared for G1, engine restart).",
            _SRC),
    counter(REMOVED_UNKNOWN_TOTAL, "blocks", (*_E, "tier"),
            "BlockRemoved of blocks not resident in our view (stored before we joined or in a lost batch); "
            "ignored.", _SRC),
    counter(EVENTS_TOTAL, "events", (*_E, "type"),
            "KV events applied, by type (BlockStored, BlockRemoved, AllBlocksCleared, unknown).", _SRC),
    counter(DROPPED_TOTAL, "", _E,
            "Event batches missing from the live stream (sequence gaps, and a lost tail found through replay), "
            "recovered by replay or not.", _SRC),
    counter(MISSED_TOTAL, "", _E,
            "Event batches lost for good: sequence gaps that replay did not recover.", _SRC),
    counter(REPLAYED_TOTAL, "", _E,
            "Event batches fetched from vLLM's replay endpoint and applied (gap fills and late-join catch-up).",
            _SRC),
    counter(MALFORMED_TOTAL, "", _E,
            "ZMQ messages skipped as garbage: wrong frame count, bad sequence frame, bad msgpack, wrong shape.",
            _SRC),
    counter(REPEATED_TOTAL, "", _E,
            "Event batches whose sequence number was already applied and that are not newer than the last one "
            "applied (the same batch again, or an older one); skipped.", _SRC),
    counter(REJECTED_TOTAL, "", _E,
            "Event batches with a sequence number that cannot be: 2**63 or more, or a jump beyond max_seq_gap "
            "that the next batch did not continue; skipped.", _SRC),
    counter(SHED_TOTAL, "", _E,
            "Event batches dropped because kvscope's receive queue was full (max_queue_bytes), counted when "
            "dropped; each also counts in kvscope_kv_events_dropped_total once a later batch shows the gap.",
            _SRC),
    gauge(QUEUED_BYTES, "bytes", _E, "Bytes of received messages waiting in kvscope's receive queue.", _SRC),
    counter(RESTARTS_TOTAL, "", _E,
            "Publisher restarts seen (the sequence number went backwards with a newer batch).", _SRC),
    gauge(RESIDENCY_KNOWN, "", (*_E, "tier"),
          "1 when the tier's residency is exact (seen from seq 0, G1 since an AllBlocksCleared, or since a "
          "publisher restart); 0 for a late joiner (kvscope_kv_resident_blocks absent) or after lost batches "
          "(kvscope_kv_resident_blocks is then an estimate, off by at most the blocks the lost batches stored "
          "and removed).", _SRC),
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
    *TENANT_METRICS,
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
    # Memory (subscriber.py): our queue in bytes, plus ZMQ's per socket in messages of at most
    # max_message_bytes each (a larger frame makes ZMQ drop the connection: a sequence gap).
    max_queue_bytes: int = 32 * MIB
    max_message_bytes: int = 4 * MIB
    rcvhwm: int = 8  # ZMQ receive high-water mark, in messages; beyond it the publisher's queue holds them
    replay_timeout: float = 2.0  # seconds without a reply before a replay is given up (the rest is missed)
    tail_check_after: float = 1.0  # seconds of quiet after which the replay endpoint is asked for a lost tail
    # a seq more than this beyond the expected one is believed only when the next batch continues it
    # (vLLM's default replay buffer: a larger gap could not be filled anyway)
    max_seq_gap: int = 10000
    reuse_max_tracked_blocks: int = 131072  # sampled blocks remembered per rank and tier; ~150 B each
    reuse_sample_rate: float = 1 / 16  # fraction of blocks the reuse-distance histogram tracks (SHARDS)
    # KV bytes one token occupies, from the model's KV geometry (`kvscope kv-size --model M` prints it);
    # not on the wire. 0 = unknown: kvscope_tier_used_bytes is not exported.
    kv_bytes_per_token: int = 0
    # tokens per block hash for stores whose BlockStored carries no block_size (0 on the wire, as vLLM's
    # offload placeholder events send); a size the events carry always wins. 0 = unknown.
    default_block_size: int = 0
    # the medium of events that carry none: Dynamo 1.6.1's mocker workers (--zmq-kv-events-ports) send no medium
    # on their G1 events; "GPU" puts them in G1. "" leaves them unattributed, as vLLM before mediums.
    default_medium: str = ""
    # G1 lookups and hits per tenant (LoRA adapter; collectors/kv_events/tenants.py): the top N tenants by
    # recent lookups get series of their own, the rest share tenant="other". 0 = off.
    tenants_top_n: int = 0
    tenants_max_tracked: int = 1000  # tenants remembered between collections (the busiest)

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
        if self.max_message_bytes < 1024:
            raise ValueError(f"max_message_bytes: must be >= 1024, got {self.max_message_bytes}")
        if self.max_queue_bytes < self.max_message_bytes:
            raise ValueError(f"max_queue_bytes: must be >= max_message_bytes ({self.max_message_bytes}), "
                             f"got {self.max_queue_bytes}")
        if self.replay_timeout <= 0:
            raise ValueError(f"replay_timeout: must be > 0, got {self.replay_timeout}")
        if self.tail_check_after <= 0:
            raise ValueError(f"tail_check_after: must be > 0, got {self.tail_check_after}")
        if self.max_seq_gap < 1:
            raise ValueError(f"max_seq_gap: must be >= 1, got {self.max_seq_gap}")
        if self.reuse_max_tracked_blocks < 1:
            raise ValueError("reuse_max_tracked_blocks: must be >= 1")
        if not 1e-6 <= self.reuse_sample_rate <= 1:
            raise ValueError(f"reuse_sample_rate: must be in [1e-6, 1] (1 = exact), got {self.reuse_sample_rate}")
        if self.kv_bytes_per_token < 0:
            raise ValueError(f"kv_bytes_per_token: must be >= 0 (0 = unknown), got {self.kv_bytes_per_token}")
        check_tenant_options(self.tenants_top_n, self.tenants_max_tracked)
        if self.default_block_size < 0:
            raise ValueError(f"default_block_size: must be >= 0 (0 = unknown), got {self.default_block_size}")
        if self.default_medium and tier_of(self.default_medium, None) is Tier.UNATTRIBUTED:
            raise ValueError(f"default_medium: must be GPU, CPU, STORAGE or \"\" (none), got {self.default_medium!r}")


class VllmKvEventsCollector:
    def __init__(self, options: VllmKvEventsOptions, zmq_context: zmq.Context[Any] | None = None,
                 clock: Callable[[], float] = time.monotonic, access_log: KvAccessLog | None = None) -> None:
        self._opts = options
        self._own_ctx = zmq_context is None
        self._ctx: zmq.Context[Any] = zmq_context if zmq_context is not None else zmq.Context()
        self._clock = clock
        self._decoder = TenantBatchDecoder() if options.tenants_top_n else BatchDecoder()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.ready = threading.Event()  # set once every SUB socket is connected and subscribed
        self._thread: threading.Thread | None = None
        self.thread_restarts = 0  # socket threads that died and were started again
        # with the what-if analysis on, each rank's sampled G1 stores also go to its access stream
        labels = [(options.engine, options.model, str(r)) for r in range(options.data_parallel_size)]
        self.streams = [
            Stream(r, rank_endpoint(options.endpoint, r),
                   rank_endpoint(options.replay_endpoint, r) if options.replay_endpoint else "",
                   Residency(options.reuse_max_tracked_blocks, options.reuse_sample_rate,
                             access_log.stream(labels[r], options.reuse_sample_rate) if access_log else None,
                             options.default_medium or None),
                   labels[r])
            for r in range(options.data_parallel_size)
        ]
        if options.tenants_top_n:
            for s in self.streams:
                s.residency.tenants = TenantAccounting(TenantCap(options.tenants_top_n, options.tenants_max_tracked),
                                                       options.default_medium or None)
        self.receiver = Receiver(self._ctx, self.streams, SocketOptions(
            options.topic.encode(), options.rcvhwm, options.max_message_bytes, options.max_queue_bytes,
            options.replay_timeout, options.tail_check_after), self.handle_many, self._check_tail, clock)
        self._sequencer = Sequencer(self._lock, self._replay_batches if options.replay_endpoint else None,
                                    options.max_seq_gap)

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self.receiver.run, args=(self._stop, self.ready),
                                            name=f"{NAME}-sub", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        if self._own_ctx:
            self._ctx.term()

    def _supervise(self) -> None:
        """The socket thread never ends on its own while running; if it did, start a fresh one and fail
        this collection (kvscope_collector_up 0). What it was applying when it died is unknown, and
        batches sent while it was down show as a gap: residency is unknown until it is known again."""
        thread = self._thread
        if thread is None or thread.is_alive() or self._stop.is_set():
            return
        self.thread_restarts += 1
        with self._lock:
            for s in self.streams:
                s.residency.set_complete(False)
                s.queued_bytes = 0
        self.receiver = Receiver(self._ctx, self.streams, self.receiver.options, self.handle_many, self._check_tail,
                                 self._clock)
        self.ready = threading.Event()
        self._thread = None
        self.start()
        raise RuntimeError(f"the KV-event socket thread had stopped; started it again (restart "
                           f"{self.thread_restarts}); residency unknown until it is complete again")

    # -- socket thread -----------------------------------------------------------------------------

    def handle(self, stream: Stream, frames: Frames) -> None:
        """One live message (see handle_many)."""
        self.handle_many(stream, [frames])

    def handle_many(self, stream: Stream, messages: list[Frames]) -> None:
        """Live messages of one rank, in the order they came: validate and decode each, then reconcile
        their sequence numbers and apply them (Sequencer.accept_many: a run in order is applied in one
        step). Never raises: a message the code cannot take is counted as malformed and makes residency
        unknown; if applying fails (a bug), the run is counted as one malformed message and the batches
        after it show as a gap."""
        decoded: list[tuple[int, DecodedBatch]] = []
        decode = self._decoder.decode
        for frames in messages:
            try:
                if len(frames) != 3 or len(frames[1]) != 8:
                    self._malformed(stream, f"{len(frames)} frames (seq frame "
                                            f"{len(frames[1]) if len(frames) > 1 else 0} bytes); expected "
                                            "[topic, seq(8), payload]")
                    continue
                try:
                    batch = decode(frames[2])
                except MalformedBatch as exc:
                    self._malformed(stream, f"payload: {exc}")
                    continue
                decoded.append((int.from_bytes(frames[1], "big"), batch))
            except Exception as exc:  # a bug, or an input nobody foresaw: the thread must go on
                self._internal(stream, exc)
        if not decoded:
            return
        try:
            self._sequencer.accept_many(stream, decoded)
        except Exception as exc:
            self._internal(stream, exc)

    def _internal(self, stream: Stream, exc: Exception) -> None:
        log.exception("rank %d: a message could not be applied; residency unknown", stream.rank)
        with self._lock:
            stream.malformed += 1
            stream.residency.set_complete(False)
        log_once(stream, "internal", f"{type(exc).__name__}: {exc}")

    def _check_tail(self, stream: Stream) -> None:
        try:
            self._sequencer.check_tail(stream)
        except Exception:
            log.exception("rank %d: checking the stream's tail failed", stream.rank)

    def _replay_batches(self, stream: Stream, start: int, stop: int | None) -> Iterator[tuple[int, DecodedBatch]]:
        for seq, payload in self.receiver.replay(stream, start, stop, self._malformed):
            try:
                batch = self._decoder.decode(payload)
            except MalformedBatch as exc:
                self._malformed(stream, f"replayed payload: {exc}")
                continue
            yield seq, batch

    def _malformed(self, stream: Stream, why: str) -> None:
        with self._lock:
            stream.malformed += 1
        log_once(stream, "malformed", f"skipping malformed message: {why}")

    # -- collection --------------------------------------------------------------------------------

    def collect(self) -> Iterable[Reading]:
        self._supervise()
        out: list[Reading] = []
        with self._lock:
            for s in self.streams:
                out.extend(self._readings(s))
        return out

    def _readings(self, s: Stream) -> list[Reading]:
        lab = s.labels
        res = s.residency
        bytes_per_token = self._opts.kv_bytes_per_token
        out: list[Reading] = [
            Sample(DROPPED_TOTAL, lab, s.dropped),
            Sample(MISSED_TOTAL, lab, s.missed),
            Sample(REPLAYED_TOTAL, lab, s.replayed),
            Sample(MALFORMED_TOTAL, lab, s.malformed),
            Sample(RESTARTS_TOTAL, lab, s.restarts),
            Sample(REPEATED_TOTAL, lab, s.repeated),
            Sample(REJECTED_TOTAL, lab, s.rejected),
            Sample(SHED_TOTAL, lab, s.shed),
            Sample(QUEUED_BYTES, lab, s.queued_bytes),
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
            if st.known or st.anchored:  # after a loss: the estimate, flagged by RESIDENCY_KNOWN 0
                blocks = len(st.resident)
                out.append(Sample(KV_RESIDENT_BLOCKS, tl, blocks))
                if bytes_per_token:
                    tokens = st.block_tokens(self._opts.default_block_size)
                    if tokens or not blocks:
                        out.append(Sample(TIER_USED_BYTES, tl, blocks * tokens * bytes_per_token))
                    elif st.block_size in _NO_SIZE_WHY:  # not while pending: a sized batch is near
                        log_once(s, f"block-size-{tier.value}",
                                 f"no kvscope_tier_used_bytes for {tier.value}: {_NO_SIZE_WHY[st.block_size]}")
            out.append(Sample(STORED_TOTAL, tl, st.stored))
            out.append(Sample(REANNOUNCED_TOTAL, tl, st.restored))
            out.append(Sample(REMOVED_TOTAL, tl, st.removed))
            out.append(Sample(REMOVED_UNKNOWN_TOTAL, tl, st.removed_unknown))
            buckets, total, count = st.reuse.cumulative()
            out.append(HistogramSample(REUSE_DISTANCE, tl, buckets, total, count))
            out.append(Sample(REUSE_EVICTED_TOTAL, tl, st.reuse.estimated_evicted))
            out.append(Sample(REUSE_STORES_TOTAL, tl, st.reuse.estimated_uses))
        if res.tenants is not None:
            out.extend(tenant_readings(res.tenants, lab))
        if res.access is not None:
            g1 = res.tier(Tier.G1)
            meta = res.access.meta
            meta.block_tokens = g1.block_tokens(self._opts.default_block_size)
            meta.bytes_per_token = bytes_per_token
            meta.sampled_accesses = g1.reuse.uses
            meta.reannounced = g1.restored
            meta.complete = g1.known
        return out


def _factory(options: VllmKvEventsOptions, context: CollectorContext) -> VllmKvEventsCollector:
    return VllmKvEventsCollector(options, None, context.clock, context.streams.get(KV_ACCESS))


SPEC = CollectorSpec(
    name=NAME,
    description="vLLM KV-cache events over ZMQ: block residency per tier, reuse distance, loss accounting",
    options=VllmKvEventsOptions,
    factory=_factory,
    metrics=METRICS,
    enabled_by_default=False,
    # with the what-if analysis on, the sampled G1 stores go to its access stream
    streams=StreamUse(writes=(KV_ACCESS,)),
)
