"""The block hashes resident in one tier, in about 9 bytes a block: a sorted numpy array of 64-bit keys with
an alive flag each, updated in bulk.

A Python set of int hashes costs ~84 bytes a block (a 36-byte int object and a set slot at most 60 % full),
so a G4 tier of millions of blocks would cost the sidecar hundreds of MiB. Here:

- `store()` and `remove()` only append the batch's hashes to a log (one `list.extend`, no Python per hash);
- the log is applied in bulk (`flush`): sorted, grouped by key, each key's operations replayed in order from
  its state before the log (a store makes it resident, a removal not), which gives the counts exactly as a
  set would (a store of a resident block and a removal of an absent one change nothing; the latter counts
  as unknown), then removals clear alive flags and new keys are merged into a small `fresh` array that
  is folded into the `big` one (dropping dead keys) when it has grown to a quarter of it: each key is
  moved a few times in all, not once per flush;
- the log is applied when it holds FLUSH_AT hashes, when a removal might have emptied the tier (the
  caller's block-size bookkeeping needs to know at once), and before anything is read (`len`, counts,
  membership, iteration), so every figure read is exact.

Keys are 64-bit: vLLM's int block hash is one already; a bytes hash (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)
is kept by its last 8 bytes, the same 64 bits of a cryptographic digest (odds of a collision among 3 M
blocks: 1 in 4 million); anything else by Python's hash().
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

FLUSH_AT = 1 << 16  # hashes logged before they are applied (a Python list of them: ~3 MiB at most)
_U64 = (1 << 64) - 1
_EMPTY_KEYS: npt.NDArray[np.uint64] = np.empty(0, dtype=np.uint64)
_EMPTY_ALIVE: npt.NDArray[np.bool_] = np.empty(0, dtype=np.bool_)

Keys = npt.NDArray[np.uint64]
Flags = npt.NDArray[np.bool_]


def key_of(block_hash: Any) -> int:
    """The 64-bit key of a block hash (see the module docstring)."""
    if type(block_hash) is int and 0 <= block_hash <= _U64:
        return block_hash
    if isinstance(block_hash, bytes):
        return int.from_bytes(block_hash[-8:], "big")
    return hash(block_hash) & _U64


def _keys(hashes: list[Any]) -> Keys:
    try:
        return np.fromiter(hashes, dtype=np.uint64, count=len(hashes))
    except (OverflowError, TypeError, ValueError):  # bytes hashes, or ints outside 0..2**64-1
        return np.fromiter(map(key_of, hashes), dtype=np.uint64, count=len(hashes))


class _Where:
    """Where sorted keys are in one of the arrays: positions, and whether there (dead or alive)."""

    __slots__ = ("at", "found")

    def __init__(self, keys: Keys, wanted: Keys) -> None:
        if len(keys):
            self.at = np.minimum(keys.searchsorted(wanted), len(keys) - 1)
            self.found = keys[self.at] == wanted
        else:
            self.at = np.zeros(len(wanted), dtype=np.intp)
            self.found = np.zeros(len(wanted), dtype=np.bool_)


def _merge(keys: Keys, alive: Flags, new: Keys) -> tuple[Keys, Flags]:
    """Sorted `keys` (with their flags) and sorted `new` keys (alive, none of them in `keys`), merged."""
    if alive.all():  # no flag to carry: the two sorted runs merged by timsort, ~3x faster than the scatter
        merged = np.concatenate((keys, new))
        merged.sort(kind="stable")
        return merged, np.ones(len(merged), dtype=np.bool_)
    at = keys.searchsorted(new) + np.arange(len(new))
    merged = np.empty(len(keys) + len(new), dtype=np.uint64)
    flags = np.ones(len(merged), dtype=np.bool_)
    old = np.ones(len(merged), dtype=np.bool_)
    old[at] = False
    merged[at] = new
    merged[old] = keys
    flags[old] = alive
    return merged, flags


class BlockSet:
    """A set of block hashes that counts what changes it, like TierState kept with a Python set."""

    __slots__ = ("_big", "_big_alive", "_count", "_dead", "_ends", "_fresh", "_fresh_alive", "_kinds", "_log",
                 "_removing", "removed", "restored", "stored", "unknown")

    def __init__(self) -> None:
        self._big, self._big_alive = _EMPTY_KEYS, _EMPTY_ALIVE
        self._fresh, self._fresh_alive = _EMPTY_KEYS, _EMPTY_ALIVE
        self._count = 0  # alive keys, as of the last flush
        self._dead = 0  # dead keys still in the arrays
        self._log: list[Any] = []  # hashes not applied yet, in order
        self._kinds: list[bool] = []  # per run of the log: stores (True) or removals
        self._ends: list[int] = []  # per run: its end in the log
        self._removing = 0  # removals in the log
        # counts of what the applied operations did (read them through TierState, which flushes first)
        self.stored = 0  # stores of a block that was not resident
        self.restored = 0  # stores of a block already resident (vLLM's kv_cache_report_mode=full re-announcements)
        self.removed = 0  # removals of a resident block, and blocks cleared
        self.unknown = 0  # removals of a block that was not resident

    def store(self, hashes: list[Any]) -> None:
        self._append(hashes, True)

    def remove(self, hashes: list[Any]) -> bool:
        """Logs removals; returns True when the set is empty now (it is applied first when it might be)."""
        self._append(hashes, False)
        self._removing += len(hashes)
        if self._count - self._removing > 0:  # even if every removal hit, blocks remain
            return False
        self.flush()
        return self._count == 0

    def _append(self, hashes: list[Any], kind: bool) -> None:
        log = self._log
        log.extend(hashes)
        if self._kinds and self._kinds[-1] is kind:
            self._ends[-1] = len(log)
        else:
            self._kinds.append(kind)
            self._ends.append(len(log))
        if len(log) >= FLUSH_AT:
            self.flush()

    def __len__(self) -> int:
        self.flush()
        return self._count

    def __bool__(self) -> bool:
        return len(self) > 0

    def __contains__(self, block_hash: object) -> bool:
        self.flush()
        key = np.array([key_of(block_hash)], dtype=np.uint64)
        return bool(self._alive(key)[0][0])

    def contains_many(self, hashes: list[Any]) -> list[bool]:
        """Whether each hash is resident, in one lookup for all of them."""
        self.flush()
        if not hashes:
            return []
        keys = np.array([key_of(h) for h in hashes], dtype=np.uint64)
        return [bool(alive) for alive in self._alive(keys)[0]]

    def __iter__(self) -> Iterator[int]:
        """The resident keys (block hashes as their 64-bit keys), in no particular order."""
        self.flush()
        yield from self._big[self._big_alive].tolist()
        yield from self._fresh[self._fresh_alive].tolist()

    def clear(self) -> None:
        """Every resident block leaves (counted as removed)."""
        self.flush()
        self.removed += self._count
        self._big, self._big_alive = _EMPTY_KEYS, _EMPTY_ALIVE
        self._fresh, self._fresh_alive = _EMPTY_KEYS, _EMPTY_ALIVE
        self._count = self._dead = 0

    def nbytes(self) -> int:
        """Bytes of the arrays (the log not counted)."""
        return int(self._big.nbytes + self._big_alive.nbytes + self._fresh.nbytes + self._fresh_alive.nbytes)

    def _alive(self, keys: Keys) -> tuple[Flags, _Where, _Where]:
        """Which sorted keys are resident, and where each is in `big` and in `fresh`."""
        big, fresh = _Where(self._big, keys), _Where(self._fresh, keys)
        alive = big.found & self._big_alive[big.at] if len(self._big) else big.found.copy()
        if len(self._fresh):
            alive |= fresh.found & self._fresh_alive[fresh.at]
        return alive, big, fresh

    def flush(self) -> None:
        """Applies the log (see the module docstring)."""
        log = self._log
        if not log:
            return
        keys = _keys(log)
        kinds, ends = self._kinds, self._ends
        self._log, self._kinds, self._ends, self._removing = [], [], [], 0
        if kinds == [True]:  # stores only, the usual log: which keys are new is all there is to know
            keys.sort()
            unique = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]
            before, big, fresh = self._alive(unique)
            added = len(unique) - int(np.count_nonzero(before))
            self.stored += added
            self.restored += len(keys) - added
            self._count += added
            self._add(unique, ~before, big, fresh)
            return
        ops = np.repeat(np.array(kinds, dtype=np.bool_), np.diff(np.array(ends), prepend=0))
        order = np.argsort(keys, kind="stable")
        sk, so = keys[order], ops[order]
        n = len(sk)
        first = np.empty(n, dtype=np.bool_)
        first[0] = True
        np.not_equal(sk[1:], sk[:-1], out=first[1:])
        unique = sk[first]
        before, big, fresh = self._alive(unique)  # resident before the log
        prev = np.empty(n, dtype=np.bool_)  # resident before each operation
        prev[1:] = so[:-1]
        prev[first] = before
        self.stored += int(np.count_nonzero(so & ~prev))
        self.restored += int(np.count_nonzero(so & prev))
        self.removed += int(np.count_nonzero(~so & prev))
        self.unknown += int(np.count_nonzero(~so & ~prev))
        last = np.empty(n, dtype=np.bool_)
        last[:-1] = first[1:]
        last[-1] = True
        after = so[last]  # resident after the log
        gone, new = before & ~after, after & ~before
        self._count += int(np.count_nonzero(new)) - int(np.count_nonzero(gone))
        self._kill(gone, big, fresh)
        self._add(unique, new, big, fresh)

    def _kill(self, gone: Flags, big: _Where, fresh: _Where) -> None:
        """Clears the alive flag of the keys `gone` marks (each alive in big or in fresh)."""
        for where, alive in ((big, self._big_alive), (fresh, self._fresh_alive)):
            if len(alive):
                hit = where.at[gone & where.found & alive[where.at]]
                alive[hit] = False
                self._dead += len(hit)

    def _add(self, keys: Keys, new: Flags, big: _Where, fresh: _Where) -> None:
        """Makes the keys `new` marks resident: a dead copy comes back to life, the others join `fresh`,
        which is folded into `big` once it has grown to a quarter of it (or too much is dead)."""
        rest = new.copy()
        for where, alive in ((big, self._big_alive), (fresh, self._fresh_alive)):
            if len(alive):
                back = rest & where.found
                if back.any():
                    alive[where.at[back]] = True
                    self._dead -= int(np.count_nonzero(back))
                    rest &= ~back
        if rest.any():
            self._fresh, self._fresh_alive = _merge(self._fresh, self._fresh_alive, keys[rest])
        total = len(self._big) + len(self._fresh)
        if len(self._fresh) > max(len(self._big) >> 2, FLUSH_AT) or self._dead > total >> 2:
            if self._dead:
                merged = np.concatenate((self._big[self._big_alive], self._fresh[self._fresh_alive]))
            else:  # nothing to drop (a boolean mask costs ~4 ns a key even when it keeps them all)
                merged = np.concatenate((self._big, self._fresh))
            merged.sort(kind="stable")  # two sorted runs: a merge
            self._big, self._big_alive = merged, np.ones(len(merged), dtype=np.bool_)
            self._fresh, self._fresh_alive = _EMPTY_KEYS, _EMPTY_ALIVE
            self._dead = 0
