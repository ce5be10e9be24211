"""G1 block ages for the reference engine's /metrics, as vLLM measures them with `--kv-cache-metrics`
(vllm/v1/core/kv_cache_metrics.py, 0.33): a block's lifetime from allocation to eviction, its idle time
from last use to eviction, and the gap between two uses. Every block is watched (vLLM samples a fraction,
`--kv-cache-metrics-sample`). Fed the store's block events; the clock is the engine's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from kvscope.agent.core.tiers import Tier
from kvscope.agent.tools.reference.store_types import BlockEvent


class Observer(Protocol):
    def observe(self, amount: float) -> None: ...


class BlockAges:
    def __init__(self, clock: Callable[[], float], lifetime: Observer, idle: Observer, reuse_gap: Observer) -> None:
        self._clock = clock
        self._lifetime, self._idle, self._reuse_gap = lifetime, idle, reuse_gap
        self._born: dict[int, float] = {}
        self._used: dict[int, float] = {}

    def event(self, e: BlockEvent) -> None:
        if e.tier is not Tier.G1:
            return
        now, key = self._clock(), e.block.key
        if e.kind == "stored":
            self._born[key] = self._used[key] = now
        elif e.kind == "reused":
            last = self._used.get(key)
            if last is not None:
                self._reuse_gap.observe(now - last)
                self._used[key] = now
        elif e.kind == "removed":
            born, last = self._born.pop(key, None), self._used.pop(key, None)
            if born is not None and last is not None:
                self._lifetime.observe(now - born)
                self._idle.observe(now - last)
