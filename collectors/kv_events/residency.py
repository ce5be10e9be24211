"""Block residency per tier and block reuse distance, from decoded KV events. Pure: no I/O, no clock.

Residency is a set of block hashes per tier (collectors/kv_events/blockset.py: ~9 bytes a block, applied in bulk, exact
whenever read). vLLM re-announces blocks it reuses when a request asks for `kv_cache_report_mode=full`, so a
store of a block already resident changes nothing; a removal of a block we never saw (stored before we
joined, or in a lost batch) is ignored and counted.

Known and anchored: a tier's residency is known (exact) when every batch since a known-empty state was
applied. A tier that was known once since its publisher started (seen from seq 0, G1 since an
AllBlocksCleared, every tier since a publisher restart) is anchored: after a lost batch it is no longer
known but still anchored, and its count is an estimate off by at most what the lost batches stored and
removed (docs/vllm-kv-events.md). A late joiner's tiers are neither until a replay from seq 0.

Each tier also feeds its stores to a reuse-distance tracker (collectors/kv_events/reuse.py); G1's tracker also hands its
sampled stores to the what-if analysis' access stream, when one is given (kvscope.agent.core.kv_access).

Block size: each tier also remembers the `block_size` (tokens per block hash) its resident blocks were
stored with, so that resident blocks × block_size × KV bytes per token gives the bytes the tier holds.
Only a size every resident block shares counts (TierState.block_tokens); one run of stores is checked
at its first and last event, see Residency._store.

Speed: the subscriber's whole budget is about a microsecond per block event, so on the usual paths
no Python statement runs per event: a batch (or a run of consecutive events of one kind and tier) is
one set update or difference_update, its counts come from length deltas, and the checks and grouping
run in C (operator.countOf, itertools.groupby). Per hash there is one comparison in a comprehension
(is it sampled?); only the sampled blocks reach the tracker's Python loop. Residency itself only logs the
hashes (a list.extend) and applies them in bulk.
"""

from __future__ import annotations

from itertools import chain, groupby
from operator import attrgetter, countOf
from typing import TYPE_CHECKING, Any

from kvscope.agent.core.kv_access import BATCH, AccessStream
from kvscope.agent.core.tiers import STORAGE_TIERS, Tier
from kvscope.collectors.kv_events.reuse import ReuseTracker
from kvscope.collectors.kv_events.schema import CLEARED, STORED

if TYPE_CHECKING:
    from kvscope.collectors.kv_events.blockset import BlockSet
    from kvscope.collectors.kv_events.tenants import TenantAccounting

_MEDIUM = attrgetter("medium")
_LOCALITY = attrgetter("locality")
_HASHES = attrgetter("block_hashes")
_EVENTS = attrgetter("events")
_GPU_STORES_ONLY = attrgetter("gpu_stores_only")
_RUN_KEY = attrgetter("KIND", "medium", "locality")
_GPU_KEY = ("GPU", None)
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


class TierState:
    __slots__ = ("anchored", "block_size", "known", "resident", "reuse")

    def __init__(self, max_tracked: int, known: bool, sample_rate: float = 1.0) -> None:
        # imported here: numpy (~10 MiB of RSS) is loaded by an agent that tracks KV events, not by every one
        from kvscope.collectors.kv_events.blockset import BlockSet

        self.resident: BlockSet = BlockSet()
        self.known = known  # residency reflects every event since a known-empty state
        # residency was known since the publisher started (or since G1 was cleared), and lost batches only
        # since: the count is an estimate off by at most what those batches stored and removed
        self.anchored = known
        self.reuse = ReuseTracker(max_tracked, sample_rate)
        self.block_size = BLOCK_SIZE_UNSEEN  # see the BLOCK_SIZE_* values

    @property
    def stored(self) -> int:
        """Blocks that became resident."""
        self.resident.flush()
        return self.resident.stored

    @property
    def restored(self) -> int:
        """Stores of a block already resident: re-announcements of reused blocks (exact, not sampled)."""
        self.resident.flush()
        return self.resident.restored

    @property
    def removed(self) -> int:
        """Blocks that stopped being resident (BlockRemoved, AllBlocksCleared, a restart)."""
        self.resident.flush()
        return self.resident.removed

    @property
    def removed_unknown(self) -> int:
        """BlockRemoved of a block not resident here (ignored)."""
        self.resident.flush()
        return self.resident.unknown

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

    def __init__(self, max_tracked: int, sample_rate: float = 1.0, access: AccessStream | None = None,
                 medium_when_absent: str | None = None) -> None:
        self._max_tracked = max_tracked
        # the medium of events that carry none (Dynamo's mocker sends none; None leaves them unattributed)
        self._medium_when_absent = medium_when_absent
        self._sample_rate = sample_rate
        self.access = access
        # with the what-if analysis on: a marker before each batch's sampled G1 keys (kvscope.agent.core.kv_access)
        self._mark = access.queue.append if access is not None else None
        self.tiers: dict[Tier, TierState] = {}
        self.events = [0, 0, 0]  # by kind: STORED, REMOVED, CLEARED
        self.unknown_events = 0
        self.complete = False  # every batch of the current publisher since seq 0 was applied
        self.anchored = False  # complete once since the publisher started: tiers made later are estimates too
        self._tier_cache: dict[tuple[str | None, str | None], TierState] = {}
        # tenant mode (tenants.py): counts each batch's G1 stores per tenant before it is applied
        self.tenants: TenantAccounting | None = None

    def tier(self, tier: Tier) -> TierState:
        state = self.tiers.get(tier)
        if state is None:
            state = self.tiers[tier] = TierState(self._max_tracked, self.complete, self._sample_rate)
            state.anchored = self.anchored or self.complete
            if tier is Tier.G1 and self.access is not None:
                state.reuse.forward = self.access.queue.extend
        return state

    def _state_for(self, medium: str | None, locality: str | None) -> TierState:
        key = (medium, locality)
        state = self._tier_cache.get(key)
        if state is None:
            if len(self._tier_cache) > 256:  # a stream of junk mediums must not grow this forever
                self._tier_cache.clear()
            own = medium if medium is not None else self._medium_when_absent
            state = self._tier_cache[key] = self.tier(tier_of(own, locality))
        return state

    def apply(self, events: list[Any], unknown: int = 0, gpu_stores_only: bool = False) -> None:
        """Apply decoded events (schema.py structs) in order. The hot loop of the subscriber.

        `gpu_stores_only`: the decoder found every event to be a GPU BlockStored (DecodedBatch), so
        they all go to G1 without a check. Otherwise a batch of stores to one tier is applied as one run
        after a check in C, and a mixed batch as runs of consecutive events of one kind and tier.
        """
        counts = self.events
        self.unknown_events += unknown
        if self.tenants is not None:
            self.tenants.account(self.tiers.get(Tier.G1), events)
        mark = self._mark
        if mark is not None:
            mark(BATCH)
        if gpu_stores_only:
            if events:
                counts[STORED] += len(events)
                state = self._tier_cache.get(_GPU_KEY) or self._state_for(*_GPU_KEY)
                self._store(state, events)
            return
        n = len(events)
        if n:
            # The usual batch: only stores, all to one tier. Checked in C: countOf compares by identity
            # first, and the fast decoder returns one shared str per known medium (schema.py).
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
                g1.resident.clear()
                g1.emptied()
                g1.known = g1.anchored = True
                continue
            state = cache.get((medium, locality)) or self._state_for(medium, locality)
            if kind == STORED:
                self._store(state, run)
            else:
                self._remove(state, list(chain.from_iterable(map(_HASHES, run))))

    def apply_batches(self, batches: list[Any]) -> None:
        """Apply decoded batches (schema.DecodedBatch) in order, as `apply` on each would.

        A run of batches of GPU stores only (the usual run while the GPU cache has room) is applied to
        G1 at once: one residency log append and one reuse-tracker update for the run, with each batch's
        marker and sampled keys handed to the access stream in order as `apply` would hand them."""
        n = len(batches)
        if n == 1 or self.tenants is not None or countOf(map(_GPU_STORES_ONLY, batches), True) != n:
            for batch in batches:
                self.apply(batch.events, batch.unknown_events, batch.gpu_stores_only)
            return
        runs: list[list[Any]] = list(map(_EVENTS, batches))  # batches of GPU stores only: no unknown events
        self.events[STORED] += sum(map(len, runs))
        state = self._tier_cache.get(_GPU_KEY) or self._state_for(*_GPU_KEY)
        reuse = state.reuse
        mark = self._mark
        if mark is None:
            hashes = list(chain.from_iterable(map(_HASHES, chain.from_iterable(runs))))
            state.resident.store(hashes)
            reuse.use_many(hashes)
        else:  # each batch's marker, then its sampled keys (G1's reuse tracker forwards to the stream)
            forward = reuse.forward
            per_batch = [list(chain.from_iterable(map(_HASHES, events))) for events in runs]
            state.resident.store(list(chain.from_iterable(per_batch)))
            sampled: list[Any] = []
            for keys in per_batch:
                mark(BATCH)
                taken = reuse.sample(keys)
                if taken:
                    if forward is not None:
                        forward(taken)
                    sampled += taken
            if sampled:
                reuse.use_sampled(sampled)
        for events in runs:
            if events:
                _read_block_size(state, events)  # each batch's ends, as `apply` reads them

    @staticmethod
    def _remove(state: TierState, hashes: list[Any]) -> None:
        # a removal not resident, or repeated within the run, counts as unknown (BlockSet)
        if state.resident.remove(hashes):
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
        state.resident.store(hashes)  # a store of a resident block is not a new block (BlockSet counts)
        state.reuse.use_many(hashes)
        _read_block_size(state, stores)

    def set_complete(self, complete: bool) -> None:
        """True after seeing the publisher from seq 0, False after an unrecovered loss: all tiers."""
        self.complete = complete
        self.anchored |= complete
        for tier in STORAGE_TIERS:
            self.tier(tier)
        for state in self.tiers.values():
            state.known = complete
            state.anchored |= complete

    def restart(self) -> None:
        """A new publisher process: its caches start empty and its hashes may differ (seeded hashing).
        Empty is a known state: batches the new process sent before we saw it only make it an estimate."""
        for state in self.tiers.values():
            state.resident.clear()
            state.emptied()
            state.reuse.reset()
            state.anchored = True
        self.anchored = True
        if self.access is not None:
            self.access.reset()


def _read_block_size(state: TierState, stores: list[Any]) -> None:
    """The block_size of a run of stores to one tier, read at its first and last events (Residency._store)."""
    size = stores[0].block_size
    if size is not None and not (size == state.block_size > 0 and stores[-1].block_size == size):
        _fold_block_size(state, size, stores[-1].block_size)  # not the usual case: the size changes


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
