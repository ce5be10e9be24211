"""KVBM's G2 hits without the disk hits it stages through host memory, held monotone.

Newer KVBM builds onboard a disk hit in two steps: disk → host (`onboard_blocks_d2h`, "G3→G2 staging step"),
then host → device (`onboard_blocks_h2d`), so `onboard_blocks_h2d` counts every staged disk hit a second time.
The name table (kvbm_map.py) therefore counts a staged block as a disk hit and takes it off G2's hits:
G2 hits = (h2d − d2h) × block tokens. Both counters are monotone, their difference is not: between the two
steps a block is staged (d2h grew) but not yet promoted (h2d did not), and the difference dips. Since every
staged block is promoted later, h2d − d2h never exceeds the true count of G2's own hits and equals it when
nothing is in flight; its running maximum is monotone, still never exceeds the true count, and meets it
whenever the staging queue drains. So the exported G2 hits are that running maximum, started again only when
KVBM itself restarts (either counter went backwards), which the store reads as the reset it is. A staged
block that is never promoted (its request aborted) stays a disk hit and keeps G2's count that much low.

Pages without `onboard_blocks_d2h` (KVBM ≤ 0.9.0) are left as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.agent.core import contract as c
from kvscope.agent.core.readings import Reading, Sample

G2 = "G2"


@dataclass(slots=True)
class _Held:
    promoted: float  # onboard_blocks_h2d at the last scrape
    staged: float  # onboard_blocks_d2h at the last scrape
    hits: float  # G2 hit tokens exported


class StagedHits:
    """Per engine series (engine, model, dp_rank): G2 hits held monotone across scrapes."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, ...], _Held] = {}

    def apply(self, readings: list[Reading], disk_tier: str) -> list[Reading]:
        blocks = {r.labels: r.value for r in readings
                  if isinstance(r, Sample) and r.name == c.KV_TRANSFER_BLOCKS}
        out: list[Reading] = []
        for reading in readings:
            if not (isinstance(reading, Sample) and reading.name == c.KV_HIT_TOKENS and reading.labels[3:] == (G2,)):
                out.append(reading)
                continue
            key = reading.labels[:3]
            staged = blocks.get((*key, disk_tier, G2))
            promoted = blocks.get((*key, G2, "G1"))
            if staged is None:  # a build without the staging step: h2d is G2's own hits
                out.append(reading)
                continue
            if promoted is None:  # only the staging counter: G2 serves nothing of its own that the page shows
                continue
            out.append(Sample(reading.name, reading.labels, self._hold(key, promoted, staged, reading.value)))
        return out

    def _hold(self, key: tuple[str, ...], promoted: float, staged: float, hits: float) -> float:
        held = self._held.get(key)
        if held is None or promoted < held.promoted or staged < held.staged:  # the first scrape, or KVBM restarted
            value = max(0.0, hits)
        else:
            value = max(held.hits, hits)
        self._held[key] = _Held(promoted, staged, value)
        return value
