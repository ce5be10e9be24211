"""BlockSet (collectors/kv_events/blockset.py) against a Python set: the same members and the same counts, whatever
the order of stores and removals, across flushes, merges and clears."""

from __future__ import annotations

import random

import pytest

from kvscope.collectors.kv_events import blockset as kv_blockset
from kvscope.collectors.kv_events.blockset import BlockSet, key_of


class Reference:
    """What TierState counted with a Python set."""

    def __init__(self) -> None:
        self.members: set[int] = set()
        self.stored = self.removed = self.unknown = self.restored = 0

    def store(self, hashes: list[int]) -> None:
        before = len(self.members)
        self.members.update(hashes)
        self.stored += len(self.members) - before
        self.restored += len(hashes) - (len(self.members) - before)  # stores of a block already resident

    def remove(self, hashes: list[int]) -> None:
        before = len(self.members)
        self.members.difference_update(hashes)
        gone = before - len(self.members)
        self.removed += gone
        self.unknown += len(hashes) - gone


def check(ours: BlockSet, ref: Reference) -> None:
    assert len(ours) == len(ref.members)
    assert set(ours) == ref.members
    assert (ours.stored, ours.removed, ours.unknown, ours.restored) == (ref.stored, ref.removed, ref.unknown,
                                                                         ref.restored)


@pytest.mark.parametrize("seed", range(6))
def test_random_operations_match_a_python_set(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kv_blockset, "FLUSH_AT", 37)  # flushes and merges mid-stream, many of them
    rng = random.Random(seed)
    pool = [rng.getrandbits(64) for _ in range(300)] + [0, 2**64 - 1]
    ours, ref = BlockSet(), Reference()
    for step in range(600):
        hashes = [rng.choice(pool) for _ in range(rng.randint(1, 12))]  # repeats within a batch too
        if rng.random() < 0.6:
            ours.store(hashes)
            ref.store(hashes)
        else:
            empty = ours.remove(hashes)
            ref.remove(hashes)
            if empty:
                assert not ref.members  # it says empty only when it is
        if step % 97 == 0:
            check(ours, ref)
            probe = rng.choice(pool)
            assert (probe in ours) == (probe in ref.members)
    check(ours, ref)
    removed = ours.removed
    ours.clear()
    assert len(ours) == 0 and ours.removed == removed + len(ref.members)


def sorted_and_unique(ours: BlockSet) -> bool:
    keys = [*ours._big.tolist(), *ours._fresh.tolist()]
    return (all(a < b for a, b in zip(ours._big.tolist(), ours._big.tolist()[1:], strict=False))
            and all(a < b for a, b in zip(ours._fresh.tolist(), ours._fresh.tolist()[1:], strict=False))
            and len(set(keys)) == len(keys))


def test_stores_only_then_removals_then_stores_match_a_python_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """The paths taken while nothing is dead (fresh merged by a sort, big folded without a mask) and those
    taken once removals have left dead keys, one after the other, with folds in each phase."""
    monkeypatch.setattr(kv_blockset, "FLUSH_AT", 37)
    rng = random.Random(7)
    ours, ref = BlockSet(), Reference()
    folds = 0
    for phase, steps in (("stores", 400), ("removals", 150), ("stores", 400)):
        for _ in range(steps):
            big = len(ours._big)
            if phase == "stores":
                hashes = [rng.getrandbits(64) for _ in range(rng.randint(1, 12))]
                ours.store(hashes)
                ref.store(hashes)
            else:
                hashes = rng.sample(sorted(ref.members), min(len(ref.members), rng.randint(1, 12)))
                ours.remove(hashes)
                ref.remove(hashes)
            len(ours)  # a read applies the log
            folds += len(ours._big) != big
            assert sorted_and_unique(ours)
        check(ours, ref)
    assert folds >= 6  # the fold ran in each phase, with dead keys and without


def test_a_removal_that_empties_the_set_is_seen_at_once() -> None:
    ours = BlockSet()
    ours.store([1, 2, 3])
    assert ours.remove([1, 2]) is False
    assert ours.remove([3, 4]) is True  # applied at once: the caller forgets the tier's block size
    assert (ours.stored, ours.removed, ours.unknown) == (3, 3, 1)


def test_bytes_and_odd_hashes_are_kept_by_a_64_bit_key() -> None:
    digest = bytes(range(32))
    ours = BlockSet()
    ours.store([digest, -5, 2**70])
    assert len(ours) == 3 and digest in ours and key_of(digest) == int.from_bytes(digest[-8:], "big")
    ours.remove([digest])
    assert len(ours) == 2 and digest not in ours and ours.removed == 1


def test_memory_is_a_few_bytes_a_block() -> None:
    ours = BlockSet()
    for start in range(0, 200_000, 512):
        ours.store(list(range(start * 7919 + 1, start * 7919 + 1 + 512 * 7919, 7919)))
    assert len(ours) == 200_192
    assert ours.nbytes() <= 10 * len(ours)  # 8-byte keys and a 1-byte flag, once merged
