"""Engine /metrics → kvscope contract, for the adapters that share it (Dynamo KVBM, Dynamo, LMCache, SGLang).

An adapter is data: a `Dialect` (the name prefixes it reads, in order of preference, and its rules) plus a
function that reads the engine's labels into kvscope's (model, dp_rank). Each `Rule` names one engine
family by its full name after the prefix (KVBM's `offload_blocks_h2d` is host→disk while
`onboard_blocks_h2d` is host→device: names are mapped whole, never parsed) and says which kvscope series
it feeds, with fixed extra labels (tiers) or extra labels resolved from one engine label (`cache_source`).

- Units: `unit` names a factor the value is multiplied by: a fixed one (`ms` → 0.001 s, `gb` → 1e9 B) or one
  the adapter knows at run time (`block_bytes`, `block_tokens`, `token_bytes`); a rule whose factor is
  unknown gives no reading (kvscope never guesses a geometry).
- Precedence, as in the vLLM adapter (collectors/engines/vllm_map.py): of the rules sharing a `group`, only those of
  the lowest `rank` with a sample for the engine instance are used; within one output series only the
  lowest `priority` present is used; equal priorities are summed (they come from one process and reset
  together).
- Shards: engines that report per tensor-parallel shard (SGLang `tp_rank`, LMCache `worker_id`) repeat the
  same tokens on every shard. A rule with `shards="lowest"` reads only the lowest shard of each (model,
  dp_rank); `shards="sum"` adds the shards up (bytes: each shard moves its own slice).
- Prefixes: SGLang has used both `sglang:` and `sglang_`; each rule reads the first prefix that has samples.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from kvscope.agent.core.readings import HistogramSample, Reading
from kvscope.collectors.engines.vllm_map import resolve_entries  # one precedence rule for every engine
from kvscope.collectors.scrape.exposition import Labels, ScanResult

FIXED_UNITS = {"": 1.0, "ms": 1e-3, "gb": 1e9}
Extra = tuple[str, ...]
# reads one engine label value: (extra label values, priority), or None to ignore the sample
Resolver = Callable[[str], tuple[Extra, int] | None]
# the engine's labels → (model, dp_rank, shard), or None when the sample is not this adapter's
BaseOf = Callable[[Labels], tuple[str, str, str] | None]


@dataclass(frozen=True, slots=True)
class Rule:
    name: str  # the engine family's name after the prefix, with `_total` where the engine writes it
    metric: str  # kvscope series it feeds
    extra: Extra = ()  # fixed extra label values; a resolver's values follow them
    label: str = ""  # engine label whose value gives more extra labels (or skips the sample) through `resolve`
    resolve: str = ""
    unit: str = ""  # factor the value is multiplied by (FIXED_UNITS or a run-time factor)
    shards: Literal["lowest", "sum"] = "lowest"
    priority: int = 0
    group: str = ""
    rank: int = 0


@dataclass(frozen=True, slots=True)
class HistogramRule:
    name: str  # family name after the prefix (samples `_bucket`, `_sum`, `_count`)
    metric: str
    extra: Extra = ()
    unit: str = ""  # scales bucket edges and the sum
    shards: Literal["lowest", "sum"] = "lowest"
    label: str = ""  # engine label whose value gives more extra labels (or skips the sample) through `resolve`
    resolve: str = ""


@dataclass(frozen=True, slots=True)
class Dialect:
    prefixes: tuple[str, ...]  # in order of preference
    counters: tuple[Rule, ...] = ()
    gauges: tuple[Rule, ...] = ()
    histograms: tuple[HistogramRule, ...] = ()

    def wanted(self) -> frozenset[str]:
        """Every exposed sample name the dialect reads (the scanner skips the rest)."""
        names: set[str] = set()
        for prefix in self.prefixes:
            names |= {prefix + r.name for r in (*self.counters, *self.gauges)}
            for h in self.histograms:
                names |= {f"{prefix}{h.name}_{part}" for part in ("bucket", "sum", "count")}
        return frozenset(names)


@dataclass
class Normalised:
    readings: list[Reading] = field(default_factory=list)
    dropped: int = 0  # samples the contract cannot take (non-finite counters, broken histograms)


Entry = tuple[tuple[str, ...], str, int, str, tuple[str, ...], int, float]


def _shard_key(shard: str) -> tuple[int, str]:
    # int() takes only short ASCII digit runs here: "²" is a digit it cannot read, 5,000 digits pass its limit
    return (int(shard), "") if shard.isascii() and shard.isdigit() and len(shard) < 19 else (1 << 62, shard)


class EngineNormaliser:
    """One dialect's rules applied to a scanned page; holds configuration and lookup tables only."""

    def __init__(self, engine: str, dialect: Dialect, base_of: BaseOf,
                 resolvers: Mapping[str, Resolver] | None = None) -> None:
        self.engine = engine
        self.dialect = dialect
        self._base_of = base_of
        self._resolvers = dict(resolvers or {})
        self._wanted = dialect.wanted()

    def _samples(self, page: ScanResult, name: str) -> list[tuple[Labels, float]]:
        for prefix in self.dialect.prefixes:
            rows = page.samples.get(prefix + name)
            if rows:
                return rows
        return []

    def normalise(self, page: ScanResult, factors: Mapping[str, float | None] | None = None) -> Normalised:
        out = Normalised()
        units = {**FIXED_UNITS, **(factors or {})}
        lowest = self._lowest_shards(page)
        entries: list[Entry] = []
        for rule in (*self.dialect.counters, *self.dialect.gauges):
            factor = units.get(rule.unit)
            if factor is None:
                continue
            resolver = self._resolvers[rule.resolve] if rule.resolve else None
            counter = rule.metric.endswith("_total")
            for labels, value in self._samples(page, rule.name):
                base = self._base_of(labels)
                if base is None or (rule.shards == "lowest" and lowest.get(base[:2]) != base[2]):
                    continue
                if math.isnan(value) or (counter and math.isinf(value)):
                    out.dropped += 1
                    continue
                extra, priority = rule.extra, rule.priority
                if resolver is not None:
                    resolved = resolver(labels.get(rule.label, ""))
                    if resolved is None:
                        continue
                    extra, priority = (*extra, *resolved[0]), max(priority, resolved[1])
                key = (self.engine, base[0], base[1])
                entries.append((key, rule.group, rule.rank, rule.metric, (*key, *extra), priority, value * factor))
        out.readings.extend(resolve_entries(entries))
        for hist in self.dialect.histograms:
            factor = units.get(hist.unit)
            if factor is not None:
                out.readings.extend(self._histogram(page, hist, factor, lowest, out))
        return out

    def _lowest_shards(self, page: ScanResult) -> dict[tuple[str, str], str]:
        """The lowest shard seen per (model, dp_rank) over every sample this dialect reads."""
        lowest: dict[tuple[str, str], str] = {}
        for name in self._wanted:
            for labels, _ in page.samples.get(name, ()):
                base = self._base_of(labels)
                if base is not None:
                    known = lowest.get(base[:2])
                    if known is None or _shard_key(base[2]) < _shard_key(known):
                        lowest[base[:2]] = base[2]
        return lowest

    def _histogram(self, page: ScanResult, hist: HistogramRule, factor: float,
                   lowest: Mapping[tuple[str, str], str], out: Normalised) -> list[Reading]:
        resolver = self._resolvers[hist.resolve] if hist.resolve else None

        def series(part: str) -> dict[tuple[str, ...], list[tuple[Labels, float]]]:
            """Samples by (engine, model, dp_rank, shard, *resolved extra labels)."""
            grouped: dict[tuple[str, ...], list[tuple[Labels, float]]] = {}
            for labels, value in self._samples(page, f"{hist.name}_{part}"):
                base = self._base_of(labels)
                if base is None or (hist.shards == "lowest" and lowest.get(base[:2]) != base[2]):
                    continue
                resolved = resolver(labels.get(hist.label, "")) if resolver is not None else ((), 0)
                if resolved is not None:
                    key = (self.engine, base[0], base[1], base[2], *resolved[0])
                    grouped.setdefault(key, []).append((labels, value))
            return grouped

        sums = {k: sum(v for _, v in rows) for k, rows in series("sum").items()}
        counts = {k: sum(v for _, v in rows) for k, rows in series("count").items()}
        merged: dict[tuple[str, ...], dict[float, float]] = {}
        totals: dict[tuple[str, ...], list[float]] = {}
        for key, rows in series("bucket").items():
            buckets: dict[float, float] = {}
            for labels, value in rows:
                try:
                    edge = float(labels["le"]) * factor
                except (KeyError, ValueError):
                    edge = math.nan
                buckets[edge] = buckets.get(edge, 0.0) + value
            target = (*key[:3], *hist.extra, *key[4:])
            into = merged.setdefault(target, {})
            if into and set(into) != set(buckets):  # shards summed must share their edges
                out.dropped += 1
                continue
            for edge, n in buckets.items():
                into[edge] = into.get(edge, 0.0) + n
            acc = totals.setdefault(target, [0.0, 0.0])
            acc[0] += sums.get(key, math.nan) * factor
            acc[1] += counts.get(key, math.nan)
        readings: list[Reading] = []
        for target, buckets in merged.items():
            reading = histogram_reading(hist.metric, target, sorted(buckets.items()), *totals[target])
            if reading is None:
                out.dropped += 1
            else:
                readings.append(reading)
        return readings


def histogram_reading(metric: str, labels: tuple[str, ...], buckets: list[tuple[float, float]], total: float,
                      count: float) -> HistogramSample | None:
    """A cumulative histogram the contract can take, or None (no +Inf, decreasing counts, NaN, count ≠ +Inf)."""
    edges = [b for b, _ in buckets]
    cumulative = [n for _, n in buckets]
    if (not buckets or not math.isfinite(total) or edges[-1] != math.inf
            or any(not a < b for a, b in itertools.pairwise(edges))
            or any(not a <= b for a, b in itertools.pairwise(cumulative))
            or not all(math.isfinite(n) for n in cumulative) or count != cumulative[-1]):
        return None
    return HistogramSample(metric, labels, tuple(buckets), total, count)


def page_model(page: ScanResult, label: str = "model_name") -> str:
    """The one model the page's samples name in `label`, or "" when they name none or several: for engines whose
    collectors label some series by rank or backend only, so that those take the target's model."""
    models = {labels.get(label, "") for rows in page.samples.values() for labels, _ in rows} - {""}
    return next(iter(models)) if len(models) == 1 else ""
