"""State the correlation analysis' stages share: the fitted cost models per engine, and the analysis' own
output series (its monotonic counters and current gauges). The growth of store totals between windows is
the StoreReader's (agent/core/reader.py)."""

from __future__ import annotations

import bisect
import itertools
import math
from collections import defaultdict

from kvscope.agent.analyses.correlation import metrics as m
from kvscope.agent.analyses.correlation.costmodel import PrefillCostModel, TierFetchModel
from kvscope.agent.analyses.correlation.options import CorrelationOptions
from kvscope.agent.analyses.correlation.tiermix import TierMix
from kvscope.agent.core.readings import HistogramSample, LabelValues, Reading, Sample
from kvscope.agent.core.records import ERROR_KINDS, Attribution

Key = tuple[str, str, str]  # engine, model, dp_rank


class Models:
    """Per engine (engine, model, dp_rank): the prefill cost model, each tier's fetch model, the learned
    KV bytes per token, the typical reused prefix and the tier mix."""

    def __init__(self, options: CorrelationOptions) -> None:
        self._o = options
        self.prefill: dict[Key, PrefillCostModel] = {}
        self.tiers: dict[tuple[Key, str], TierFetchModel] = {}
        self.token_bytes: dict[Key, list[float]] = defaultdict(lambda: [0.0, 0.0])  # bytes, tokens
        self.reused_per_request: dict[Key, float] = {}
        self.mix: dict[Key, TierMix] = defaultdict(TierMix)  # which tiers served reuse and took fetch time
        self._mixed_at: float | None = None

    def decay_mix(self, now: float) -> None:
        """Ages every engine's tier mix by the wall time since the last window (half-life from the options)."""
        if self._mixed_at is not None and now > self._mixed_at:
            factor = 0.5 ** ((now - self._mixed_at) / self._o.tier_mix_half_life)
            for mix in self.mix.values():
                mix.decay(factor)
        self._mixed_at = now

    def model(self, key: Key) -> PrefillCostModel:
        if key not in self.prefill:
            self.prefill[key] = PrefillCostModel(self._o.fit_window, self._o.fit_min_samples,
                                                 self._o.prefill_a, self._o.prefill_b,
                                                 self._o.fit_max_relative_error, self._o.fit_min_spread)
        return self.prefill[key]

    def tier(self, key: Key, tier: str) -> TierFetchModel:
        return self.tiers.setdefault((key, tier), TierFetchModel())

    def bytes_per_token(self, key: Key) -> float | None:
        if self._o.bytes_per_token > 0:
            return self._o.bytes_per_token
        moved, tokens = self.token_bytes.get(key, (0.0, 0.0))
        return moved / tokens if moved > 0 and tokens > 0 else None


class Outputs:
    """The analysis' series: counters it keeps as monotonic totals, gauges, the fetch-share histogram."""

    def __init__(self) -> None:
        self.counters: dict[tuple[str, LabelValues], float] = defaultdict(float)
        self.gauges: dict[tuple[str, LabelValues], float] = {}
        self._share_hist: dict[Key, list[float]] = {}
        self._share_sum: dict[Key, float] = defaultdict(float)

    def add_attribution(self, name: str, key: Key, attribution: Attribution, basis: str) -> None:
        for component, part in attribution.parts.items():
            self.counters[(name, (*key, component, part.method))] += part.seconds
        for kind in ERROR_KINDS:
            amount = getattr(attribution, kind)
            error_key = (m.ATTRIBUTION_ERROR, (*key, basis, kind))
            if amount or error_key not in self.counters:  # every error series exists, at 0 until it happens
                self.counters[error_key] += amount

    def observe_share(self, key: Key, share: float) -> None:
        counts = self._share_hist.setdefault(key, [0.0] * (len(m.FETCH_SHARE_BUCKETS) + 1))
        counts[bisect.bisect_left(m.FETCH_SHARE_BUCKETS, share)] += 1  # per bucket; cumulated when read
        self._share_sum[key] += share

    def readings(self) -> list[Reading]:
        out: list[Reading] = [Sample(name, labels, value) for (name, labels), value in self.counters.items()]
        out.extend(Sample(name, labels, value) for (name, labels), value in self.gauges.items())
        bounds = (*m.FETCH_SHARE_BUCKETS, math.inf)
        for key, counts in self._share_hist.items():
            cumulative = tuple(itertools.accumulate(counts))
            out.append(HistogramSample(m.FETCH_SHARE, key, tuple(zip(bounds, cumulative, strict=True)),
                                       self._share_sum[key], cumulative[-1]))
        return out


def engine_key(labels: LabelValues) -> Key:
    """The (engine, model, dp_rank) a contract series' labels start with."""
    return (labels[0], labels[1], labels[2])
