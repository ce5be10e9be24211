"""The tier model: where KV blocks live and the links they move along."""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class Tier(StrEnum):
    G1 = "G1"  # GPU memory (HBM)
    G2 = "G2"  # host DRAM
    G3 = "G3"  # local NVMe / SSD
    G4 = "G4"  # shared network storage
    UNATTRIBUTED = "unattributed"  # a hit the source did not place in a tier


STORAGE_TIERS = (Tier.G1, Tier.G2, Tier.G3, Tier.G4)


def parse_tier(text: str) -> Tier:
    """Accepts 'G1'..'G4' in any case and 'unattributed'; anything else is a ValueError."""
    for tier in Tier:
        if text.strip().lower() == tier.value.lower():
            return tier
    allowed = ", ".join(t.value for t in Tier)
    raise ValueError(f"unknown tier {text!r} (allowed: {allowed})")


class Link(NamedTuple):
    """An ordered pair of tiers a transfer moves along."""

    src: Tier
    dst: Tier

    @property
    def is_onboard(self) -> bool:
        """True when the link moves blocks toward G1 (the read path that TTFT waits on)."""
        return STORAGE_TIERS.index(self.dst) < STORAGE_TIERS.index(self.src)


def link(src: str | Tier, dst: str | Tier) -> Link:
    s, d = parse_tier(str(src)), parse_tier(str(dst))
    if Tier.UNATTRIBUTED in (s, d) or s == d:
        raise ValueError(f"{s}->{d} is not a link between two different tiers")
    return Link(s, d)
