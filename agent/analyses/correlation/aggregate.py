"""Aggregate attribution: each window's growth of the engine series, split into frontend/queue/fetch/offload/
prefill/other.

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
# least this many windows and PHASE_HOLD_SECONDS (the phases wait for the request's whole decode; windows
# alone end early where they are short: a reader that makes the agent collect on every scrape, or the
# self-test's settling, ticked 5 windows by in ~0.1 s). Attributed apart, the first window would count the
# missing phases as `frontend` and the next one, with no TTFT of its own, as a negative remainder.
HOLD_WINDOWS = 5
PHASE_HOLD_SECONDS = 30.0
# A window is also held until the per-request records of its requests have come (their GPU idle time is
# taken out of its prefill sum), where the engine sends records with GPU samples: spans leave the engine
# through a BatchSpanProcessor, which exports every 5 s (OTEL_BSP_SCHEDULE_DELAY), so they lag the
# histograms by seconds whatever the agent's interval. Held for at most this long (or HOLD_WINDOWS).
RECORD_HOLD_SECONDS = 15.0
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
                 fetch_inside: Callable[[str], FetchInside], offload_inside: Callable[[str], OffloadInside],
                 expect_records: Callable[[], bool] = lambda: False) -> None:
        """`expect_records`: per-request records with GPU samples may come (a record stream and GPUs): every
        engine's windows wait for them until it has sent none for RECORD_HOLD_SECONDS."""
        self._models, self._out = models, outputs
        self._expect_records = expect_records
        self._silent: set[Key] = set()  # engines whose windows waited in vain: not held for records until they send
        self._fetch_inside, self._offload_inside = fetch_inside, offload_inside
        # fetch (offload) waiting for its phase, windows waited
        self._fetch_carry: dict[Key, tuple[float, int]] = {}
        self._offload_carry: dict[Key, tuple[float, int]] = {}
        # windows held until their requests' queue and prefill time are observed: totals, counts, windows
        self._held: dict[Key, tuple[WindowTotals, _Counts, int, float]] = {}  # ..., since (wall)
        # GPU idle in the prefill phases of the per-request records (beyond their fetch and offload): seconds
        # waiting for a window's prefill sum, windows waited; and the records that brought it, per key
        self._idle_carry: dict[Key, tuple[float, int]] = {}
        self._idle_records: dict[Key, int] = {}
        self._record_offload: dict[Key, float] = {}

    def add_idle(self, seconds: dict[Key, float], records: dict[Key, int], offload: dict[Key, float]) -> None:
        """The per-request records' GPU idle time in their prefill phases (RequestAttribution.idle_by_key),
        to be taken out of the prefill sum of the windows that hold those requests. A key that has sent
        any is tracked: its windows are held until as many records have come as TTFTs were observed, and
        their offload is the records' own (the engine's store clock per request, bookkeeping between
        blocks included) instead of the transfer seconds of the links leaving G1."""
        for key, n in records.items():
            self._silent.discard(key)
            self._idle_records[key] = self._idle_records.get(key, 0) + n
        for key, offloaded in offload.items():
            self._record_offload[key] = self._record_offload.get(key, 0.0) + offloaded
        for key, idle in seconds.items():
            held, waited = self._idle_carry.pop(key, (0.0, 0))
            self._idle_carry[key] = (held + idle, waited)

    def step(self, snapshot: Window, now: float = 0.0) -> WindowSummary:
        """One window of the store (a StoreReader's snapshot of METRICS) attributed."""
        models, window = self._models, WindowSummary()
        fetch: dict[Key, float] = defaultdict(float)
        has_fetch: set[Key] = set()
        offload: dict[Key, float] = defaultdict(float)
        offload_method: dict[Key, str] = {}
        stores: list[tuple[Key, str, float]] = []  # untimed stores: (engine, destination tier, bytes)
        models.decay_mix(now)
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
            if onboard:
                models.mix[key].add_onboard(src, dst, moved.growth, None if timed is None else timed.growth)
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
            models.mix[engine_key(hit.labels.key)].add_hits(hit.labels["tier"], hit.growth)
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
            idle_carried, idle_waited = self._idle_carry.pop(key, (0.0, 0))
            method: Method = "estimated" if offload_method.get(key) == "estimated" else "measured"
            totals = WindowTotals(ttft.sum_growth, None if queue is None else queue.sum_growth,
                                  None if prefill is None else prefill.sum_growth,
                                  fetch[key] + carried if key in has_fetch or carried else None,
                                  offload[key] + offload_carried if key in offload_method or offload_carried else None,
                                  method, idle_carried or None)
            if ttft.growth > 0:
                models.reused_per_request[key] = reused[key] / ttft.growth
            if (ttft.growth == 0 and ttft.sum_growth == 0 and not fetch[key] and not carried and not offload[key]
                    and not offload_carried and key not in self._held):
                if idle_carried:  # no prefill sum to take it from in this window
                    self._carry(self._idle_carry, key, idle_carried, "idle_overflow", idle_waited)
                continue
            counts = _Counts(ttft.growth, None if queue is None else queue.growth,
                             None if prefill is None else prefill.growth,
                             self._records_for(key))
            held = self._hold(key, totals, counts, now)
            if held is None:
                continue
            by_records = key in self._record_offload
            if by_records:  # the records time this engine's offload: their sum replaces the links' seconds
                held = replace(held, offload=self._record_offload[key], offload_method="measured")
                self._record_offload[key] = 0.0
            attribution = attribute_window(held, self._fetch_inside(key[0]), self._offload_inside(key[0]))
            if attribution.fetch_overflow > 0 and waited < FETCH_CARRY_WINDOWS:
                self._fetch_carry[key] = (attribution.fetch_overflow, waited + 1)
                attribution = replace(attribution, fetch_overflow=0.0)
            if attribution.offload_overflow > 0 and offload_waited < FETCH_CARRY_WINDOWS and not by_records:
                self._offload_carry[key] = (attribution.offload_overflow, offload_waited + 1)
                attribution = replace(attribution, offload_overflow=0.0)
            if attribution.idle_overflow > 0 and idle_waited < FETCH_CARRY_WINDOWS:
                self._idle_carry[key] = (attribution.idle_overflow, idle_waited + 1)
                attribution = replace(attribution, idle_overflow=0.0)
            self._out.add_attribution(m.TTFT_ATTRIBUTED, key, attribution, "aggregate")
            window.fetch += attribution.seconds("fetch")
            window.ttft += attribution.ttft
        for mix in models.mix.values():
            mix.close_window()
        # fetch and offload of an engine whose first request has not finished yet (no TTFT series to put them
        # against): carried until it has one
        for key in (has_fetch | set(offload_method)) - seen:
            self._carry(self._fetch_carry, key, fetch[key], "fetch_overflow")
            self._carry(self._offload_carry, key, offload[key], "offload_overflow")
        return window

    def _records_for(self, key: Key) -> float | None:
        """Records with GPU samples that came for this engine since its last window; None: not waited for."""
        if key in self._idle_records:
            n = self._idle_records[key]
            self._idle_records[key] = 0
            return float(n)
        return 0.0 if key not in self._silent and self._expect_records() else None

    def _hold(self, key: Key, totals: WindowTotals, counts: _Counts, now: float) -> WindowTotals | None:
        """This window's totals with those held before it, or None while its TTFTs are still ahead of their
        queue or prefill observations (held for HOLD_WINDOWS windows and PHASE_HOLD_SECONDS at most, whichever
        ends later) or of their records (likewise, RECORD_HOLD_SECONDS)."""
        windows, since = 0, now
        if key in self._held:
            before, before_counts, windows, since = self._held.pop(key)
            totals, counts = _joined(before, totals), before_counts + counts
        waited = now - since
        if ((counts.phases_ahead() and (windows + 1 < HOLD_WINDOWS or waited < PHASE_HOLD_SECONDS))
                or (counts.records_ahead() and (windows + 1 < HOLD_WINDOWS or waited < RECORD_HOLD_SECONDS))):
            self._held[key] = (totals, counts, windows + 1, since)
            return None
        if counts.records == 0 and key not in self._idle_records:
            self._silent.add(key)  # waited in vain: this engine sends no records (with GPU samples)
        if counts.records is not None and counts.records > counts.ttft:
            # records ahead of their TTFTs (a span exported before the scrape that shows its first token):
            # they count for the window that brings those TTFTs, which would otherwise wait for them in vain
            self._idle_records[key] = self._idle_records.get(key, 0) + int(counts.records - counts.ttft)
        return totals

    def _carry(self, carry: dict[Key, tuple[float, int]], key: Key, seconds: float, error: str,
               waited: int | None = None) -> None:
        held, already = carry.pop(key, (0.0, 0))
        waited = already if waited is None else waited
        if waited < FETCH_CARRY_WINDOWS:
            if held + seconds > 0:
                carry[key] = (held + seconds, waited + 1)
        else:
            self._out.counters[(m.ATTRIBUTION_ERROR, (*key, "aggregate", error))] += held + seconds


@dataclass(frozen=True, slots=True)
class _Counts:
    """Requests observed in a span of windows: TTFTs, queue and prefill times, and per-request records
    with GPU samples (None: not reported / not tracked)."""

    ttft: float
    queue: float | None
    prefill: float | None
    records: float | None = None

    def __add__(self, other: _Counts) -> _Counts:
        return _Counts(self.ttft + other.ttft, _add(self.queue, other.queue), _add(self.prefill, other.prefill),
                       _add(self.records, other.records))

    def phases_ahead(self) -> bool:
        """Some TTFT has no queue or prefill time yet (its request has not finished)."""
        return any(n is not None and self.ttft > n for n in (self.queue, self.prefill))

    def records_ahead(self) -> bool:
        """Some TTFT has no per-request record yet (its span has not come: its GPU idle is not known)."""
        return self.records is not None and self.ttft > self.records


def _add(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else a + b


def _joined(a: WindowTotals, b: WindowTotals) -> WindowTotals:
    method: Method = "estimated" if "estimated" in (a.offload_method, b.offload_method) else "measured"
    return WindowTotals(a.ttft + b.ttft, _add(a.queue, b.queue), _add(a.prefill, b.prefill), _add(a.fetch, b.fetch),
                        _add(a.offload, b.offload), method, _add(a.prefill_idle, b.prefill_idle))
