"""The reference engine's G1 block ages (vLLM's --kv-cache-metrics histograms): lifetime and idle time at
eviction, the gap between uses; other tiers ignored. Fed block events on a clock the test moves."""

from __future__ import annotations

from kvscope.agent.core.tiers import Tier
from kvscope.agent.tools.reference.block_ages import BlockAges
from kvscope.agent.tools.reference.blocks import BlockId
from kvscope.agent.tools.reference.store_types import BlockEvent


class Seen:
    def __init__(self) -> None:
        self.values: list[float] = []

    def observe(self, amount: float) -> None:
        self.values.append(amount)


def test_lifetime_idle_and_reuse_gap_of_g1_blocks() -> None:
    now = [100.0]
    lifetime, idle, gap = Seen(), Seen(), Seen()
    ages = BlockAges(lambda: now[0], lifetime, idle, gap)
    a, b = BlockId(1, None, (1,) * 16), BlockId(2, 1, (2,) * 16)

    def at(t: float, kind: str, block: BlockId, tier: Tier = Tier.G1) -> None:
        now[0] = t
        ages.event(BlockEvent(kind, tier, block))

    at(100.0, "stored", a)
    at(101.0, "stored", b)
    at(103.0, "reused", a)
    at(108.0, "reused", a)
    at(110.0, "removed", a)  # lived 10 s, idle 2 s since its last use
    at(111.0, "stored", a, Tier.G2)  # G2's blocks are not G1's pool
    at(112.0, "removed", a, Tier.G2)
    at(120.0, "removed", b)  # never reused: lifetime = idle
    at(121.0, "removed", a)  # gone already: nothing to observe
    assert gap.values == [3.0, 5.0]
    assert lifetime.values == [10.0, 19.0]
    assert idle.values == [2.0, 19.0]
