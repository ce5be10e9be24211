"""The tier store's vocabulary: tier settings, the hops it reports (Transfer), residency changes (BlockEvent),
what a fetch brought up (FetchResult), the observer the engine implements, and the clock of offload work on
a request's path."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from kvscope.agent.core.tiers import Tier
from kvscope.agent.tools.reference.blocks import BlockId

G1, G2, G3, G4 = Tier.G1, Tier.G2, Tier.G3, Tier.G4
ORDER = (G1, G2, G3, G4)
# KV-event medium and locality per tier, as vLLM ≥ 0.27 publishes them (facts/vllm.md §2.4); the GPU
# block pool and the CPU offload tier send no locality.
MEDIUM: dict[Tier, tuple[str, str | None]] = {
    G1: ("GPU", None), G2: ("CPU", None), G3: ("STORAGE", "LOCAL"), G4: ("STORAGE", "REMOTE"),
}


@dataclass(frozen=True, slots=True)
class TierSpec:
    capacity_blocks: int  # 0: the tier is off (G1 and G2 still exist as working and staging memory)
    retain: bool = True  # False: keeps nothing between requests
    path: Path | None = None  # G3/G4 directory
    direct: bool = False  # O_DIRECT for G3/G4 files (falls back to buffered where refused)


@dataclass(frozen=True, slots=True)
class Transfer:
    src: Tier
    dst: Tier
    bytes: int
    seconds: float
    start: float  # clock() at the start
    background: bool = False  # done by the write-behind thread, not on behalf of the request in flight
    # for a copy into G1: the tier the block was fetched from (a G3/G4 block reaches G1 through host memory)
    origin: Tier | None = None


@dataclass(frozen=True, slots=True)
class BlockEvent:
    kind: str  # "stored" | "removed" | "reused" (a use of a block already in the tier: no residency change)
    tier: Tier
    block: BlockId


class StoreObserver(Protocol):
    def transfer(self, t: Transfer) -> None: ...
    def block_event(self, e: BlockEvent) -> None: ...
    def error(self, tier: Tier, kind: str) -> None: ...


@dataclass
class FetchResult:
    blocks_by_tier: dict[Tier, int] = field(default_factory=dict)
    seconds_by_tier: dict[Tier, float] = field(default_factory=dict)  # wall time bringing them to G1
    bytes_by_tier: dict[Tier, int] = field(default_factory=dict)  # bytes moved off that tier
    loaded: int = 0  # leading blocks now in G1
    failed: bool = False  # a block could not be read; the rest of the prefix is recomputed


class _Tier:
    """Residency of one tier: LRU order of keys, plus pool slots for memory tiers."""

    def __init__(self, tier: Tier, spec: TierSpec) -> None:
        self.tier = tier
        self.spec = spec
        self.lru: OrderedDict[int, int] = OrderedDict()  # key → pool slot (memory) or 0 (file)

    @property
    def keeps(self) -> bool:
        return self.spec.capacity_blocks > 0 and self.spec.retain


class OffloadClock:
    """Seconds of offload work (evictions, stores down, waits for a write buffer) done for the request in flight:
    only the outermost stretch is timed, and only on the thread that began the request (not the writer's)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.seconds = 0.0
        self._depth = 0
        self._thread: int | None = None

    def begin(self) -> None:
        self.seconds = 0.0
        self._thread = threading.get_ident()

    @contextmanager
    def timing(self) -> Iterator[None]:
        counted = self._depth == 0 and threading.get_ident() == self._thread
        self._depth += 1
        t0 = self.clock()
        try:
            yield
        finally:
            self._depth -= 1
            if counted:
                self.seconds += self.clock() - t0
