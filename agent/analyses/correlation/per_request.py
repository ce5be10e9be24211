"""Per-request attribution: each record the sources left in the buffer, split and handed to the sinks.

The prefill cost model is refitted first, so this window's requests use this window's fit; the tier
fetch models learn from every record that measured its fetch.
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
from kvscope.agent.core.pipeline import RequestSink
from kvscope.agent.core.records import AttributedRequest, Interval, RequestRecord


class RequestAttribution:
    def __init__(self, models: Models, outputs: Outputs, fetch_inside: Callable[[str], FetchInside],
                 fit_ttft_when_no_prefill: bool, sinks: Sequence[RequestSink]) -> None:
        self._models, self._out, self._fetch_inside = models, outputs, fetch_inside
        self._fit_ttft = fit_ttft_when_no_prefill
        self._sinks = sinks

    def step(self, records: list[RequestRecord]) -> list[tuple[list[Interval], list[Interval]]]:
        """Attributes the records; returns each one's (fetch, compute) intervals for the stall signal."""
        models, out = self._models, self._out
        touched: set[Key] = set()
        for record in records:
            key = (record.engine, record.model, record.dp_rank)
            sample = compute_sample(record, self._fetch_inside(record.engine), self._fit_ttft)
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
        for record in records:
            key = (record.engine, record.model, record.dp_rank)
            by_key[key].append(record)
            model, inside = models.model(key), self._fetch_inside(record.engine)
            estimate = estimate_fetch(record, lambda tier, moved: models.tier(key, tier).seconds(moved),  # noqa: B023
                                      lambda _tier: models.bytes_per_token(key))  # noqa: B023
            attribution = attribute_request(record, model, estimate, inside)
            out.add_attribution(m.REQUEST_ATTRIBUTED, key, attribution, "request")
            out.counters[(m.REQUESTS_ATTRIBUTED, (*key, record.source or "unknown"))] += 1
            if "fetch" in attribution.parts and record.ttft > 0:
                out.observe_share(key, attribution.seconds("fetch") / record.ttft)
            confidence = "high" if model.confident else "low"
            saved = recompute_avoided(record, attribution, model)
            if saved is not None:
                out.counters[(m.PREFILL_SAVED, (*key, confidence))] += max(0.0, saved)
                out.counters[(m.PREFILL_LOST, (*key, confidence))] += max(0.0, -saved)
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
