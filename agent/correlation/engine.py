"""The correlation engine as the agent runs it: a collector that reads the store and request records.

Each `collect()` is one window: the growth of the engine series since the previous call (TTFT, queue
and prefill histogram sums, onboard transfer seconds and bytes) is attributed, the per-request records
the receivers left in the shared `RecordBuffer` are attributed one by one, the cost model is refitted,
and the cross-layer signals are evaluated. It returns readings of its own catalogued metrics only
(metrics.py); with no inputs it returns nothing. Per-request results also go to a JSONL file if set.

What it needs from the agent, through `CollectorContext.extras`: `store` (the agent's Store), the
`request_records` RecordBuffer (created here if no receiver made it first) and, for fetch stall,
`gpu_intervals` (an object with `gpus()` and `recent_samples(gpu)`, like the NVML collector).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from kvscope.agent import contract
from kvscope.agent.correlation import metrics as m
from kvscope.agent.correlation import signals
from kvscope.agent.correlation.attribution import (
    Attribution,
    FetchInside,
    WindowTotals,
    attribute_request,
    attribute_window,
    compute_sample,
    estimate_fetch,
)
from kvscope.agent.correlation.costmodel import PrefillCostModel, TierFetchModel
from kvscope.agent.correlation.counterfactuals import (
    breakeven_bandwidth,
    recompute_avoided,
    ttft_without_cache,
    typical_reused_tokens,
)
from kvscope.agent.correlation.output import JsonlWriter, request_line
from kvscope.agent.correlation.paths import parse_selector
from kvscope.agent.correlation.records import Interval, RecordBuffer, RequestRecord, shared_buffer
from kvscope.agent.readings import HistogramSample, LabelValues, Reading, Sample
from kvscope.agent.store import Store
from kvscope.agent.tiers import Tier, link
from kvscope.collectors.base import CollectorContext, CollectorSpec

Key = tuple[str, str, str]  # engine, model, dp_rank
# Queue and prefill time are observed when a request finishes, its fetch while it runs: a fetch that does
# not fit this window's phase is carried into the next windows (until its request finishes) for at most
# this many windows before it counts as fetch_overflow.
FETCH_CARRY_WINDOWS = 60
BELOW_G1 = (Tier.G2.value, Tier.G3.value, Tier.G4.value, Tier.UNATTRIBUTED.value)


class GpuIntervals(Protocol):
    def gpus(self) -> dict[str, str]: ...
    def recent_samples(self, gpu: str) -> list[tuple[float, float, float]]: ...


@dataclass
class CorrelationOptions:
    # where an engine's KV load time sits: "queue" (async loads: vLLM OffloadingConnector) or "prefill"
    fetch_inside: Literal["queue", "prefill"] = "queue"
    # engine kind -> queue|prefill; the reference engine loads synchronously inside the step
    fetch_inside_by_engine: dict[str, str] = field(default_factory=lambda: {"reference": "prefill"})
    fit_window: int = 512  # pure-compute requests kept for the prefill cost fit
    fit_min_samples: int = 8
    prefill_a: float = 0.0  # prior a (s/token) used until the first fit; 0 = none
    prefill_b: float = 0.0  # prior b (s/token²)
    fit_ttft_when_no_prefill: bool = False  # cold client records (AIPerf) count TTFT as compute
    bytes_per_token: float = 0.0  # KV bytes per token; 0 = learn from transfer bytes / hit tokens
    requests_jsonl: str = ""  # per-request attribution output; "" = off
    record_buffer: int = 65536  # records held between windows before the oldest are dropped
    stall_settle_seconds: float = 30.0  # wait for late records before counting a stretch of fetch stall
    paths: dict[str, list[str]] = field(default_factory=dict)  # tier -> store series on its path
    path_capacity_bytes_per_second: dict[str, float] = field(default_factory=dict)  # tier -> known peak
    baseline_windows: int = 60  # quiet windows kept as the noisy-neighbour baseline
    near_peak: float = 0.8
    bandwidth_drop: float = 0.2
    kv_share_fall: float = 0.25
    saturated: float = 0.9

    def validate(self, path: str) -> None:
        for engine, where in self.fetch_inside_by_engine.items():
            if where not in ("queue", "prefill"):
                raise ValueError(f"fetch_inside_by_engine.{engine}: expected 'queue' or 'prefill', got {where!r}")
        for name in ("fit_window", "fit_min_samples", "record_buffer", "baseline_windows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        for name in ("prefill_a", "prefill_b", "bytes_per_token", "stall_settle_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        for tier, selectors in self.paths.items():
            if tier not in (Tier.G2.value, Tier.G3.value, Tier.G4.value):
                raise ValueError(f"paths.{tier}: a tier below G1 (G2, G3, G4)")
            for text in selectors:
                parse_selector(text)
        for name in ("near_peak", "bandwidth_drop", "kv_share_fall", "saturated"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1]")


class _Deltas:
    """Growth of monotonic store totals between windows."""

    def __init__(self) -> None:
        self._last: dict[Any, float] = {}

    def step(self, key: Any, current: float, from_zero: bool = True) -> float:
        """Growth since the last call; at first sight the whole total (or 0 for rates: `from_zero=False`)."""
        previous = self._last.get(key)
        self._last[key] = current
        if previous is None:
            return current if from_zero else 0.0
        return max(0.0, current - previous)


@dataclass
class _Window:
    """What one window of engine series yields for the signals."""

    fetch: float = 0.0
    ttft: float = 0.0
    onboard_bytes: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    onboard_seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    tier_bytes: dict[str, float] = field(default_factory=lambda: defaultdict(float))


class CorrelationEngine:
    def __init__(self, options: CorrelationOptions, store: Store | None, records: RecordBuffer | None,
                 gpu_intervals: GpuIntervals | None, wall_clock: Callable[[], float],
                 writer: JsonlWriter | None = None, extras: dict[str, Any] | None = None) -> None:
        self._o = options
        self._extras = extras  # looked up again each window: the runtime may add the store or GPUs later
        self._store, self._records, self._gpus, self._wall = store, records, gpu_intervals, wall_clock
        self._writer = writer
        self._deltas = _Deltas()
        self._counters: dict[tuple[str, LabelValues], float] = defaultdict(float)
        self._gauges: dict[tuple[str, LabelValues], float] = {}
        self._share_hist: dict[Key, list[float]] = {}
        self._share_sum: dict[Key, float] = defaultdict(float)
        self._models: dict[Key, PrefillCostModel] = {}
        self._tiers: dict[tuple[Key, str], TierFetchModel] = {}
        self._token_bytes: dict[Key, list[float]] = defaultdict(lambda: [0.0, 0.0])  # bytes, tokens
        self._reused_per_request: dict[Key, float] = {}
        self._fetch_carry: dict[Key, tuple[float, int]] = {}  # fetch waiting for its phase, windows waited
        self._selectors = {t: [parse_selector(s) for s in sel] for t, sel in options.paths.items()}
        self._baselines: dict[str, deque[signals.PathWindow]] = defaultdict(
            lambda: deque(maxlen=options.baseline_windows))
        self._peaks: dict[str, float] = defaultdict(float)
        self._intervals: deque[tuple[list[Interval], list[Interval]]] = deque(maxlen=100_000)
        self._stall_done: float | None = None
        self._last_now: float | None = None
        self._thresholds = signals.Thresholds(options.near_peak, options.bandwidth_drop, options.kv_share_fall,
                                              options.saturated)

    # -- one window ---------------------------------------------------------------------------------

    def collect(self) -> list[Reading]:
        if self._extras is not None:
            if self._store is None and isinstance(self._extras.get("store"), Store):
                self._store = self._extras["store"]
            if self._gpus is None and hasattr(self._extras.get("gpu_intervals"), "recent_samples"):
                self._gpus = self._extras["gpu_intervals"]
        now = self._wall()
        dt = None if self._last_now is None else now - self._last_now
        self._last_now = now
        window = self._aggregate() if self._store is not None else _Window()
        if self._records is not None:
            self._per_request(self._records.drain())
            if self._records.received:
                self._counters[(m.RECORDS_DROPPED, ())] = float(self._records.dropped)
        self._breakeven()
        if self._store is not None and dt and dt > 0:
            self._paths(window, dt)
        self._stall(now)
        if self._writer is not None and self._writer.errors:
            self._counters[(m.OUTPUT_ERRORS, ())] = float(self._writer.errors)
        return self._readings()

    def _fetch_inside(self, engine: str) -> FetchInside:
        where = self._o.fetch_inside_by_engine.get(engine, self._o.fetch_inside)
        return "prefill" if where == "prefill" else "queue"

    def _model(self, key: Key) -> PrefillCostModel:
        if key not in self._models:
            self._models[key] = PrefillCostModel(self._o.fit_window, self._o.fit_min_samples,
                                                 self._o.prefill_a, self._o.prefill_b)
        return self._models[key]

    def _tier(self, key: Key, tier: str) -> TierFetchModel:
        return self._tiers.setdefault((key, tier), TierFetchModel())

    def _hist_sum(self, name: str, labels: LabelValues) -> tuple[float, float] | None:
        assert self._store is not None
        if labels not in self._store.values(name):
            return None
        _, _, total, count = self._store.histogram(name, labels)
        return self._deltas.step((name, labels, "sum"), total), self._deltas.step((name, labels, "count"), count)

    def _aggregate(self) -> _Window:
        """Per-engine attribution from histogram sums and transfer seconds (attribution.py)."""
        assert self._store is not None
        store, window = self._store, _Window()
        fetch: dict[Key, float] = defaultdict(float)
        has_fetch: set[Key] = set()
        seconds = store.values(contract.KV_TRANSFER_SECONDS)
        for labels, total in store.values(contract.KV_TRANSFER_BYTES).items():
            key, src, dst = (labels[0], labels[1], labels[2]), labels[3], labels[4]
            moved = self._deltas.step(("bytes", labels), total)
            rate_moved = self._deltas.step(("rate", labels), total, from_zero=False)
            window.tier_bytes[src] += rate_moved
            window.tier_bytes[dst] += rate_moved
            try:
                onboard = link(src, dst).is_onboard
            except ValueError:
                continue
            if onboard and dst == Tier.G1.value:  # every fetched block crosses the last hop exactly once
                self._token_bytes[key][0] += moved
            if onboard and labels in seconds:
                spent = self._deltas.step(("seconds", labels), seconds[labels])
                fetch[key] += spent
                has_fetch.add(key)
                self._tier(key, src).observe_window(moved, spent)
                window.onboard_bytes[src] += moved
                window.onboard_seconds[src] += spent
        hits = store.values(contract.KV_HIT_TOKENS)
        for labels, total in hits.items():
            if labels[3] in BELOW_G1:
                self._token_bytes[(labels[0], labels[1], labels[2])][1] += self._deltas.step(("hits", labels), total)
        for labels in store.values(contract.TTFT_SECONDS):
            key = (labels[0], labels[1], labels[2])
            ttft = self._hist_sum(contract.TTFT_SECONDS, labels)
            assert ttft is not None
            queue = self._hist_sum(contract.QUEUE_SECONDS, labels)
            prefill = self._hist_sum(contract.PREFILL_SECONDS, labels)
            carried, waited = self._fetch_carry.pop(key, (0.0, 0))
            totals = WindowTotals(ttft[0], None if queue is None else queue[0],
                                  None if prefill is None else prefill[0],
                                  fetch[key] + carried if key in has_fetch else None)
            reused = sum(self._deltas.step(("reuse", lab), v, from_zero=False) for lab, v in hits.items()
                         if lab[:3] == labels and lab[3] in BELOW_G1)
            if ttft[1] > 0:
                self._reused_per_request[key] = reused / ttft[1]
            if ttft[1] == 0 and ttft[0] == 0 and not fetch[key] and not carried:
                continue
            attribution = attribute_window(totals, self._fetch_inside(key[0]))
            if attribution.fetch_overflow > 0 and waited < FETCH_CARRY_WINDOWS:
                self._fetch_carry[key] = (attribution.fetch_overflow, waited + 1)
                attribution = replace(attribution, fetch_overflow=0.0)
            self._add_attribution(m.TTFT_ATTRIBUTED, key, attribution, "aggregate")
            window.fetch += attribution.seconds("fetch")
            window.ttft += attribution.ttft
        return window

    def _add_attribution(self, name: str, key: Key, attribution: Attribution, basis: str) -> None:
        for component, part in attribution.parts.items():
            self._counters[(name, (*key, component, part.method))] += part.seconds
        for kind, amount in (("negative_remainder", attribution.negative_remainder),
                             ("fetch_overflow", attribution.fetch_overflow),
                             ("estimate_overflow", attribution.estimate_overflow)):
            error_key = (m.ATTRIBUTION_ERROR, (*key, basis, kind))
            if amount or error_key not in self._counters:  # every error series exists, at 0 until it happens
                self._counters[error_key] += amount

    def _per_request(self, records: list[RequestRecord]) -> None:
        touched: set[Key] = set()
        for record in records:  # fit first, so this window's requests use this window's model
            key = (record.engine, record.model, record.dp_rank)
            sample = compute_sample(record, self._fetch_inside(record.engine), self._o.fit_ttft_when_no_prefill)
            if sample is not None:
                self._model(key).add(*sample)
                touched.add(key)
            for fetch in record.fetches:
                if fetch.bytes is not None and fetch.seconds is not None:
                    self._tier(key, fetch.tier).add_fetch(fetch.bytes, fetch.seconds)
        for key in touched:
            self._model(key).refit()
        for tier_model in self._tiers.values():
            tier_model.refit()
        lines = []
        by_key: dict[Key, list[RequestRecord]] = defaultdict(list)
        for record in records:
            key = (record.engine, record.model, record.dp_rank)
            by_key[key].append(record)
            model, inside = self._model(key), self._fetch_inside(record.engine)
            estimate = estimate_fetch(
                record, self._seconds_for(key), lambda _tier: self._bytes_per_token(key))  # noqa: B023
            attribution = attribute_request(record, model, estimate, inside)
            self._add_attribution(m.REQUEST_ATTRIBUTED, key, attribution, "request")
            self._counters[(m.REQUESTS_ATTRIBUTED, (*key, record.source or "unknown"))] += 1
            if "fetch" in attribution.parts and record.ttft > 0:
                self._observe_share(key, attribution.seconds("fetch") / record.ttft)
            saved = recompute_avoided(record, attribution, model)
            if saved is not None:
                self._counters[(m.PREFILL_SAVED, key)] += max(0.0, saved)
                self._counters[(m.PREFILL_LOST, key)] += max(0.0, -saved)
            without = ttft_without_cache(record, attribution, model)
            if without is not None:
                self._counters[(m.COUNTERFACTUAL_TTFT, (*key, "with"))] += record.ttft
                self._counters[(m.COUNTERFACTUAL_TTFT, (*key, "without"))] += without
            self._intervals.append(signals.phase_intervals(record, attribution, inside))
            if self._writer is not None:
                lines.append(request_line(record, attribution, saved, without))
        for key, group in by_key.items():
            typical = typical_reused_tokens(group)
            if typical is not None:
                self._gauges[(m.BREAKEVEN_TOKENS, key)] = typical
        if self._writer is not None:
            self._writer.write(lines)

    def _seconds_for(self, key: Key) -> Callable[[str, float], float | None]:
        return lambda tier, moved: self._tier(key, tier).seconds(moved)

    def _observe_share(self, key: Key, share: float) -> None:
        counts = self._share_hist.setdefault(key, [0.0] * (len(m.FETCH_SHARE_BUCKETS) + 1))
        counts[bisect.bisect_left(m.FETCH_SHARE_BUCKETS, share)] += 1  # per bucket; cumulated when read
        self._share_sum[key] += share

    def _bytes_per_token(self, key: Key) -> float | None:
        if self._o.bytes_per_token > 0:
            return self._o.bytes_per_token
        moved, tokens = self._token_bytes.get(key, (0.0, 0.0))
        return moved / tokens if moved > 0 and tokens > 0 else None

    def _breakeven(self) -> None:
        """BW*_t at the typical reused prefix: the records' median, else the engine counters' mean."""
        for key in self._reused_per_request:
            self._model(key)
        for key, model in self._models.items():
            tokens_key = (m.BREAKEVEN_TOKENS, key)
            if tokens_key not in self._gauges and self._reused_per_request.get(key):
                self._gauges[tokens_key] = self._reused_per_request[key]
            n, per_token = self._gauges.get(tokens_key), self._bytes_per_token(key)
            if per_token is not None:
                self._gauges[(m.TOKEN_BYTES, key)] = per_token
            if model.fit is not None:
                fit = model.fit
                self._gauges.update({(m.FIT_R2, key): fit.r2, (m.FIT_RMSE, key): fit.rmse,
                                     (m.FIT_SAMPLES, key): float(len(model))})
            if model.known:
                self._gauges[(m.COST_A, key)] = model.a
                self._gauges[(m.COST_B, key)] = model.b
            for (tier_key, tier), tier_model in self._tiers.items():
                if tier_key != key:
                    continue
                bandwidth = tier_model.effective_bandwidth
                if bandwidth is not None:
                    self._gauges[(m.TIER_BANDWIDTH, (*key, tier))] = bandwidth
                    self._gauges[(m.TIER_LATENCY, (*key, tier))] = tier_model.latency
                if n and per_token is not None and model.known:
                    self._gauges[(m.BREAKEVEN, (*key, tier))] = breakeven_bandwidth(
                        n, model.a, model.b, tier_model.latency, per_token)

    def _paths(self, window: _Window, dt: float) -> None:
        assert self._store is not None
        for tier, selectors in self._selectors.items():
            total = 0.0
            for selector in selectors:
                spec = self._store.catalogue.get(selector.name)
                if spec is None:
                    continue
                for labels, value in self._store.values(selector.name).items():
                    if selector.matches(spec.labels, labels):
                        total += self._deltas.step(("path", selector.name, labels), value, from_zero=False)
            seconds = window.onboard_seconds.get(tier, 0.0)
            current = signals.PathWindow(
                total / dt, window.tier_bytes.get(tier, 0.0) / dt,
                window.onboard_bytes.get(tier, 0.0) / seconds if seconds > 0 else None,
                window.fetch / window.ttft if window.ttft > 0 else None)
            self._peaks[tier] = max(self._peaks[tier], current.path_bps)
            peak = self._o.path_capacity_bytes_per_second.get(tier) or self._peaks[tier]
            verdict = signals.assess_path(current, self._baselines[tier], peak, self._thresholds)
            if not (verdict.noisy_neighbour or verdict.saturated) and current.path_bps > 0:
                self._baselines[tier].append(current)
            for name, ratio in ((m.PATH_UTILISATION, verdict.utilisation),
                                (m.BANDWIDTH_DROP, verdict.bandwidth_drop),
                                (m.NON_KV_SHARE, verdict.non_kv_share)):
                if ratio is not None:
                    self._gauges[(name, (tier,))] = ratio
            self._gauges[(m.NOISY_NEIGHBOUR, (tier,))] = float(verdict.noisy_neighbour)
            self._gauges[(m.SATURATED, (tier,))] = float(verdict.saturated)

    def _stall(self, now: float) -> None:
        """Fetch stall over [done, now − settle]: late records (spans come at request end) still count."""
        horizon = now - self._o.stall_settle_seconds
        if self._stall_done is None:
            self._stall_done = horizon
            return
        if self._gpus is None or horizon <= self._stall_done or not self._intervals:
            return
        fetching = signals.union(i for f, _ in self._intervals for i in f)
        computing = signals.union(i for _, c in self._intervals for i in c)
        fetch_only = signals.clip(signals.subtract(fetching, computing), self._stall_done, horizon)
        for gpu in self._gpus.gpus():
            self._counters[(m.FETCH_STALL, (gpu,))] += signals.stall_seconds(
                self._gpus.recent_samples(gpu), fetch_only)
        self._stall_done = horizon
        while self._intervals and max((e for _, e in self._intervals[0][0] + self._intervals[0][1]),
                                      default=horizon) <= horizon:
            self._intervals.popleft()

    def _readings(self) -> list[Reading]:
        out: list[Reading] = [Sample(name, labels, value) for (name, labels), value in self._counters.items()]
        out.extend(Sample(name, labels, value) for (name, labels), value in self._gauges.items())
        bounds = (*m.FETCH_SHARE_BUCKETS, math.inf)
        for key, counts in self._share_hist.items():
            cumulative = tuple(itertools.accumulate(counts))
            out.append(HistogramSample(m.FETCH_SHARE, key, tuple(zip(bounds, cumulative, strict=True)),
                                       self._share_sum[key], cumulative[-1]))
        return out


def build(options: CorrelationOptions, context: CollectorContext) -> CorrelationEngine:
    writer = JsonlWriter(options.requests_jsonl) if options.requests_jsonl else None
    records = shared_buffer(context.extras, options.record_buffer)
    return CorrelationEngine(options, None, records, None, context.wall_clock, writer, context.extras)


SPEC = CollectorSpec(
    name="correlation",
    description="TTFT attribution (queue/fetch/prefill/other), cost model, counterfactuals, fetch stall, "
                "noisy neighbour (reports nothing without engine series or request records)",
    options=CorrelationOptions,
    factory=build,
    metrics=m.METRICS,
    enabled_by_default=True,
)

