"""Block residency per tier and block reuse distance, from decoded KV events. Pure: no I/O, no clock.

Residency is a set of block hashes per tier. vLLM re-announces blocks it reuses when a request asks for
`kv_cache_report_mode=full`, so a store of a block already resident changes nothing; a removal of a block
we never saw (stored before we joined, or in a lost batch) is ignored and counted.

Reuse distance: for each store of a block already stored earlier in the same tier, the number of
distinct blocks stored in that tier in between (an LRU stack distance: a cache of more than that many
blocks would have kept it). Computed in O(log n) per reuse and O(1) per first use on a hash-sampled
subset of the blocks (SHARDS), see ReuseTracker.

Block size: each tier also remembers the `block_size` (tokens per block hash) its resident blocks were
stored with, so that resident blocks × block_size × KV bytes per token gives the bytes the tier holds.
Only a size every resident block shares counts (TierState.block_tokens); one run of stores is checked
at its first and last event, see Residency._store.

Speed: the subscriber's whole budget is about a microsecond per block event, so on the usual paths
no Python statement runs per event: a batch (or a run of consecutive events of one kind and tier) is
one set update or difference_update, its counts come from length deltas, and the checks and grouping
run in C (operator.countOf, itertools.groupby). Per hash there is one comparison in a comprehension
(is it sampled?); only the sampled blocks reach the tracker's Python loop.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import chain, groupby
from math import ceil
from operator import attrgetter, countOf
from typing import Any

from kvscope.agent.tiers import STORAGE_TIERS, Tier
from kvscope.collectors.kv_event_schema import CLEARED, STORED

# Bucket upper bounds of the reuse-distance histogram: 0, then powers of two up to 2**20 blocks.
REUSE_BOUNDS: tuple[float, ...] = (0.0, *(float(2**i) for i in range(21)))
_INF_SLOT = len(REUSE_BOUNDS)
_MEDIUM = attrgetter("medium")
_LOCALITY = attrgetter("locality")
_HASHES = attrgetter("block_hashes")
_RUN_KEY = attrgetter("KIND", "medium", "locality")
_GPU_KEY = ("GPU", None)
_U64 = 2**64 - 1
# Mediums whose tier does not depend on locality (tier_of): a batch of them skips the locality check.
_LOCALITY_BLIND = frozenset({"GPU", "CPU", "gpu", "cpu"})
# TierState.block_size, besides a positive size shared by every block stored since the tier was last empty:
BLOCK_SIZE_UNSEEN = 0  # no block_size read since the tier was last empty (it may hold blocks stored by
# batches decoded without it: most batches of GPU stores only, see BatchDecoder)
BLOCK_SIZE_NOT_SENT = -1  # every store carried no usable block_size (vLLM's offload placeholders send 0)
BLOCK_SIZE_MIXED = -2  # stores carried different sizes: unknown until the tier is empty again


def tier_of(medium: str | None, locality: str | None) -> Tier:
    """Map an event's medium (+ locality) to a tier (facts §2.4); unknown mediums are not guessed."""
    m = (medium or "").upper()
    if m == "GPU":
        return Tier.G1
    if m == "CPU":
        return Tier.G2
    if m in ("STORAGE", "FS", "OBJ"):  # FS/OBJ: vLLM 0.26 only, renamed STORAGE in 0.27
        loc = (locality or "").upper()
        if loc == "REMOTE" or (loc != "LOCAL" and m == "OBJ"):
            return Tier.G4
        return Tier.G3  # LOCAL, or no locality (before 0.26): the publisher's own storage
    return Tier.UNATTRIBUTED  # None (pre-medium events), "CXL", anything new


def sample_key(key: Hashable) -> int:
    """The number a block is sampled by (kept when below the threshold): the uint64 hash itself.

    vLLM's int block hash is the low 64 bits of a cryptographic digest, so it is already uniform; a bytes
    hash (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0) is the whole digest, whose last 8 bytes are that same
    int, so both modes sample the same blocks. Anything else falls back to Python's hash().
    """
    if isinstance(key, int):
        return key
    if isinstance(key, bytes):
        return int.from_bytes(key[-8:], "big")
    return hash(key) & _U64


class ReuseTracker:
    """Reuse-distance histogram over a stream of block uses, with a cap on the blocks remembered.

    Sampling (SHARDS, Waldspurger et al., FAST 2015): with `sample_rate` R < 1 only blocks whose hash
    is below R × 2**64 are tracked (a fixed pseudo-random subset of the blocks, all uses of each), each
    distance measured among them is scaled by 1/R and each sampled reuse counts 1/R reuses. The
    histogram is then an estimate (unbiased over the choice of hash) at a fraction R of the cost and
    memory; R = 1 is exact. A distance d is estimated from about d × R sampled blocks, so distances
    below a few times 1/R are blurred (the scaled distances are multiples of 1/R).

    Each use gets a time index t. A block's latest use is a live marker at its time; when the block is
    used again its old marker dies. The distance of a reuse at t of a block last used at p is the number
    of live markers in (p, t) = (t - p - 1) - (dead markers in (p, t)). Only dead markers are kept in a
    Fenwick tree, so a first use costs one dict insert and a reuse two prefix sums plus one update.

    Memory: the dict is kept in last-use order (a reuse re-inserts its key at the end). When it holds
    1.5 × cap blocks, or the time index reaches 3 × cap, it is compacted: the least recently used blocks
    beyond `cap` are forgotten (counted in `evicted`), times are renumbered 0..n-1 and the tree is
    emptied (no dead markers remain). That is O(cap) per ≥ cap/2 uses, O(1) amortised. A forgotten
    block's next use counts as a first use, so distances beyond the cap are not observed.
    """

    def __init__(self, max_tracked: int, sample_rate: float = 1.0) -> None:
        if max_tracked < 2:
            raise ValueError("max_tracked must be >= 2")
        threshold = round(sample_rate * 2**64) if 0 < sample_rate <= 1 else 0
        if threshold < 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
        self._threshold: int | None = threshold if threshold < 2**64 else None  # None: exact, no filter
        self.sample_rate = threshold / 2**64
        self._scale = 2**64 / threshold  # 1/R: one sampled reuse stands for this many
        self._max = max_tracked
        self._high = max_tracked + max_tracked // 2
        self._span = 3 * max_tracked
        self._last: dict[Hashable, int] = {}
        # Fenwick tree, index = time + 1. Allocated at the first reuse (8 B x 3 x cap): a tier that only
        # ever sees first uses, or none, never pays for it.
        self._dead: list[int] = []
        self._now = 0
        self.buckets = [0] * (_INF_SLOT + 1)  # sampled reuses per slot of their scaled distance
        self.sum = 0.0  # of scaled distances of sampled reuses
        self.evicted = 0  # sampled blocks forgotten (see estimated_evicted)
        self.uses = 0  # sampled uses (see estimated_uses)

    @property
    def tracked(self) -> int:
        return len(self._last)

    def use(self, key: Hashable) -> None:
        self.use_many([key])

    @property
    def estimated_evicted(self) -> float:
        """Blocks forgotten to stay within the cap, scaled to the whole stream."""
        return self.evicted * self._scale

    @property
    def estimated_uses(self) -> float:
        """Uses (first uses and reuses) scaled to the whole stream: the miss-ratio curve's denominator.

        Dividing the histogram by this rather than by the exact number of uses normalises by what was
        sampled (a ratio estimator), which reduces the error from over- or under-sampling hot blocks.
        """
        return self.uses * self._scale

    def use_many(self, keys: Sequence[Hashable]) -> None:
        """Record uses in order. The loop is inlined: it runs once per stored (sampled) block."""
        threshold = self._threshold
        if threshold is not None:
            try:  # uint64 hashes compare in C; any other key type raises and takes the general path
                keys = [k for k in keys if k < threshold]  # type: ignore[operator]
            except TypeError:
                keys = [k for k in keys if sample_key(k) < threshold]
            if not keys:
                return
        self.uses += len(keys)
        last = self._last
        t = self._now
        n = len(keys)
        if (n > 8 and t + n <= self._span and len(last) + n <= self._high and last.keys().isdisjoint(keys)
                and len(set(keys)) == n):
            # only first uses (the common case without kv_cache_report_mode=full): C-level insert. For a
            # few keys (a sampled batch) the checks cost more than the loop below.
            last.update(zip(keys, range(t, t + n), strict=False))  # equal lengths by construction
            self._now = t + n
            return
        get = last.get
        # compact before t reaches the span or the dict the high mark, whichever comes first
        stop = min(self._span, t + self._high - len(last))
        for key in keys:
            if t >= stop:
                self._now = t
                self._compact()
                last = self._last
                get = last.get
                t = self._now
                stop = min(self._span, t + self._high - len(last))
            p = get(key)
            if p is None:
                last[key] = t
            else:
                self._reuse(key, p, t)
            t += 1
        self._now = t

    def _reuse(self, key: Hashable, p: int, t: int) -> None:
        dead = self._dead
        if not dead:
            dead = self._dead = [0] * (self._span + 1)
        # dead markers in (p, t) = prefix(t - 1) - prefix(p), Fenwick indices shifted by one
        n = 0
        i = t
        while i > 0:
            n += dead[i]
            i &= i - 1
        i = p + 1
        while i > 0:
            n -= dead[i]
            i &= i - 1
        distance = (t - p - 1 - n) * self._scale
        i = p + 1
        size = self._span
        while i <= size:
            dead[i] += 1
            i += i & -i
        del self._last[key]  # re-insert at the end: the dict stays in last-use order
        self._last[key] = t
        self.sum += distance
        self.buckets[min((ceil(distance) - 1).bit_length() + 1, _INF_SLOT) if distance else 0] += 1

    def _compact(self) -> None:
        keys = list(self._last)
        drop = max(0, len(keys) - self._max)
        self.evicted += drop
        self._last = {k: i for i, k in enumerate(keys[drop:])}
        self._dead = []
        self._now = len(self._last)

    def reset(self) -> None:
        """Forget every block (hashes of a restarted engine mean nothing); the histogram stays."""
        self._last = {}
        self._dead = []
        self._now = 0

    def cumulative(self) -> tuple[tuple[tuple[float, float], ...], float, float]:
        """(buckets as (upper bound, cumulative count) ending in +Inf, sum, count)."""
        out = []
        running = 0
        scale = self._scale
        for bound, n in zip((*REUSE_BOUNDS, float("inf")), self.buckets, strict=True):
            running += n
            out.append((bound, running * scale))
        return tuple(out), self.sum * scale, running * scale


class TierState:
    __slots__ = ("block_size", "known", "removed", "removed_unknown", "resident", "reuse", "stored")

    def __init__(self, max_tracked: int, known: bool, sample_rate: float = 1.0) -> None:
        self.resident: set[Any] = set()
        self.stored = 0  # blocks that became resident
        self.removed = 0  # blocks that stopped being resident (BlockRemoved, AllBlocksCleared)
        self.removed_unknown = 0  # BlockRemoved of a block not resident here (ignored)
        self.known = known  # residency reflects every event since a known-empty state
        self.reuse = ReuseTracker(max_tracked, sample_rate)
        self.block_size = BLOCK_SIZE_UNSEEN  # see the BLOCK_SIZE_* values

    def block_tokens(self, not_sent: int = 0) -> int:
        """Tokens per resident block: the block_size every block stored since the tier was last empty
        carried, or `not_sent` (a configured size) if none of them carried one; 0 when unknown (sizes
        differed, or none was read yet) and when nothing was stored since the tier was empty."""
        if self.block_size > 0:
            return self.block_size
        return not_sent if self.block_size == BLOCK_SIZE_NOT_SENT else 0

    def emptied(self) -> None:
        """The tier holds nothing now: the sizes of blocks gone no longer matter."""
        self.block_size = BLOCK_SIZE_UNSEEN


class Residency:
    """Residency, counters and reuse of one publisher (one data-parallel rank), per tier."""

    def __init__(self, max_tracked: int, sample_rate: float = 1.0) -> None:
        self._max_tracked = max_tracked
        self._sample_rate = sample_rate
        self.tiers: dict[Tier, TierState] = {}
        self.events = [0, 0, 0]  # by kind: STORED, REMOVED, CLEARED
        self.unknown_events = 0
        self.complete = False  # every batch of the current publisher since seq 0 was applied
        self._tier_cache: dict[tuple[str | None, str | None], TierState] = {}

    def tier(self, tier: Tier) -> TierState:
        state = self.tiers.get(tier)
        if state is None:
            state = self.tiers[tier] = TierState(self._max_tracked, self.complete, self._sample_rate)
        return state

    def _state_for(self, medium: str | None, locality: str | None) -> TierState:
        key = (medium, locality)
        state = self._tier_cache.get(key)
        if state is None:
            if len(self._tier_cache) > 256:  # a stream of junk mediums must not grow this forever
                self._tier_cache.clear()
            state = self._tier_cache[key] = self.tier(tier_of(medium, locality))
        return state

    def apply(self, events: list[Any], unknown: int = 0, gpu_stores_only: bool = False) -> None:
        """Apply decoded events (kv_event_schema structs) in order. The hot loop of the subscriber.

        `gpu_stores_only`: the decoder found every event to be a GPU BlockStored (DecodedBatch), so
        they all go to G1 without a check. Otherwise a batch of stores to one tier is applied as one run
        after a check in C, and a mixed batch as runs of consecutive events of one kind and tier.
        """
        counts = self.events
        self.unknown_events += unknown
        if gpu_stores_only:
            if events:
                counts[STORED] += len(events)
                state = self._tier_cache.get(_GPU_KEY) or self._state_for(*_GPU_KEY)
                self._store(state, events)
            return
        n = len(events)
        if n:
            # The usual batch: only stores, all to one tier. Checked in C: countOf compares by identity
            # first, and the fast decoder returns one shared str per known medium (kv_event_schema).
            first = events[0]
            cls = type(first)
            medium, locality = first.medium, first.locality
            if (cls.KIND == STORED and countOf(map(type, events), cls) == n
                    and countOf(map(_MEDIUM, events), medium) == n
                    and (medium in _LOCALITY_BLIND or countOf(map(_LOCALITY, events), locality) == n)):
                counts[STORED] += n
                state = self._tier_cache.get((medium, locality)) or self._state_for(medium, locality)
                self._store(state, events)
                return
        # Mixed batches: consecutive events of one kind with one (medium, locality) form a group, found in
        # C by groupby and applied with one set operation. Groups are applied in order, so a store and a
        # later removal of the same block still cancel.
        cache = self._tier_cache
        for (kind, medium, locality), group in groupby(events, _RUN_KEY):
            run = list(group)
            counts[kind] += len(run)
            if kind == CLEARED:
                # AllBlocksCleared carries no medium: vLLM sends it when the GPU prefix cache is reset
                # (BlockPool.reset_prefix_cache); offload tiers keep their blocks. G1 is now known empty.
                g1 = self.tier(Tier.G1)
                g1.removed += len(g1.resident)
                g1.resident.clear()
                g1.emptied()
                g1.known = True
                continue
            state = cache.get((medium, locality)) or self._state_for(medium, locality)
            if kind == STORED:
                self._store(state, run)
            else:
                self._remove(state, list(chain.from_iterable(map(_HASHES, run))))

    @staticmethod
    def _remove(state: TierState, hashes: list[Any]) -> None:
        resident = state.resident
        before = len(resident)
        resident.difference_update(hashes)
        gone = before - len(resident)
        state.removed += gone
        state.removed_unknown += len(hashes) - gone  # not resident, or repeated within the run
        if not resident:
            state.emptied()

    @staticmethod
    def _store(state: TierState, stores: list[Any]) -> None:
        """A run of BlockStored events to one tier: residency, counts, reuse distance and block size.

        The block size is read at the run's first and last events only: reading every event costs
        ~20 ns per event in C, about 5 % of the subscriber's hot path, while two reads cost nothing.
        Sizes that differ only strictly inside runs whose ends agree with the tier go unseen; in vLLM
        one pool has one block size (one per KV-cache group), and a tier fed two sizes (LMCache's
        shorter last chunk, offload placeholders beside self-describing events) shows it at the ends of
        its runs. A run decoded without block_size (None: most batches of GPU stores only, see
        BatchDecoder) leaves the tier's size as it is: its blocks are taken to have the size read before
        or after them.
        """
        hashes = list(chain.from_iterable(map(_HASHES, stores)))
        resident = state.resident
        before = len(resident)
        resident.update(hashes)
        state.stored += len(resident) - before  # a store of a resident block is not a new block
        state.reuse.use_many(hashes)
        size = stores[0].block_size
        if size is not None and not (size == state.block_size > 0 and stores[-1].block_size == size):
            _fold_block_size(state, size, stores[-1].block_size)  # not the usual case: the size changes

    def set_complete(self, complete: bool) -> None:
        """True after seeing the publisher from seq 0, False after an unrecovered loss: all tiers."""
        self.complete = complete
        for tier in STORAGE_TIERS:
            self.tier(tier)
        for state in self.tiers.values():
            state.known = complete

    def restart(self) -> None:
        """A new publisher process: its caches start empty and its hashes may differ (seeded hashing)."""
        for state in self.tiers.values():
            state.removed += len(state.resident)
            state.resident.clear()
            state.emptied()
            state.reuse.reset()


def _fold_block_size(state: TierState, first: Any, last: Any) -> None:
    """A run of stores whose block_size (at its ends: first, last) is not the tier's known size."""
    first, last = _tokens(first), _tokens(last)
    if first != last or state.block_size not in (BLOCK_SIZE_UNSEEN, first):
        state.block_size = BLOCK_SIZE_MIXED
    else:
        state.block_size = first


def _tokens(block_size: Any) -> int:
    """A BlockStored's block_size as TierState keeps it: a positive int, else BLOCK_SIZE_NOT_SENT."""
    return block_size if type(block_size) is int and block_size > 0 else BLOCK_SIZE_NOT_SENT
