"""Reuse distance of KV blocks: an LRU stack-distance histogram over a stream of block stores.

For each store of a block already stored earlier in the same tier, the number of distinct blocks stored
in that tier in between (an LRU stack distance: a cache of more than that many blocks would have kept
it). Computed in O(log n) per reuse and O(1) per first use on a hash-sampled subset of the blocks
(SHARDS), see ReuseTracker. Pure: no I/O, no clock. collectors/kv_events/residency.py feeds it each tier's stores.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from math import ceil
from typing import Any

from kvscope.agent.core.kv_access import block_key

# Bucket upper bounds of the reuse-distance histogram: 0, then powers of two up to 2**20 blocks.
REUSE_BOUNDS: tuple[float, ...] = (0.0, *(float(2**i) for i in range(21)))
_INF_SLOT = len(REUSE_BOUNDS)


def sample_key(key: Hashable) -> int:
    """The number a block is sampled by (kept when below the threshold): the uint64 hash itself.

    vLLM's int block hash is the low 64 bits of a cryptographic digest, so it is already uniform; a bytes
    hash (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0) is the whole digest, whose last 8 bytes are that same
    int, so both modes sample the same blocks. Anything else falls back to Python's hash() (block_key).
    """
    return block_key(key)


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
        # where the sampled uses also go, in order (the what-if analysis' access stream, kvscope.agent.core.kv_access):
        # one C-level extend per call, set only for the tier whose stores are the access stream (G1)
        self.forward: Callable[[Any], object] | None = None

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

    def sample(self, keys: Sequence[Hashable]) -> Sequence[Hashable]:
        """The keys the histogram tracks, in order: those below the sampling threshold (all at rate 1)."""
        threshold = self._threshold
        if threshold is None:
            return keys
        try:  # uint64 hashes compare in C; any other key type raises and takes the general path
            return [k for k in keys if k < threshold]  # type: ignore[operator]
        except TypeError:
            return [k for k in keys if sample_key(k) < threshold]

    def use_many(self, keys: Sequence[Hashable]) -> None:
        """Record uses in order (the sampled ones), handing them to `forward` first."""
        keys = self.sample(keys)
        if keys:
            if self.forward is not None:
                self.forward(keys)
            self.use_sampled(keys)

    def use_sampled(self, keys: Sequence[Hashable]) -> None:
        """Record uses of keys already sampled (`sample`), in order, without forwarding them. The loop is
        inlined: it runs once per stored (sampled) block."""
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
