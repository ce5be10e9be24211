"""The tiered block store: G1 and G2 in host memory, G3 and G4 as directories of block files.

Policy (one thread drives it: the engine's device loop):
- lookup: the longest run of leading blocks held anywhere, each served from the fastest tier holding it.
- fetch to G1: G2 → G1 is a memory copy; G3/G4 → G1 reads the file into host memory (a G2 slot when G2
  keeps blocks, so the hit is promoted into G2; else a staging slot) and copies that to G1. Caching is
  inclusive: a promoted block keeps its lower copies, so evicting it later costs no write.
- new blocks land in G1. Eviction (LRU per tier, never a block pinned by the request in flight) cascades
  the block to the next lower tier that keeps blocks, unless that tier already holds it; from the last
  tier it is dropped. A tier with retain=False keeps nothing between requests: at release its blocks go
  down at once. That is the seeds' G4 test: G1 and G2 keep nothing, every reused block comes from G4
  through the host staging buffer.
- a block file that is missing, truncated or fails its checksum is a miss and an error, never data.
Every hop is a Transfer (src, dst, bytes, seconds); residency changes are BlockEvents for the publisher, and
so is each use of a block already in G1 ("reused": vLLM announces those with kv_cache_report_mode=full).

Offload on the request path: making room (an eviction cascade out of G1 or G2), storing a computed block
down (write-through, for a G1 that keeps nothing) and waiting for a free write-behind buffer are timed
apart from the fetch, on an OffloadClock (the engine takes it per request, between its first schedule
and its first token). A G1 → G2 store's transfer seconds run from the start of the store to the block
being in G2 or in a write-behind buffer: the copy and what it waited for first (room in G2, a free
buffer), so the store timer an observer reads (vLLM's `kv_offload_store_time`) covers the eviction; a store
that goes through the staging slot straight to a file (no G2, no write-behind) runs until the file is written.

Write-behind (write_behind > 0 slots, agent.reference.write_behind): a block going down to a file tier
is written by a background thread; it is found in that tier once written. A lock serialises the store's
state between the two threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

import numpy as np

from kvscope.agent.core.tiers import Tier
from kvscope.agent.tools.reference.blockfile import BlockFileError, BlockFiles, direct_io_supported
from kvscope.agent.tools.reference.blocks import BlockId, stamp_block
from kvscope.agent.tools.reference.pools import MemoryPool
from kvscope.agent.tools.reference.store_types import (
    G1,
    G2,
    G3,
    G4,
    MEDIUM,
    ORDER,
    BlockEvent,
    FetchResult,
    OffloadClock,
    StoreObserver,
    TierSpec,
    Transfer,
    _Tier,
)
from kvscope.agent.tools.reference.write_behind import WriteBehind

__all__ = ["MEDIUM", "BlockEvent", "FetchResult", "StoreObserver", "TierSpec", "TieredStore", "Transfer"]

log = logging.getLogger("kvscope.reference.store")


class TieredStore:
    def __init__(self, block_tokens: int, block_bytes: int, specs: dict[Tier, TierSpec],
                 observer: StoreObserver, clock: Callable[[], float] = time.perf_counter,
                 seed: int = 0, write_behind: int = 0) -> None:
        if specs.get(G1, TierSpec(0)).capacity_blocks <= 0:
            raise ValueError("G1 needs at least one block: it is where prefill reads and writes KV")
        self.block_tokens = block_tokens
        self.block_bytes = block_bytes
        self.observer = observer
        self.clock = clock
        self.tiers = {t: _Tier(t, specs.get(t, TierSpec(0))) for t in ORDER}
        self.g1 = MemoryPool(specs[G1].capacity_blocks, block_bytes)
        self.g2 = MemoryPool(self.tiers[G2].spec.capacity_blocks, block_bytes)
        self.staging = MemoryPool(2, block_bytes)  # slot 0: writes down; slot 1: reads up
        self.files: dict[Tier, BlockFiles] = {}
        self.direct_note: dict[Tier, str] = {}
        for t in (G3, G4):
            spec = self.tiers[t].spec
            if spec.capacity_blocks <= 0:
                continue
            if spec.path is None:
                raise ValueError(f"{t} is on but has no directory")
            spec.path.mkdir(parents=True, exist_ok=True)
            direct = spec.direct
            if direct:
                direct, note = direct_io_supported(spec.path)
                self.direct_note[t] = note
                if not direct:
                    log.warning("%s: %s; using buffered I/O", t, note)
            self.files[t] = BlockFiles(spec.path, direct=direct)
        self.meta: dict[int, BlockId] = {}
        self.pinned: set[int] = set()
        self.template = np.random.default_rng(seed).integers(0, 256, block_bytes, dtype=np.uint8)
        self.lock = threading.RLock()
        self.write_behind = WriteBehind(write_behind, block_bytes, block_tokens, self.files, clock, self.lock,
                                        self._write_landed)
        self.offload = OffloadClock(clock)
        self._offloading = self.offload.timing

    def begin_request(self) -> None:
        """A request is scheduled: offload work on this thread counts for it from now on."""
        with self.lock:
            self.offload.begin()

    def take_offload(self) -> float:
        """Offload seconds of the request since begin_request() (the engine reads it at the first token)."""
        with self.lock:
            return self.offload.seconds

    def flush(self) -> None:
        """Waits until every queued write-behind has landed."""
        self.write_behind.flush()

    def close(self) -> None:
        self.write_behind.close()

    # -- queries -----------------------------------------------------------------------------------

    def holds(self, tier: Tier, key: int) -> bool:
        return key in self.tiers[tier].lru

    def resident(self, tier: Tier) -> int:
        return len(self.tiers[tier].lru)

    def lookup(self, blocks: Iterable[BlockId], timings: dict[Tier, list[float]] | None = None) -> list[Tier]:
        """Fastest tier of each leading block held somewhere; stops at the first miss. With `timings`, the
        time of each block's lookup in each tier asked is appended to the tier's list (vLLM's per-tier
        lookup delay)."""
        with self.lock:
            found: list[Tier] = []
            for b in blocks:
                tier = _first_holding(self.tiers, b.key) if timings is None else self._timed(b.key, timings)
                if tier is None:
                    break
                found.append(tier)
            return found

    def _timed(self, key: int, timings: dict[Tier, list[float]]) -> Tier | None:
        clock = time.perf_counter
        for t in ORDER:
            start = clock()
            held = key in self.tiers[t].lru
            timings.setdefault(t, []).append(clock() - start)
            if held:
                return t
        return None

    def g2_pinned_share(self) -> float:
        """Share of G2's slots held for the request in flight (promoted copies it reads): vLLM's CPU usage."""
        with self.lock:
            capacity = self.tiers[G2].spec.capacity_blocks
            return sum(1 for k in self.pinned if k in self.tiers[G2].lru) / capacity if capacity > 0 else 0.0

    def g1_view(self, key: int) -> np.ndarray:
        return self.g1.block(self.tiers[G1].lru[key])

    # -- the request path ----------------------------------------------------------------------------

    def fetch(self, blocks: list[BlockId], tiers: list[Tier]) -> FetchResult:
        """Brings the looked-up leading blocks into G1 (pinned until release)."""
        with self.lock:
            result = FetchResult()
            # pinned first: bringing one block up may evict (G1/G2 room, a cascade) another of this prefix
            self.pinned.update(b.key for b in blocks)
            for b, tier in zip(blocks, tiers, strict=False):
                moved = self._bring_to_g1(b, tier, result)
                if moved is None:
                    result.failed = True
                    break
                result.blocks_by_tier[tier] = result.blocks_by_tier.get(tier, 0) + 1
                result.bytes_by_tier[tier] = result.bytes_by_tier.get(tier, 0) + moved
                result.loaded += 1
            return result

    def put_computed(self, b: BlockId) -> None:
        """A block prefill just produced: placed in G1, pinned."""
        with self.lock:
            if b.key in self.tiers[G1].lru:
                self._touch(G1, b.key)
                self.pinned.add(b.key)
                self.observer.block_event(BlockEvent("reused", G1, b))
                return
            slot = self._allocate(G1)
            stamp_block(self.g1.block(slot), self.template, b.key)
            self.meta[b.key] = b
            self._admit(G1, b, slot)
            self.pinned.add(b.key)

    def release(self) -> None:
        """End of the request in flight: unpin; tiers that keep nothing push their blocks down now."""
        with self.lock:
            self.pinned.clear()
            for t in (G1, G2):
                tier = self.tiers[t]
                if not tier.keeps:
                    for key in list(tier.lru):
                        self._evict(t, key)

    def clear(self) -> None:
        """Empties every tier (a cache starting empty), deleting block files."""
        self.flush()
        with self.lock:
            self.pinned.clear()
            for t in ORDER:
                for key in list(self.tiers[t].lru):
                    self._drop(t, key)

    # -- moves -----------------------------------------------------------------------------------------

    def _bring_to_g1(self, b: BlockId, tier: Tier, result: FetchResult) -> int | None:
        """Bytes moved off `tier` for block b, or None if it could not be read. Times the move into result
        (not the evictions that make room for it in G1 and G2: they are offload, timed as such)."""
        if tier is G1:
            self._touch(G1, b.key)
            self.pinned.add(b.key)
            self.observer.block_event(BlockEvent("reused", G1, b))
            return 0
        slot = self._allocate(G1)  # first: its eviction cascade may use the staging slots
        # room in G2 for the promoted copy is made before the fetch starts: it is offload, not fetch
        g2_slot = self._try_allocate(G2) if tier is not G2 and self.tiers[G2].keeps else None
        start = self.clock()
        moved = self.block_bytes
        # The two hops' transfer times tile the fetch from `start` to `end` with no gap, as a connector's
        # job timers do: what the engine publishes as transfer seconds is the whole fetch the truth records.
        copy_from = start
        if tier is G2:
            src = self.g2.block(self.tiers[G2].lru[b.key])
            self._touch(G2, b.key)
        else:
            loaded = self._read_into_host(b, tier, start, g2_slot)
            if loaded is None:
                self.g1.free(slot)
                return None
            src, moved, copy_from = loaded
        np.copyto(self.g1.block(slot), src)
        end = self.clock()
        self.observer.transfer(Transfer(G2, G1, self.block_bytes, end - copy_from, copy_from, origin=tier))
        self._admit(G1, b, slot)
        self.pinned.add(b.key)
        result.seconds_by_tier[tier] = result.seconds_by_tier.get(tier, 0.0) + end - start
        return moved

    def _read_into_host(self, b: BlockId, tier: Tier, t0: float, g2_slot: int | None
                        ) -> tuple[np.ndarray, int, float] | None:
        """File → host memory: into G2 slot `g2_slot` (promotion) when given, else into staging.
        The read's transfer runs from `t0` (the fetch's start); returns where it ended."""
        slot_view = self.g2.slot(g2_slot) if g2_slot is not None else self.staging.slot(1)
        try:
            got = self.files[tier].read(b.key, slot_view, self.block_bytes)
        except (BlockFileError, OSError) as exc:
            kind = exc.kind if isinstance(exc, BlockFileError) else (
                "missing" if isinstance(exc, FileNotFoundError) else "io")
            log.debug("%s block %016x unusable: %s", tier, b.key, exc)
            self.observer.error(tier, kind)
            if g2_slot is not None:
                self.g2.free(g2_slot)
            self._drop(tier, b.key)
            return None
        self._touch(tier, b.key)
        if g2_slot is not None:
            self._admit(G2, b, g2_slot)
            self.pinned.add(b.key)  # keep the promoted copy until the request is done with it
        read_end = self.clock()
        self.observer.transfer(Transfer(tier, G2, got, read_end - t0, t0))
        return slot_view[:self.block_bytes], got, read_end

    def _try_allocate(self, t: Tier) -> int | None:
        try:
            return self._allocate(t)
        except MemoryError:
            return None

    def _allocate(self, t: Tier) -> int:
        pool = self.g1 if t is G1 else self.g2
        slot = pool.allocate()
        if slot is not None:
            return slot
        with self._offloading():
            while slot is None:
                victim = next((k for k in self.tiers[t].lru if k not in self.pinned), None)
                if victim is None:
                    raise MemoryError(f"{t} is full of blocks pinned by the request in flight")
                self._evict(t, victim)
                slot = pool.allocate()
        return slot

    def reserve(self, blocks: int) -> None:
        """Room in G1 for `blocks` new blocks before prefill writes them (as vLLM allocates a request's
        slots when it schedules it): the evictions are offload, not compute. Evicts what it can."""
        with self.lock:
            if self.g1.free_slots >= blocks:
                return
            with self._offloading():
                self._evict_until_free(blocks)

    def _evict_until_free(self, blocks: int) -> None:
        g1 = self.tiers[G1]
        while self.g1.free_slots < blocks:
            victim = next((k for k in g1.lru if k not in self.pinned), None)
            if victim is None:
                return
            self._evict(G1, victim)

    def offload_computed(self, blocks: Iterable[BlockId]) -> None:
        """Write-through for a G1 that keeps nothing: each block prefill computed goes down to the next tier
        that keeps blocks now, inside the step (as KVBM offloads a block once it is computed), so releasing
        the request later only drops it."""
        below = next((d for d in ORDER[1:] if self.tiers[d].keeps), None)
        if below is None:
            return
        with self.lock, self._offloading():
            for b in blocks:
                if (b.key in self.tiers[G1].lru and b.key not in self.tiers[below].lru
                        and not self.write_behind.pending(below, b.key)):
                    self._write_down(G1, below, b.key)

    def _evict(self, t: Tier, key: int) -> None:
        """Cascade `key` from tier t to the next tier that keeps blocks (unless held there), then drop it."""
        below = next((d for d in ORDER[ORDER.index(t) + 1:] if self.tiers[d].keeps), None)
        if below is not None and key not in self.tiers[below].lru:
            self._write_down(t, below, key)
        self._drop(t, key)

    def _write_down(self, src: Tier, dst: Tier, key: int) -> None:
        b = self.meta[key]
        t0 = self.clock()  # a store from G1 is timed from here: what it waits for first is part of it
        if dst is G2:  # only G1 is above G2
            slot = self._try_allocate(G2)
            if slot is None:
                return
            np.copyto(self.g2.block(slot), self.g1.block(self.tiers[G1].lru[key]))
            self.observer.transfer(Transfer(G1, G2, self.block_bytes, self.clock() - t0, t0))
            self._admit(G2, b, slot)
            return
        if self.write_behind.pending(dst, key) or self._queue_write(src, dst, b, t0):
            return
        self._make_room(dst)  # first: a G3 → G4 cascade reads through the staging slot used below
        host, staged = self._host_copy(src, key)
        if host is None:
            return
        written_at = self.clock()
        try:
            written = self.files[dst].write(key, host, self.block_bytes, self.block_tokens)
        except OSError as exc:
            log.warning("%s: cannot write block %016x: %s", dst, key, exc)
            self.observer.error(dst, "write")
            return
        end = self.clock()
        self.observer.transfer(Transfer(G2, dst, written, end - written_at, written_at))
        if staged:  # a store out of G1 through the staging slot is done once its file is: timed from t0 to here
            self.observer.transfer(Transfer(G1, G2, self.block_bytes, end - t0, t0))
        self._admit(dst, b, 0)

    def _queue_write(self, src: Tier, dst: Tier, b: BlockId, t0: float) -> bool:
        """Hands the write to the write-behind thread, waiting for a free buffer (the writer lands writes
        meanwhile: the wait releases the store's lock). False: no writer (or a cascade from a file tier),
        write it inline."""
        free = self.write_behind.buffer(wait=True) if src in (G1, G2) else None
        if free is None:
            return False
        slot, buffer = free
        if b.key in self.tiers[G2].lru:
            np.copyto(buffer, self.g2.block(self.tiers[G2].lru[b.key]))
        else:
            np.copyto(buffer, self.g1.block(self.tiers[G1].lru[b.key]))
            self.observer.transfer(Transfer(G1, G2, self.block_bytes, self.clock() - t0, t0))
        self.write_behind.submit(dst, b, slot)
        return True

    def _write_landed(self, dst: Tier, b: BlockId, written: int, seconds: float, t0: float) -> None:
        """A write-behind finished (its thread holds the lock): the block is now found in `dst`."""
        if written == 0:
            self.observer.error(dst, "write")
        elif b.key not in self.tiers[dst].lru:
            self.observer.transfer(Transfer(G2, dst, written, seconds, t0, background=True))
            self._make_room(dst)
            self._admit(dst, b, 0)

    def _host_copy(self, src: Tier, key: int) -> tuple[np.ndarray | None, bool]:
        """A padded host-memory slot holding the block, to write it to a file tier from, and whether it is G1's
        block copied into the staging slot (a G1 → G2 hop the caller reports once the file is written)."""
        if key in self.tiers[G2].lru:  # G2 itself, or the inclusive copy of a G1 block
            return self.g2.slot(self.tiers[G2].lru[key]), False
        staging = self.staging.slot(0)
        if src is G1:
            np.copyto(staging[:self.block_bytes], self.g1.block(self.tiers[G1].lru[key]))
            return staging, True
        t0 = self.clock()
        try:  # G3 → G4 cascade: read it back through host memory
            got = self.files[src].read(key, staging, self.block_bytes)
        except (BlockFileError, OSError):
            self.observer.error(src, "cascade_read")
            return None, False
        self.observer.transfer(Transfer(src, G2, got, self.clock() - t0, t0))
        return staging, False

    def _make_room(self, t: Tier) -> None:
        tier = self.tiers[t]
        while len(tier.lru) >= tier.spec.capacity_blocks:
            victim = next((k for k in tier.lru if k not in self.pinned), None)
            if victim is None:
                raise MemoryError(f"{t} is full of pinned blocks")
            self._evict(t, victim)

    def _admit(self, t: Tier, b: BlockId, slot: int) -> None:
        self.tiers[t].lru[b.key] = slot
        self.meta[b.key] = b
        self.observer.block_event(BlockEvent("stored", t, b))

    def _touch(self, t: Tier, key: int) -> None:
        self.tiers[t].lru.move_to_end(key)

    def _drop(self, t: Tier, key: int) -> None:
        slot = self.tiers[t].lru.pop(key, None)
        if slot is None:
            return
        if t is G1:
            self.g1.free(slot)
        elif t is G2:
            self.g2.free(slot)
        else:
            self.files[t].remove(key)
        self.observer.block_event(BlockEvent("removed", t, self.meta[key]))
        if not any(key in self.tiers[d].lru for d in ORDER):
            del self.meta[key]


def _first_holding(tiers: dict[Tier, _Tier], key: int) -> Tier | None:
    return next((t for t in ORDER if key in tiers[t].lru), None)
