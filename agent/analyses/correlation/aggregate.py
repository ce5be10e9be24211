"""Aggregate attribution: each window's growth of the engine series, split into queue/fetch/offload/prefill/
other.

From one window of the store (a StoreReader snapshot: growth since the last window, reset-aware, labels by
name): the TTFT, queue and prefill histogram sums, the onboard transfer seconds and bytes (fetch)
and the transfer seconds of the links leaving G1 (offload, for engines that store inside the step; a link
the engine counts in bytes only is timed at the measured bandwidth of the reverse link, the same wire)
(attribution.py has the arithmetic). It also feeds the tier fetch models from transfer totals and learns
KV bytes per token (bytes onboarded to G1 / tokens hit below G1).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kvscope.agent.analyses.correlation import metrics as m
from kvscope.agent.analyses.correlation.attribution import FetchInside, OffloadInside, WindowTotals, attribute_window
from kvscope.agent.analyses.correlation.state import Key, Models, Outputs, engine_key
from kvscope.agent.core import contract
from kvscope.agent.core.reader import Window
from kvscope.agent.core.records import Method
from kvscope.agent.core.tiers import Tier, link

# Queue and prefill time are observed when a request finishes, its fetch while it runs: a fetch that does
# not fit this window's phase is carried into the next windows (until its request finishes) for at most
# this many windows before it counts as fetch_overflow.
FETCH_CARRY_WINDOWS = 60
# The same delay splits a request's TTFT (observed at its first token) from its queue and prefill time
# (observed when it finishes) when a window ends in between. A window whose TTFTs outnumber its queue or
# prefill observations is held and added to the next one, until the observations have caught up, for at
# most this many windows. Attributed apart, the first window would count the missing phases as `other`
# and the next one, with no TTFT of its own, would not be attributed at all.
HOLD_WINDOWS = 5
BELOW_G1 = (Tier.G2.value, Tier.G3.value, Tier.G4.value, Tier.UNATTRIBUTED.value)


@dataclass
class WindowSummary:
    """What one window of engine series yields for the path signals."""

    fetch: float = 0.0
    ttft: float = 0.0
    onboard_bytes: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    onboard_seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    tier_bytes: dict[str, float] = field(default_factory=lambda: defaultdict(float))


# what the aggregate attribution reads of the store, every window
METRICS = (contract.TTFT_SECONDS, contract.QUEUE_SECONDS, contract.PREFILL_SECONDS, contract.KV_TRANSFER_BYTES,
           contract.KV_TRANSFER_SECONDS, contract.KV_HIT_TOKENS)


class WindowAttribution:
    def __init__(self, models: Models, outputs: Outputs,
                 fetch_inside: Callable[[str], FetchInside], offload_inside: Callable[[str], OffloadInside]) -> None:
        self._models, self._out = models, outputs
        self._fetch_inside, self._offload_inside = fetch_inside, offload_inside
        # fetch (offload) waiting for its phase, windows waited
        self._fetch_carry: dict[Key, tuple[float, int]] = {}
        self._offload_carry: dict[Key, tuple[float, int]] = {}
        # windows held until their requests' queue and prefill time are observed: totals, counts, windows
        self._held: dict[Key, tuple[WindowTotals, _Counts, int]] = {}

    def step(self, snapshot: Window) -> WindowSummary:
        """One window of the store (a StoreReader's snapshot of METRICS) attributed."""
        models, window = self._models, WindowSummary()
        fetch: dict[Key, float] = defaultdict(float)
        has_fetch: set[Key] = set()
        offload: dict[Key, float] = defaultdict(float)
        offload_method: dict[Key, str] = {}
        stores: list[tuple[Key, str, float]] = []  # untimed stores: (engine, destination tier, bytes)
        for moved in snapshot.series(contract.KV_TRANSFER_BYTES):
            key, src, dst = engine_key(moved.labels.key), moved.labels["src"], moved.labels["dst"]
            window.tier_bytes[src] += moved.rate_growth
            window.tier_bytes[dst] += moved.rate_growth
            try:
                onboard = link(src, dst).is_onboard
            except ValueError:
                continue
            timed = snapshot.get(contract.KV_TRANSFER_SECONDS, moved.labels.key)
            if not onboard and src == Tier.G1.value:  # a store leaving G1: offload
                offload_method.setdefault(key, "measured")
                if timed is not None:
                    offload[key] += timed.growth
                else:
                    stores.append((key, dst, moved.growth))
            if onboard and dst == Tier.G1.value:  # every fetched block crosses the last hop exactly once
                models.token_bytes[key][0] += moved.growth
            if onboard and timed is not None:
                fetch[key] += timed.growth
                has_fetch.add(key)
                models.tier(key, src).observe_window(moved.growth, timed.growth)
                window.onboard_bytes[src] += moved.growth
                window.onboard_seconds[src] += timed.growth
        for key, dst, size in stores:  # timed at the reverse link's bandwidth (the same wire), if measured
            bandwidth = models.tier(key, dst).effective_bandwidth if size > 0 else None
            if size > 0 and bandwidth is None:
                offload_method.pop(key, None)  # a store the agent cannot time: no offload figure this window
                continue
            offload[key] += size / bandwidth if bandwidth else 0.0
            if key in offload_method:
                offload_method[key] = "estimated"
        reused: dict[Key, float] = defaultdict(float)
        for hit in snapshot.series(contract.KV_HIT_TOKENS):
            if hit.labels["tier"] in BELOW_G1:
                key = engine_key(hit.labels.key)
                models.token_bytes[key][1] += hit.growth
                reused[key] += hit.rate_growth
        seen: set[Key] = set()
        for ttft in snapshot.series(contract.TTFT_SECONDS):
            labels = ttft.labels.key
            key = engine_key(labels)
            seen.add(key)
            queue = snapshot.get(contract.QUEUE_SECONDS, labels)
            prefill = snapshot.get(contract.PREFILL_SECONDS, labels)
            carried, waited = self._fetch_carry.pop(key, (0.0, 0))
            offload_carried, offload_waited = self._offload_carry.pop(key, (0.0, 0))
            method: Method = "estimated" if offload_method.get(key) == "estimated" else "measured"
            totals = WindowTotals(ttft.sum_growth, None if queue is None else queue.sum_growth,
                                  None if prefill is None else prefill.sum_growth,
                                  fetch[key] + carried if key in has_fetch or carried else None,
                                  offload[key] + offload_carried if key in offload_method or offload_carried else None,
                                  method)
            if ttft.growth > 0:
                models.reused_per_request[key] = reused[key] / ttft.growth
            if (ttft.growth == 0 and ttft.sum_growth == 0 and not fetch[key] and not carried and not offload[key]
                    and not offload_carried and key not in self._held):
                continue
            counts = _Counts(ttft.growth, None if queue is None else queue.growth,
                             None if prefill is None else prefill.growth)
            held = self._hold(key, totals, counts)
            if held is None:
                continue
            attribution = attribute_window(held, self._fetch_inside(key[0]), self._offload_inside(key[0]))
            if attribution.fetch_overflow > 0 and waited < FETCH_CARRY_WINDOWS:
                self._fetch_carry[key] = (attribution.fetch_overflow, waited + 1)
                attribution = replace(attribution, fetch_overflow=0.0)
            if attribution.offload_overflow > 0 and offload_waited < FETCH_CARRY_WINDOWS:
                self._offload_carry[key] = (attribution.offload_overflow, offload_waited + 1)
                attribution = replace(attribution, offload_overflow=0.0)
            self._out.add_attribution(m.TTFT_ATTRIBUTED, key, attribution, "aggregate")
            window.fetch += attribution.seconds("fetch")
            window.ttft += attribution.ttft
        # fetch and offload of an engine whose first request has not finished yet (no TTFT series to put them
        # against): carried until it has one
        for key in (has_fetch | set(offload_method)) - seen:
            self._carry(self._fetch_carry, key, fetch[key], "fetch_overflow")
            self._carry(self._offload_carry, key, offload[key], "offload_overflow")
        return window

    def _hold(self, key: Key, totals: WindowTotals, counts: _Counts) -> WindowTotals | None:
        """This window's totals with those held before it, or None while its TTFTs are still ahead of their
        queue or prefill observations (held, for at most HOLD_WINDOWS windows)."""
        windows = 0
        if key in self._held:
            before, before_counts, windows = self._held.pop(key)
            totals, counts = _joined(before, totals), before_counts + counts
        if counts.ahead() and windows + 1 < HOLD_WINDOWS:
            self._held[key] = (totals, counts, windows + 1)
            return None
        return totals

    def _carry(self, carry: dict[Key, tuple[float, int]], key: Key, seconds: float, error: str) -> None:
        held, waited = carry.pop(key, (0.0, 0))
        if waited < FETCH_CARRY_WINDOWS:
            if held + seconds > 0:
                carry[key] = (held + seconds, waited + 1)
        else:
            self._out.counters[(m.ATTRIBUTION_ERROR, (*key, "aggregate", error))] += held + seconds


@dataclass(frozen=True, slots=True)
class _Counts:
    """Requests observed in a span of windows: TTFTs, and queue and prefill times (None: not reported)."""

    ttft: float
    queue: float | None
    prefill: float | None

    def __add__(self, other: _Counts) -> _Counts:
        return _Counts(self.ttft + other.ttft, _add(self.queue, other.queue), _add(self.prefill, other.prefill))

    def ahead(self) -> bool:
        """Some TTFT has no queue or prefill time yet (its request has not finished)."""
        return any(n is not None and self.ttft > n for n in (self.queue, self.prefill))


def _add(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else a + b


def _joined(a: WindowTotals, b: WindowTotals) -> WindowTotals:
    method: Method = "estimated" if "estimated" in (a.offload_method, b.offload_method) else "measured"
    return WindowTotals(a.ttft + b.ttft, _add(a.queue, b.queue), _add(a.prefill, b.prefill), _add(a.fetch, b.fetch),
                        _add(a.offload, b.offload), method)
