"""The sampled stream of KV block accesses: from the KV-event collector to the what-if analysis.

An engine that announces every block a request uses (vLLM with `kv_cache_report_mode=full`: reused
prefix blocks are announced as BlockStored again, beside new ones) publishes, in its G1 (GPU) stores,
the access stream of the whole KV hierarchy: each block of each prompt, in order. The KV-event
collector already keeps a SHARDS sample of those stores (the blocks whose hash is below R × 2**64, every
use of each) for its reuse-distance histogram; it hands the same sampled keys to an `AccessStream`, and
the what-if analysis replays them through models of the tier hierarchy at other sizes.

Collectors and analyses may not import each other, so this is the typed object between them: the stream
`streams.KV_ACCESS`, which the KV-event collector's spec writes and the what-if analysis' spec reads; the
wiring makes it only when both are enabled, sized by the analysis' `queue_blocks`.

Cost on the collector's hot path, only when the what-if analysis is enabled: one `deque.append` of a
batch marker per event batch and one `deque.extend` of the batch's sampled G1 keys (C, no Python loop
per key). The queue is bounded; what it drops when the analysis falls behind is counted (`dropped`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import Enum

Labels = tuple[str, str, str]  # engine, model, dp_rank
_U64 = 2**64 - 1


class Marker(Enum):
    """Queued between keys: BATCH before each event batch (an engine step: the blocks of the requests it
    scheduled, which the engine pins while it makes room); RESET when the publisher restarted (its hashes
    mean nothing any more)."""

    BATCH = "batch"
    RESET = "reset"


BATCH, RESET = Marker.BATCH, Marker.RESET
Entry = Hashable  # a block hash as the events carry it (int, or bytes), or a Marker


def block_key(key: Hashable) -> int:
    """A block hash as a uint64: vLLM's int hash itself, the last 8 bytes of a bytes hash (the same number,
    VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0), else Python's hash()."""
    if isinstance(key, int):
        return key & _U64
    if isinstance(key, bytes):
        return int.from_bytes(key[-8:], "big")
    return hash(key) & _U64


@dataclass
class AccessMeta:
    """What the collector knows about one stream besides the keys, refreshed at each collection."""

    block_tokens: int = 0  # tokens per block of G1's stores (0 while unknown or mixed)
    bytes_per_token: int = 0  # the collector's kv_bytes_per_token (0 = not configured)
    sampled_accesses: int = 0  # sampled G1 stores offered to the queue since start (taken + queued + dropped)
    reannounced: int = 0  # G1 stores of blocks already resident (reused blocks re-announced), all counted
    complete: bool = False  # every batch since the publisher started was applied (residency known)


@dataclass
class AccessStream:
    """One publisher (engine, model, dp_rank): its sampled G1 accesses in order, and their metadata."""

    labels: Labels
    sample_rate: float
    limit: int = 1 << 20
    queue: deque[Entry] = field(init=False)
    meta: AccessMeta = field(default_factory=AccessMeta)
    taken: int = field(init=False, default=0)  # keys handed to the analysis
    markers: int = field(init=False, default=0)  # markers handed to the analysis

    def __post_init__(self) -> None:
        self.queue = deque(maxlen=self.limit)

    def reset(self) -> None:
        """The publisher restarted (collector thread)."""
        self.queue.append(RESET)

    def take(self, limit: int | None = None) -> list[Entry]:
        """Keys and markers queued since the last call, oldest first (analysis thread).

        Each popleft is atomic and the collector only appends on the right, so no lock is needed; the
        collector's extend of a full queue drops the oldest entries, which `dropped` counts."""
        queue = self.queue
        n = len(queue) if limit is None else min(limit, len(queue))
        out: list[Entry] = []
        pop = queue.popleft
        try:
            for _ in range(n):
                out.append(pop())
        except IndexError:  # emptied meanwhile: cannot happen with a single consumer, kept safe
            pass
        markers = out.count(BATCH) + out.count(RESET)
        self.markers += markers
        self.taken += len(out) - markers
        return out

    @property
    def dropped(self) -> int:
        """Sampled accesses the queue dropped because the analysis fell behind (as of the last collection;
        O(queued entries): read it once per analysis run)."""
        queued = sum(1 for e in tuple(self.queue) if not isinstance(e, Marker))
        return max(0, self.meta.sampled_accesses - self.taken - queued)


class KvAccessLog:
    """Every publisher's AccessStream, by labels. Made once by the wiring."""

    def __init__(self, queue_limit: int = 1 << 20) -> None:
        if queue_limit < 1:
            raise ValueError("queue_limit must be >= 1")
        self.queue_limit = queue_limit
        self._streams: dict[Labels, AccessStream] = {}
        self._lock = threading.Lock()

    def stream(self, labels: Labels, sample_rate: float) -> AccessStream:
        """The stream of one publisher, made at its first call (the collector, at construction)."""
        with self._lock:
            stream = self._streams.get(labels)
            if stream is None:
                stream = self._streams[labels] = AccessStream(labels, sample_rate, self.queue_limit)
            return stream

    def streams(self) -> list[AccessStream]:
        with self._lock:
            return list(self._streams.values())
