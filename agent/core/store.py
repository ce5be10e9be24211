"""The store: the current value of every series the agent knows, with counter-reset-safe totals.

Series are keyed by metric name and label values. For counters the store keeps its own monotonic
total: a source counter that goes backwards (an engine restart, a re-created device) is a reset and
its new value counts from zero; a counter of known width that goes backwards is a wrap. Either way
no delta is ever negative and the exported total never decreases while the series is held.

A value no counter can have (negative, NaN, infinite, at or above its wrap modulus; for a histogram a
negative or non-finite count or a non-finite sum), or one that would take a total past what a float
holds, is rejected before it touches the series and counted in `kvscope_store_invalid_values_total`:
the series is left out of that collection, as if the source had not reported it, and continues from
its last valid value.

A new series whose target, mount, device, interface or pid would take that label past its cap of distinct
values (label_caps.py) is refused and counted in `kvscope_store_capped_readings_total`; series already held
carry on.

No history is kept: the exposition reads current values, and an analysis reads the store through a
StoreReader (reader.py), which takes one consistent snapshot of the metrics it names per window and
keeps the previous values its deltas need, for as long as the store holds each series.

Each collector ("owner") owns the series it reports. Staleness follows what Prometheus does with a
series that vanishes from a target:

- A successful collection replaces the owner's exported set: a series it omits leaves the exposition
  at once. Its state stays held, so a series that comes back continues its total, until
  `stale_after` consecutive successful collections of its owner have omitted it; then it is
  forgotten, and if it comes back it starts afresh from the source's value (the exported total may
  go down once, which Prometheus reads as a counter reset).
- A failed collection (`collection_failed`) keeps the owner's series exported with their last values
  (the totals stay true; `kvscope_collector_up` says they are not fresh) until the `stale_after`-th
  consecutive failure, which takes them out of the exposition. Their state stays held, so the totals
  continue when the owner recovers. Failures neither add series nor advance the forgetting of
  omitted ones.
- Agent-internal series (`set_gauge`, `bump`) have no owner and are never dropped.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from kvscope.agent.core.catalogue import Catalogue, MetricSpec
from kvscope.agent.core.label_caps import LabelCaps
from kvscope.agent.core.readings import HistogramSample, LabelValues, Reading, Sample

SeriesKey = tuple[str, LabelValues]


@dataclass(slots=True)
class Series:
    spec: MetricSpec
    labels: LabelValues
    value: float = 0.0  # gauge value, or the monotonic total of a counter
    last_raw: float | None = None
    # histograms: monotonic cumulative bucket counts, sum and count
    bounds: tuple[float, ...] = ()
    buckets: list[float] = field(default_factory=list)
    last_raw_buckets: tuple[float, ...] = ()
    hist_sum: float = 0.0
    last_raw_sum: float = 0.0
    # which making of this series it is (store-wide, increasing): a series forgotten and made again is a new
    # one, and a reader's deltas start afresh (reader.py)
    born: int = 0


@dataclass(frozen=True, slots=True)
class HeldSeries:
    """One series as a snapshot sees it (Store.snapshot)."""

    labels: LabelValues
    value: float  # a gauge's value, a counter's total, a histogram's count
    hist_sum: float  # a histogram's sum (0 for the others)
    born: int
    exported: bool  # False: held (its total continues if it comes back), but not in the exposition


@dataclass(slots=True)
class IngestResult:
    accepted: int = 0
    rejected: int = 0  # not catalogued, or the wrong label count or kind
    invalid: int = 0  # a value the metric cannot have (a negative or non-finite counter, ...)
    resets: int = 0
    capped: dict[str, int] = field(default_factory=dict)  # label -> new series refused by its cap (label_caps.py)


@dataclass(slots=True)
class _Owner:
    reported: set[SeriesKey] = field(default_factory=set)  # its last successful collection
    # what each of its latest successful collections omitted, oldest first (at most stale_after - 1 sets)
    omitted: deque[set[SeriesKey]] = field(default_factory=deque)
    failures: int = 0  # consecutive failed collections


def _fits(spec: MetricSpec, reading: Reading) -> bool:
    return len(spec.labels) == len(reading.labels) and (
        (spec.type == "histogram") == isinstance(reading, HistogramSample)
    )


def _applied_quickly(series: Series, reading: Sample) -> bool:
    """The usual reading of a series already held, applied in a few steps: a gauge's value, or a counter
    that did not go backwards and stays a valid count. False (nothing changed) for anything else, which
    then takes the full checks below."""
    kind = series.spec.type
    if kind == "gauge":
        series.value = reading.value
        return True
    last, raw = series.last_raw, reading.value
    if kind != "counter" or last is None or not last <= raw < math.inf:  # NaN fails the comparison
        return False
    if reading.wrap_modulus is not None and not raw < reading.wrap_modulus:
        return False
    total = series.value + (raw - last)
    if not total < math.inf:
        return False
    series.value, series.last_raw = total, raw
    return True


class _Overflow(Exception):
    """The reading would take a total past the largest float: rejected like an impossible value."""


def _count(value: float) -> bool:
    """A value a cumulative count can have: finite and not negative (NaN fails both tests)."""
    return 0.0 <= value < math.inf


def _valid(spec: MetricSpec, reading: Reading) -> bool:
    if isinstance(reading, HistogramSample):
        return (_count(reading.count) and math.isfinite(reading.sum)
                and all(_count(n) for _, n in reading.buckets))
    if spec.type != "counter":
        return True  # a gauge may be negative, and NaN is a gauge value Prometheus takes
    modulus = reading.wrap_modulus
    return _count(reading.value) and (modulus is None or reading.value < modulus)


class Store:
    def __init__(self, catalogue: Catalogue, *, stale_after: int = 5, label_caps: LabelCaps | None = None) -> None:
        if stale_after < 1:
            raise ValueError(f"stale_after must be >= 1 collection, got {stale_after}")
        self.catalogue = catalogue
        self._stale_after = stale_after
        self._lock = threading.Lock()
        self._series: dict[SeriesKey, Series] = {}
        self._by_name: dict[str, dict[LabelValues, Series]] = {}  # the same series, per metric
        self._born = 0
        self._owners: dict[str, _Owner] = {}
        self._exported: set[SeriesKey] = set()
        self._caps = LabelCaps() if label_caps is None else label_caps

    # -- writing ---------------------------------------------------------------------------------

    def ingest(self, owner: str, readings: Iterable[Reading], now: float) -> IngestResult:
        """Apply one successful collection; the owner's series not in it stop being exported."""
        result = IngestResult()
        seen: set[SeriesKey] = set()
        get = self._series.get
        with self._lock:
            for reading in readings:
                key = (reading.name, reading.labels)
                series = get(key)
                if series is not None and type(reading) is Sample and _applied_quickly(series, reading):
                    seen.add(key)
                    result.accepted += 1
                    continue
                spec = self.catalogue.get(reading.name) if series is None else series.spec
                # checked before a series is made: a rejected reading must hold no memory
                if spec is None or not _fits(spec, reading):
                    result.rejected += 1
                    continue
                if not _valid(spec, reading):
                    result.invalid += 1
                    continue
                if series is None:
                    refused_by = self._caps.refusal(spec, reading.labels)
                    if refused_by is not None:
                        result.capped[refused_by] = result.capped.get(refused_by, 0) + 1
                        continue
                    series = self._make_locked(key, spec)
                try:
                    if isinstance(reading, HistogramSample):
                        result.resets += self._apply_histogram(series, reading)
                    else:
                        result.resets += self._apply_scalar(series, reading)
                except _Overflow:  # never on a new series: a first value is taken as it is
                    result.invalid += 1
                    continue
                seen.add(key)
                result.accepted += 1
            self._replace_owned_locked(owner, seen)
            if result.resets:
                self._bump_locked("kvscope_source_resets_total", (owner,), result.resets)
            if result.rejected:
                self._bump_locked("kvscope_store_rejected_readings_total", (owner,), result.rejected)
            if result.invalid:
                self._bump_locked("kvscope_store_invalid_values_total", (owner,), result.invalid)
            for label, refused in result.capped.items():
                self._bump_locked("kvscope_store_capped_readings_total", (owner, label), refused)
        return result

    def collection_failed(self, owner: str, now: float) -> None:
        """An owner's collection raised, hung or was rejected: its last values age by one collection."""
        with self._lock:
            state = self._owners.get(owner)
            if state is None:
                return
            state.failures += 1
            if state.failures == self._stale_after:
                self._exported -= state.reported

    def set_gauge(self, name: str, labels: LabelValues, value: float, now: float) -> None:
        """An agent-internal gauge (never owned by a collector, never dropped)."""
        with self._lock:
            self._set_locked(name, labels, value)

    def _set_locked(self, name: str, labels: LabelValues, value: float) -> None:
        series = self._series_for((name, labels))
        if series is None:
            raise KeyError(f"{name}{labels} is not a catalogued gauge")
        series.value = value
        self._exported.add((name, labels))

    def update_internal(self, gauges: Iterable[tuple[str, LabelValues, float]],
                        bumps: Iterable[tuple[str, LabelValues, float]], now: float) -> None:
        """Several agent-internal gauges set and counters bumped under one lock (a job's health after each
        run), then `kvscope_store_series` set to the held and exported counts."""
        with self._lock:
            for name, labels, value in gauges:
                self._set_locked(name, labels, value)
            for name, labels, by in bumps:
                self._bump_locked(name, labels, by)
            self._set_locked("kvscope_store_series", ("held",), float(len(self._series)))
            self._set_locked("kvscope_store_series", ("exported",), float(len(self._exported)))

    def bump(self, name: str, labels: LabelValues, by: float, now: float) -> None:
        """An agent-internal counter (never dropped): add `by` (>= 0) to its total."""
        with self._lock:
            self._bump_locked(name, labels, by)

    def _bump_locked(self, name: str, labels: LabelValues, by: float) -> None:
        series = self._series_for((name, labels))
        if series is None or by < 0:
            raise KeyError(f"{name}{labels} is not a catalogued counter, or {by} < 0")
        series.value += by
        self._exported.add((name, labels))

    def _replace_owned_locked(self, owner: str, seen: set[SeriesKey]) -> None:
        state = self._owners.setdefault(owner, _Owner())
        state.failures = 0
        returned = seen - state.reported
        if returned:
            for omitted in state.omitted:
                omitted -= returned
        gone = state.reported - seen
        self._exported -= gone
        self._exported |= seen
        state.reported = seen
        state.omitted.append(gone)
        if len(state.omitted) == self._stale_after:
            # omitted by stale_after consecutive successful collections: forget them, unless
            # exported all the same (an agent-internal series, or another owner reports it)
            for key in state.omitted.popleft():
                if key not in self._exported:
                    self._forget_locked(key)

    def _series_for(self, key: SeriesKey) -> Series | None:
        series = self._series.get(key)
        if series is None:
            spec = self.catalogue.get(key[0])
            if spec is None or len(spec.labels) != len(key[1]):
                return None
            series = self._make_locked(key, spec)
        return series

    def _make_locked(self, key: SeriesKey, spec: MetricSpec) -> Series:
        self._born += 1
        series = self._series[key] = Series(spec, key[1], born=self._born)
        self._caps.hold(spec, key[1])
        self._by_name.setdefault(key[0], {})[key[1]] = series
        return series

    def _forget_locked(self, key: SeriesKey) -> None:
        series = self._series.pop(key, None)
        if series is not None:
            self._caps.release(series.spec, key[1])
            group = self._by_name[key[0]]
            del group[key[1]]
            if not group:
                del self._by_name[key[0]]

    @staticmethod
    def _apply_scalar(series: Series, reading: Sample) -> int:
        raw = reading.value
        if series.spec.type != "counter":
            series.value = raw
            return 0
        last, modulus = series.last_raw, reading.wrap_modulus
        resets = 0
        if last is None:
            total = raw
        elif raw >= last:
            total = series.value + (raw - last)
        elif modulus is not None and last < modulus:  # a wrap (a last value past the modulus cannot wrap)
            total = series.value + (raw + modulus - last)
            resets = 1
        else:
            total = series.value + raw
            resets = 1
        if not total < math.inf:
            raise _Overflow
        series.value, series.last_raw = total, raw
        return resets

    @staticmethod
    def _apply_histogram(series: Series, reading: HistogramSample) -> int:
        bounds = tuple(b for b, _ in reading.buckets)
        raw = tuple(c for _, c in reading.buckets)
        resets = 0
        if bounds != series.bounds:
            # first sight, or the source changed its bucket layout: a new series from here on
            buckets, total, count = list(raw), reading.sum, reading.count
        elif reading.count < (series.last_raw or 0.0) or any(
            r < p for r, p in zip(raw, series.last_raw_buckets, strict=True)
        ):
            buckets = [b + r for b, r in zip(series.buckets, raw, strict=True)]
            total, count = series.hist_sum + reading.sum, series.value + reading.count
            resets = 1
        else:
            buckets = [b + r - p for b, r, p in zip(series.buckets, raw, series.last_raw_buckets, strict=True)]
            total = series.hist_sum + (reading.sum - series.last_raw_sum)
            count = series.value + (reading.count - (series.last_raw or 0.0))
        if not (math.isfinite(total) and count < math.inf and all(b < math.inf for b in buckets)):
            raise _Overflow
        series.bounds, series.buckets, series.hist_sum, series.value = bounds, buckets, total, count
        series.last_raw, series.last_raw_buckets, series.last_raw_sum = reading.count, raw, reading.sum
        return resets

    # -- reading ---------------------------------------------------------------------------------

    def families(self) -> Iterator[tuple[MetricSpec, list[Series]]]:
        """Exported series grouped by metric, in catalogue order. Holds the lock while iterating."""
        with self._lock:
            by_name: dict[str, list[Series]] = {}
            for key in self._exported:
                by_name.setdefault(key[0], []).append(self._series[key])
            for spec in self.catalogue:
                group = by_name.get(spec.name)
                if group:
                    group.sort(key=lambda s: s.labels)
                    yield spec, group

    def value(self, name: str, labels: LabelValues) -> float | None:
        """Current value of a held series, exported or not (None once it is forgotten)."""
        with self._lock:
            series = self._series.get((name, labels))
            return None if series is None else series.value

    def values(self, name: str) -> dict[LabelValues, float]:
        """Current value of every exported series of a metric."""
        with self._lock:
            exported = self._exported
            return {labels: s.value for labels, s in self._by_name.get(name, {}).items() if (name, labels) in exported}

    def snapshot(self, names: Iterable[str]) -> dict[str, list[HeldSeries]]:
        """Every held series of these metrics, exported or not, under one hold of the lock: what a reader
        sees of one window is one moment of the store (reader.py)."""
        with self._lock:
            exported = self._exported
            return {name: [HeldSeries(labels, s.value, s.hist_sum, s.born, (name, labels) in exported)
                           for labels, s in self._by_name.get(name, {}).items()] for name in names}

    def histogram(self, name: str, labels: LabelValues) -> tuple[tuple[float, ...], list[float], float, float]:
        """(bounds, cumulative counts, sum, count) of a held histogram series."""
        with self._lock:
            s = self._series[(name, labels)]
            return s.bounds, list(s.buckets), s.hist_sum, s.value

    def size(self) -> tuple[int, int]:
        """(series held in memory, series exported)."""
        with self._lock:
            return len(self._series), len(self._exported)
