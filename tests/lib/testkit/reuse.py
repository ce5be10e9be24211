"""Slow, obviously right models of reuse distance that the KV-event tests check the fast ones against."""

from __future__ import annotations

from kvscope.collectors.kv_events.reuse import REUSE_BOUNDS


def brute_distances(seq: list[int]) -> list[int]:
    out = []
    for t, key in enumerate(seq):
        for p in range(t - 1, -1, -1):
            if seq[p] == key:
                out.append(len(set(seq[p + 1:t])))
                break
    return out


def slot(d: float) -> int:
    return next(i for i, bound in enumerate((*REUSE_BOUNDS, float("inf"))) if d <= bound)
