"""Per-request attribution: each record the sources left in the buffer, split and handed to the sinks.

The prefill cost model is refitted first, so this window's requests use this window's fit; the tier
fetch models learn from every record that measured its fetch. Where GPU samples cover a record's prefill
phase, the GPU's idle time in it (beyond fetch and offload) is taken out of its prefill, out of the cost
model's sample, and handed to the aggregate (`idle_by_key`) so that its prefill sum loses it too.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

from kvscope.agent.analyses.correlation import cross_layer as signals
from kvscope.agent.analyses.correlation import metrics as m
from kvscope.agent.analyses.correlation.attribution import (
    FetchInside,
    attribute_request,
    compute_sample,
    estimate_fetch,
)
from kvscope.agent.analyses.correlation.counterfactuals import (
    recompute_avoided,
    ttft_without_cache,
    typical_reused_tokens,
)
from kvscope.agent.analyses.correlation.state import Key, Models, Outputs
from kvscope.agent.core.pipeline import GpuIntervals, RequestSink
from kvscope.agent.core.records import AttributedRequest, Attribution, Interval, RequestRecord


class RequestAttribution:
    def __init__(self, models: Models, outputs: Outputs, fetch_inside: Callable[[str], FetchInside],
                 fit_ttft_when_no_prefill: bool, sinks: Sequence[RequestSink],
                 gpus: GpuIntervals | None = None, wall_clock: Callable[[], float] = lambda: 0.0) -> None:
        self._models, self._out, self._fetch_inside = models, outputs, fetch_inside
        self._now = wall_clock
        self._fit_ttft = fit_ttft_when_no_prefill
        self._sinks = sinks
        self._gpus = gpus
        # per engine key: GPU idle seconds in attributed prefill phases beyond their fetch and offload, and
        # the records that came where GPUs are sampled, since the aggregate last took them (take_idle)
        self.idle_by_key: dict[Key, float] = defaultdict(float)
        self.idle_records: dict[Key, int] = defaultdict(int)
        self.offload_by_key: dict[Key, float] = defaultdict(float)  # those records' measured offload

    def _prefill_idle(self, records: list[RequestRecord]) -> list[float | None]:
        """Each record's GPU idle seconds in its prefill phase (first token at arrival + TTFT); None: unknown."""
        if self._gpus is None or not any(r.prefill is not None for r in records):
            return [None] * len(records)
        samples = [self._gpus.recent_samples(gpu) for gpu in self._gpus.gpus()]
        out: list[float | None] = []
        for r in records:
            end = r.arrival + r.ttft
            covered = r.prefill is not None and any(s and s[0][0] <= end - r.prefill for s in samples)
            out.append(signals.idle_seconds(samples, (end - r.prefill, end))
                       if covered and r.prefill is not None else None)
        return out

    def _split_by_tier(self, key: Key, record: RequestRecord, attribution: Attribution, saved: float,
                       confidence: str) -> None:
        """The request's saved seconds wait in its engine's tier mix for the hits that served them (tiermix.py)."""
        fetch = attribution.seconds("fetch")
        self._models.mix[key].add_request(float(record.cached_tokens or 0), saved + fetch, fetch, confidence,
                                          self._now())

    def settle_tiers(self) -> None:
        """Counts the saved seconds by tier of every request whose hits the engine counters now hold (or that
        waited long enough); what no counter placed is `unattributed`."""
        now = self._now()
        for key, mix in self._models.mix.items():
            for confidence, split in mix.settle(now):
                for tier, seconds in split.items():
                    self._out.counters[(m.TIER_SAVED, (*key, tier, confidence))] += max(0.0, seconds)
                    self._out.counters[(m.TIER_LOST, (*key, tier, confidence))] += max(0.0, -seconds)

    def step(self, records: list[RequestRecord]) -> list[tuple[list[Interval], list[Interval]]]:
        """Attributes the records; returns each one's (fetch, compute) intervals for the stall signal."""
        models, out = self._models, self._out
        touched: set[Key] = set()
        idle = self._prefill_idle(records)
        for record, prefill_idle in zip(records, idle, strict=True):
            key = (record.engine, record.model, record.dp_rank)
            sample = compute_sample(record, self._fetch_inside(record.engine), self._fit_ttft, prefill_idle)
            if sample is not None:
                models.model(key).add(*sample)
                touched.add(key)
            for fetch in record.fetches:
                if fetch.bytes is not None and fetch.seconds is not None:
                    models.tier(key, fetch.tier).add_fetch(fetch.bytes, fetch.seconds)
        for key in touched:
            models.model(key).refit()
        for tier_model in models.tiers.values():
            tier_model.refit()
        results: list[AttributedRequest] = []
        intervals = []
        by_key: dict[Key, list[RequestRecord]] = defaultdict(list)
        for record, prefill_idle in zip(records, idle, strict=True):
            key = (record.engine, record.model, record.dp_rank)
            by_key[key].append(record)
            model, inside = models.model(key), self._fetch_inside(record.engine)
            estimate = estimate_fetch(record, lambda tier, moved: models.tier(key, tier).seconds(moved),  # noqa: B023
                                      lambda _tier: models.bytes_per_token(key))  # noqa: B023
            attribution = attribute_request(record, model, estimate, inside, prefill_idle)
            if self._gpus is not None:  # every record that came, its GPU idle known or not: the
                # aggregate holds a window until as many records as TTFTs have come, and a record whose
                # prefill no GPU sample covers (the sampler started after it, or was descheduled) still came
                self.idle_records[key] += 1
                if record.offload_seconds is not None:
                    self.offload_by_key[key] += record.offload_seconds
            if prefill_idle is not None:
                self.idle_by_key[key] += attribution.prefill_idle
            out.add_attribution(m.REQUEST_ATTRIBUTED, key, attribution, "request")
            out.counters[(m.REQUESTS_ATTRIBUTED, (*key, record.source or "unknown"))] += 1
            if "fetch" in attribution.parts and record.ttft > 0:
                out.observe_share(key, attribution.seconds("fetch") / record.ttft)
            confidence = "high" if model.confident else "low"
            saved = recompute_avoided(record, attribution, model)
            if saved is not None:
                out.counters[(m.PREFILL_SAVED, (*key, confidence))] += max(0.0, saved)
                out.counters[(m.PREFILL_LOST, (*key, confidence))] += max(0.0, -saved)
                self._split_by_tier(key, record, attribution, saved, confidence)
            without = ttft_without_cache(record, attribution, model)
            if without is not None:
                out.counters[(m.COUNTERFACTUAL_TTFT, (*key, "with", confidence))] += record.ttft
                out.counters[(m.COUNTERFACTUAL_TTFT, (*key, "without", confidence))] += without
            intervals.append(signals.phase_intervals(record, attribution, inside))
            results.append(AttributedRequest(record, attribution, saved, without,
                                             confidence if saved is not None or without is not None else ""))
        for key, group in by_key.items():
            typical = typical_reused_tokens(group)
            if typical is not None:
                out.gauges[(m.BREAKEVEN_TOKENS, key)] = typical
        if results:
            for sink in self._sinks:
                sink.write(results)
        return intervals
