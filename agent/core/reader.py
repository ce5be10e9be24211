"""How an analysis reads the store: one consistent snapshot per window, deltas that know resets, labels by name.

An analysis names the metrics it reads when it makes its StoreReader. Each `window()` takes one snapshot
of all of them under one hold of the store's lock (store.Store.snapshot), and gives each exported series
as a Point: its value, and how much it grew since the reader's previous window.

What the deltas know that a subtraction does not:
- The store's counter totals never go down while it holds a series (it absorbs the sources' resets and
  wraps). A series it forgot and made again (store.py: omitted for `stale_after` collections) is a new
  series with a new `born`: its growth starts afresh, never as the difference to the old one.
- A series the reader sees for the first time, or made again, is `is_new`: its growth is its whole value
  (right for totals that must add up to the store's), and a rate should count it as 0 instead.
- A series held but not exported for a while (its source omitted it) keeps its previous value here, as
  the store keeps its total, so its growth when it comes back is what it grew meanwhile.
The reader's memory follows the store's: it keeps a previous value exactly as long as the store holds the
series, so it has no forgetting rule of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from kvscope.agent.core.readings import LabelValues
from kvscope.agent.core.store import HeldSeries, Store

__all__ = ["Labels", "Point", "StoreReader", "Window"]


class Labels(Mapping[str, str]):
    """A series' label values, addressed by the metric's label names (`labels["src"]`)."""

    __slots__ = ("_index", "key")

    def __init__(self, index: Mapping[str, int], key: LabelValues) -> None:
        self._index, self.key = index, key  # key: the values in the metric's label order, as the store keys them

    def __getitem__(self, name: str) -> str:
        return self.key[self._index[name]]

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{name}={self[name]!r}" for name in self) + "}"


@dataclass(frozen=True, slots=True)
class Point:
    """One exported series in one window."""

    labels: Labels
    value: float  # a gauge's value, a counter's total, a histogram's count
    growth: float  # since the reader's previous window (a new series: its whole value)
    sum: float = 0.0  # a histogram's sum of observations
    sum_growth: float = 0.0
    is_new: bool = False  # first seen by this reader, or made again by the store

    @property
    def rate_growth(self) -> float:
        """Growth as a rate counts it: 0 in a new series' first window (its total holds history)."""
        return 0.0 if self.is_new else self.growth


class Window:
    """What one `StoreReader.window()` saw: the exported series of each metric the reader names, and the
    value of every series the store held, exported or not (as `Store.value` gives it)."""

    def __init__(self, points: dict[str, dict[LabelValues, Point]],
                 held: dict[str, dict[LabelValues, float]] | None = None) -> None:
        self._points = points
        self._held = held or {}

    def value(self, name: str, labels: LabelValues) -> float | None:
        """A held series' value (None when the store does not hold it, or the reader does not name it)."""
        return self._held.get(name, {}).get(labels)

    def values(self, name: str) -> dict[LabelValues, float]:
        """Every exported series' value, by labels (as `Store.values` gives it)."""
        return {labels: point.value for labels, point in self._points.get(name, {}).items()}

    def series(self, name: str) -> Iterable[Point]:
        return self._points[name].values()

    def reads(self, name: str) -> bool:
        """Whether the reader that took this window names the metric."""
        return name in self._points

    def get(self, name: str, labels: LabelValues) -> Point | None:
        return self._points[name].get(labels)


class StoreReader:
    def __init__(self, store: Store, metrics: Iterable[str]) -> None:
        self._store = store
        self._names = tuple(dict.fromkeys(metrics))
        self._index: dict[str, dict[str, int]] = {}
        for name in self._names:
            spec = store.catalogue.get(name)
            if spec is None:
                raise KeyError(f"{name} is not in the catalogue: a reader can only read catalogued metrics")
            self._index[name] = {label: i for i, label in enumerate(spec.labels)}
        # (metric, labels) -> (born, value, sum) at the previous window
        self._last: dict[tuple[str, LabelValues], tuple[int, float, float]] = {}

    def window(self) -> Window:
        """One snapshot of every named metric, with each series' growth since the previous call."""
        snapshot = self._store.snapshot(self._names)
        last, kept = self._last, {}
        points: dict[str, dict[LabelValues, Point]] = {}
        values: dict[str, dict[LabelValues, float]] = {}
        for name, held in snapshot.items():
            index, out, named = self._index[name], {}, {}
            for series in held:
                key = (name, series.labels)
                kept[key] = (series.born, series.value, series.hist_sum)
                named[series.labels] = series.value
                if series.exported:
                    out[series.labels] = _point(index, series, last.get(key))
            points[name], values[name] = out, named
        self._last = kept
        return Window(points, values)

    def __len__(self) -> int:
        """Series whose previous values the reader keeps (the store holds each of them)."""
        return len(self._last)


def _point(index: Mapping[str, int], series: HeldSeries, before: tuple[int, float, float] | None) -> Point:
    labels = Labels(index, series.labels)
    if before is None or before[0] != series.born:
        return Point(labels, series.value, series.value, series.hist_sum, series.hist_sum, is_new=True)
    # a total never goes down while held; a gauge may, and its growth is then 0
    return Point(labels, series.value, max(0.0, series.value - before[1]), series.hist_sum,
                 series.hist_sum - before[2])
