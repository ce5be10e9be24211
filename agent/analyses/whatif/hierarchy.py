"""Models of a tiered KV cache, replayed over a stream of block accesses: which tier serves each one.

Every tier is an LRU list of blocks with a capacity; an access looks the block up from the fastest tier
down and the block ends in G1 (prefill reads and writes KV there). What happens to the copies is the
policy:

- `exclusive`: a block lives in one tier. A hit in a lower tier moves it up (it leaves that tier); a
  block evicted from a tier is demoted to the next tier that keeps blocks, and from the last one it is
  dropped. The union of the tiers is then the top of one LRU stack, G1 its first C1 entries, G2 the next
  C2, and so on: a hit's tier follows from the block's LRU stack distance d against the cumulative sizes
  (G1 when d < C1, G2 when C1 <= d < C1 + C2, ...). The reuse-distance histogram the KV-event collector
  exports answers this policy for every size at once (docs/whatif.md has the PromQL).
- `inclusive` (the reference engine's tier store, and the copy-keeping offload of vLLM, LMCache, KVBM):
  a hit keeps its lower copy (touched there); a hit below G2 is also promoted into G2, when G2 keeps
  blocks; a block evicted from a tier is written to the next tier that keeps blocks unless that tier
  already holds it. Lower tiers then hold copies of upper ones and their LRU order is their own (a block
  hot in G1 ages in G2), so no single stack distance decides the tier: the model replays the policy.

A tier of capacity 0 keeps nothing (G1 of 0: a block passes through it and goes straight down). An
engine pins the blocks of the requests it is running: making room never evicts them. The accesses of one
KV-event batch (one engine step: the requests it scheduled) are replayed as a batch whose blocks are pinned
until its last access (`access_batch`); pins that span several steps are not modelled (docs/whatif.md says
what that changes).

The prefix rule. An engine's lookup takes the longest run of a prompt's leading blocks held somewhere: once
one is missing, the rest of the prompt is computed, even blocks a tier still holds (an LRU tier loses a
prefix's first blocks first, since they were used first). A block is computed without a lookup when the
block before it in its batch missed and is its known predecessor (Chains: the block that came right before
it when it was first seen, which is its parent, or with sampling its nearest sampled ancestor; a batch that
mixes requests shows other adjacencies, which the rule ignores). A computed block goes into G1 and leaves
the copies below as they are.

With a SHARDS-sampled stream (rate R), capacities are scaled by R: a cache of C blocks behaves, on the
sampled blocks, like one of C·R (Waldspurger et al., "Cache Modeling and Optimization using Miniature
Simulations", USENIX ATC 2017). `max_blocks` bounds what one model holds: capacities beyond it are cut
from the bottom tier up and the model says so (`clamped`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Literal

Policy = Literal["inclusive", "exclusive"]
POLICIES: tuple[Policy, ...] = ("inclusive", "exclusive")
TIERS = ("G1", "G2", "G3", "G4")
MISS = len(TIERS)  # the outcome index of an access no tier served
OUTCOMES = (*TIERS, "miss")


def scaled_capacities(blocks: Sequence[int], sample_rate: float, max_blocks: int) -> tuple[list[int], bool]:
    """Capacities in sampled blocks (C·R, rounded), cut so that they add up to at most `max_blocks`, the
    lowest tiers first; (capacities, whether any was cut)."""
    caps = [max(0, round(b * sample_rate)) for b in blocks]
    clamped = False
    budget = max_blocks
    for i, cap in enumerate(caps):
        if cap > budget:
            caps[i], clamped = budget, True
        budget -= caps[i]
    return caps, clamped


class Hierarchy:
    """One tier hierarchy at fixed capacities (in blocks of the stream it is fed)."""

    def __init__(self, capacities: Sequence[int], policy: Policy = "inclusive") -> None:
        if len(capacities) != len(TIERS):
            raise ValueError(f"expected {len(TIERS)} capacities, got {len(capacities)}")
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r} (allowed: {', '.join(POLICIES)})")
        self.capacities = [max(0, int(c)) for c in capacities]
        self.policy = policy
        self.tiers: list[OrderedDict[int, None]] = [OrderedDict() for _ in TIERS]
        # the tier below each tier that keeps blocks (G1 always exists; it may keep nothing)
        self._below: list[int | None] = [next((j for j in range(i + 1, len(TIERS)) if self.capacities[j] > 0), None)
                                         for i in range(len(TIERS))]
        self.counts = [0] * len(OUTCOMES)
        # blocks G1's evictions wrote into each tier below (the store work an engine may do in the request's step)
        self.g1_stores = [0] * len(TIERS)
        self._pinned: set[int] = set()

    @property
    def resident(self) -> int:
        return sum(len(t) for t in self.tiers)

    def access_batch(self, keys: Sequence[int], chained: Sequence[bool] = ()) -> list[int]:
        """Serves the accesses of one engine step in order, its blocks pinned until the last; their outcomes.
        `chained[i]`: keys[i - 1] is keys[i]'s known predecessor (the prefix rule, Chains)."""
        self._pinned = set(keys)
        out: list[int] = []
        try:
            for i, key in enumerate(keys):
                if i < len(chained) and chained[i] and out[-1] == MISS:
                    out.append(self.compute(key))
                else:
                    out.append(self.access(key))
            return out
        finally:
            self._pinned = set()

    def compute(self, key: int) -> int:
        """A block computed without a lookup (its prefix missed): into G1, lower copies untouched."""
        self.counts[MISS] += 1
        g1 = self.tiers[0]
        if key in g1:
            g1.move_to_end(key)
        elif self.policy == "exclusive" and any(key in t for t in self.tiers[1:]):
            for t in self.tiers[1:]:  # a block lives in one tier: the fresh copy replaces the stale one
                t.pop(key, None)
            self._admit(0, key)
        else:
            self._admit(0, key)
        return MISS

    def access(self, key: int) -> int:
        """Serves one access (the block pinned while room is made for it); returns the tier index that served
        it (0..3) or MISS."""
        tiers = self.tiers
        hit = MISS
        for i, tier in enumerate(tiers):
            if key in tier:
                hit = i
                break
        self.counts[hit] += 1
        if hit == 0:
            tiers[0].move_to_end(key)
            return 0
        pinned = self._pinned
        added = key not in pinned
        if added:
            pinned.add(key)
        if self.policy == "exclusive":
            if hit != MISS:
                del tiers[hit][key]
            self._admit(0, key)
        else:
            self._make_room(0)  # as the reference store: room in G1 first, then the promoted copy's room in G2
            if hit != MISS:
                tiers[hit].move_to_end(key)
                if hit > 1 and self.capacities[1] > 0:
                    self._admit(1, key)
            self._admit(0, key)
        if added:
            pinned.discard(key)
        return hit

    def feed(self, batches: Iterable[Sequence[int]], chains: Chains | None = None) -> None:
        for keys in batches:
            self.access_batch(keys, chains.links(keys) if chains is not None else ())

    def _make_room(self, i: int) -> bool:
        """Evicts tier i's least recently used blocks (never the pinned one) until one more fits."""
        tier, cap, pinned = self.tiers[i], self.capacities[i], self._pinned
        while len(tier) >= cap:
            victim = next((k for k in tier if k not in pinned), None)
            if victim is None:
                return False  # all pinned: the block does not go in (the reference store drops it)
            del tier[victim]
            self._demote(i, victim)
        return True

    def _admit(self, i: int, key: int) -> None:
        """Puts key at the MRU end of tier i (making room first); a tier that keeps nothing passes it down."""
        tier = self.tiers[i]
        if key in tier:
            tier.move_to_end(key)
            return
        if self.capacities[i] == 0:
            self._demote(i, key)
            return
        if self._make_room(i):
            tier[key] = None

    def _demote(self, i: int, key: int) -> None:
        below = self._below[i]
        if below is None:
            return
        if self.policy == "inclusive" and key in self.tiers[below]:
            return  # the lower copy is kept where it is (not touched): evicting costs no write
        if i == 0:
            self.g1_stores[below] += 1
        self._admit(below, key)


class Chains:
    """Which block came right before each block when it was first seen in a batch: its parent in a prompt's
    chain (with SHARDS sampling, the nearest sampled ancestor: a chain is always sampled at the same blocks).
    Bounded: beyond `limit` blocks the older half is forgotten (a forgotten block is learnt again)."""

    def __init__(self, limit: int) -> None:
        self.limit = max(2, limit)
        self._before: dict[int, int | None] = {}

    def links(self, keys: Sequence[int]) -> list[bool]:
        """For each key of a batch, whether the key before it is its known predecessor; learns new keys."""
        before = self._before
        out = []
        previous: int | None = None
        for key in keys:
            known = before.get(key, key)  # the key itself: not seen yet
            if known == key:
                before[key] = previous
                known = previous
            out.append(previous is not None and known == previous)
            previous = key
        if len(before) > self.limit:
            keep = list(before.items())[len(before) - self.limit // 2:]
            self._before = dict(keep)
        return out
