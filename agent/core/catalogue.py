"""The metric catalogue: the single truth of every metric kvscope exports.

Each source module declares the specs it emits (a tuple named ``METRICS``); the catalogue gathers
them. The exporter takes help text and type from here, tests hold the exposition to it, and the
README's metric reference is generated from it (``kvscope catalogue --markdown``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

MetricType = Literal["counter", "gauge", "histogram"]

_NAME = re.compile(r"^kvscope_[a-z0-9_]+$")
# the agent's own process, under the names every Prometheus client library uses (collectors/host/process.py)
_PROCESS_NAMES = {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_virtual_memory_bytes",
                  "process_start_time_seconds", "process_open_fds", "process_max_fds"}
_LABEL = re.compile(r"^[a-z_][a-z0-9_]*$")
_UNITS = {"bytes", "seconds", "tokens", "blocks", "requests", "events", "ratio", "bytes_per_second", ""}


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str  # exposed name; counters include the `_total` suffix
    type: MetricType
    unit: str  # base unit ("bytes", "seconds", ...) or "" for plain counts
    labels: tuple[str, ...]
    help: str
    source: str  # where the number comes from, shown in the docs

    def check(self) -> None:
        if not _NAME.match(self.name) and self.name not in _PROCESS_NAMES:
            raise ValueError(f"{self.name}: metric names are kvscope_[a-z0-9_]+ (or a standard process_* name)")
        if (self.type == "counter") != self.name.endswith("_total"):
            raise ValueError(f"{self.name}: counters, and only counters, end in _total")
        if self.unit not in _UNITS:
            raise ValueError(f"{self.name}: unit {self.unit!r} is not a base unit ({sorted(_UNITS)})")
        if self.unit and self.unit not in self.name:
            raise ValueError(f"{self.name}: the name must carry its unit {self.unit!r}")
        for label in self.labels:
            if not _LABEL.match(label) or label == "le":
                raise ValueError(f"{self.name}: bad label name {label!r}")
        if not self.help.strip():
            raise ValueError(f"{self.name}: help text is required")

    @property
    def family(self) -> str:
        """The family name prometheus-client takes (counters without `_total`)."""
        return self.name[: -len("_total")] if self.type == "counter" else self.name


class Catalogue:
    """An ordered, validated set of metric specs."""

    def __init__(self, specs: Iterable[MetricSpec]) -> None:
        self._specs: dict[str, MetricSpec] = {}
        for spec in specs:
            spec.check()
            known = self._specs.get(spec.name)
            if known is not None and known != spec:
                raise ValueError(f"{spec.name} is declared twice with different definitions")
            self._specs[spec.name] = spec

    def __getitem__(self, name: str) -> MetricSpec:
        return self._specs[name]

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[MetricSpec]:
        return iter(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)

    def get(self, name: str) -> MetricSpec | None:
        return self._specs.get(name)

    def markdown(self) -> str:
        rows = ["| metric | type | unit | labels | source | help |", "|---|---|---|---|---|---|"]
        for s in self:
            labels = ", ".join(s.labels) or "–"
            rows.append(f"| `{s.name}` | {s.type} | {s.unit or '–'} | {labels} | {s.source} | {s.help} |")
        return "\n".join(rows) + "\n"


def counter(name: str, unit: str, labels: tuple[str, ...], help: str, source: str) -> MetricSpec:
    return MetricSpec(name, "counter", unit, labels, help, source)


def gauge(name: str, unit: str, labels: tuple[str, ...], help: str, source: str) -> MetricSpec:
    return MetricSpec(name, "gauge", unit, labels, help, source)


def histogram(name: str, unit: str, labels: tuple[str, ...], help: str, source: str) -> MetricSpec:
    return MetricSpec(name, "histogram", unit, labels, help, source)


def _health_metrics(kind: str) -> tuple[MetricSpec, ...]:
    """up/duration/errors/runs for every job of a kind (collector, analysis), as node_exporter reports its
    collectors."""
    labels = (kind,)
    return (
        gauge(f"kvscope_{kind}_up", "", labels,
              f"1 when the {kind}'s last run succeeded (or found no hardware), 0 when it failed or hung.", "scheduler"),
        gauge(f"kvscope_{kind}_duration_seconds", "seconds", labels, f"Wall time of the {kind}'s last run.",
              "scheduler"),
        counter(f"kvscope_{kind}_errors_total", "", labels,
                f"{kind.capitalize()} runs that raised, timed out or returned invalid readings.", "scheduler"),
        counter(f"kvscope_{kind}_runs_total", "", labels, f"{kind.capitalize()} runs started.", "scheduler"),
    )


# The agent's own health: every collector and analysis reports success, duration and errors.
AGENT_METRICS = (
    gauge("kvscope_build_info", "", ("version",), "Always 1; the kvscope version as a label.", "agent"),
    *_health_metrics("collector"),
    *_health_metrics("analysis"),
    counter("kvscope_source_resets_total", "", ("collector",),
            "Source counters that went backwards (restart, wrap) and were taken as resets.", "store"),
    gauge("kvscope_store_series", "", ("state",),
          "Series the store holds in memory (state=held, exported or remembered after vanishing) and exports "
          "(state=exported).", "store"),
    counter("kvscope_store_rejected_readings_total", "", ("collector",),
            "Readings dropped because they named no catalogued metric or had the wrong label count.",
            "store"),
    counter("kvscope_store_invalid_values_total", "", ("collector",),
            "Readings dropped because their value is impossible for the metric: a negative, NaN or infinite "
            "counter (or one at or above its wrap modulus), a histogram with such a count or a non-finite "
            "sum. The series is left out of that collection.", "store"),
    counter("kvscope_store_capped_readings_total", "", ("collector", "label"),
            "Readings of a new series refused because a label whose values nothing bounds (target, url, mount, "
            "device, interface, pid) already held its cap of distinct values (docs/cardinality.md).", "store"),
)
