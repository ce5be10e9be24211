"""Caps on the labels whose values no configuration bounds: how many distinct values the store holds at once.

A scrape target list, the mounts of a node, its block devices and NICs, the processes on a GPU: each grows
with what the host or the configuration holds, and every new value multiplies the series of every metric
that carries it. The store admits a new series only while each capped label it carries stays within its cap
(values already held are always admitted); a reading refused for it is counted in
`kvscope_store_capped_readings_total{collector, label}` and the rest of the collection goes on. A value is
released when the last series carrying it is forgotten, so a cap is on what is held now, not on history.

The caps are far above any configuration in the cardinality budget (docs/cardinality.md): reaching one
means something unplanned (a target list generated per request, a container runtime's overlay mounts, a
node with hundreds of virtual NICs) and the counter says which label to look at.
"""

from __future__ import annotations

from collections import Counter

from kvscope.agent.core.catalogue import MetricSpec
from kvscope.agent.core.readings import LabelValues

# label name -> most distinct values held at once, over every metric carrying it
DEFAULT_CAPS: dict[str, int] = {
    "target": 64,     # scraped engine pages (an operator's list, or what discovery found)
    "url": 64,        # discovered engines
    "mount": 64,      # shared-FS client mounts
    "device": 128,    # block devices and RDMA devices
    "interface": 128, # NICs, virtual ones included
    "pid": 256,       # processes holding GPU memory
}


class LabelCaps:
    def __init__(self, caps: dict[str, int] | None = None) -> None:
        self._caps = DEFAULT_CAPS if caps is None else caps
        self._positions: dict[str, tuple[tuple[int, str], ...]] = {}
        self._held: dict[str, Counter[str]] = {label: Counter() for label in self._caps}

    def _capped(self, spec: MetricSpec) -> tuple[tuple[int, str], ...]:
        positions = self._positions.get(spec.name)
        if positions is None:
            positions = self._positions[spec.name] = tuple(
                (i, label) for i, label in enumerate(spec.labels) if label in self._caps)
        return positions

    def refusal(self, spec: MetricSpec, labels: LabelValues) -> str | None:
        """The capped label a new series with `labels` would take past its cap, or None to admit it."""
        for i, label in self._capped(spec):
            held = self._held[label]
            if labels[i] not in held and len(held) >= self._caps[label]:
                return label
        return None

    def hold(self, spec: MetricSpec, labels: LabelValues) -> None:
        for i, label in self._capped(spec):
            self._held[label][labels[i]] += 1

    def release(self, spec: MetricSpec, labels: LabelValues) -> None:
        for i, label in self._capped(spec):
            held = self._held[label]
            held[labels[i]] -= 1
            if held[labels[i]] <= 0:
                del held[labels[i]]
