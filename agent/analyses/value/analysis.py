"""The value analysis as the agent runs it: what each tier's GPU time saved is worth, at the margin too.

Each run it reads, through one StoreReader: the correlation analysis' saved and lost prefill seconds by tier,
its fetch bandwidths and cost model; the what-if's predicted prefill saved by scenario, its sizes per scenario
and request counts; the engine's hit tokens, transfer bytes and capacities. Totals go into a sliding window
(Rates): hourly figures are the window's growth per hour. It exports, per engine: the GPUs its prefill
occupies; the marginal GPU-seconds per hour of each tier's next and last size step (curve.py); and, when the
site configured prices, each tier's value and cost per hour, cost per prompt token against recomputing it, and
the break-even size. Without prices it exports GPU-seconds only.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable

from kvscope.agent.analyses.correlation import metrics as cm
from kvscope.agent.analyses.value import curve
from kvscope.agent.analyses.value import metrics as m
from kvscope.agent.analyses.value.options import TIERS, ValueOptions
from kvscope.agent.analyses.whatif import metrics as wm
from kvscope.agent.core import contract as c
from kvscope.agent.core.pipeline import AnalysisInputs, AnalysisSpec
from kvscope.agent.core.reader import StoreReader, Window
from kvscope.agent.core.readings import Reading, Sample
from kvscope.agent.core.store import Store
from kvscope.agent.core.streams import KV_ACCESS

log = logging.getLogger("kvscope.value")

Labels = tuple[str, ...]
COUNTERS = (cm.TIER_SAVED, cm.TIER_LOST, wm.PREFILL_SAVED, wm.PREFILL_LOST, wm.TTFT, c.KV_HIT_TOKENS,
            c.KV_TRANSFER_BYTES)
GAUGES = (wm.CAPACITY_BYTES, c.TIER_CAPACITY_BYTES, cm.TIER_BANDWIDTH, cm.TOKEN_BYTES, cm.COST_A, cm.COST_B,
          cm.BREAKEVEN_TOKENS)


class ValueAnalysis:
    def __init__(self, options: ValueOptions, store: Store, wall_clock: Callable[[], float],
                 idle: bool = False) -> None:
        self._o = options
        self._reader = StoreReader(store, [n for n in (*COUNTERS, *GAUGES) if store.catalogue.get(n) is not None])
        self._rates = curve.Rates(options.window)
        self._wall = wall_clock
        self.idle = idle  # runs once and is not scheduled again (build())

    def run(self) -> list[Reading]:
        window = self._reader.window()
        totals = {(name, labels): value for name in COUNTERS if window.reads(name)
                  for labels, value in window.values(name).items()}
        self._rates.add(self._wall(), totals)
        engines = {labels[:3] for name, labels in totals if name in (cm.TIER_SAVED, wm.PREFILL_SAVED)}
        out: list[Reading] = []
        for key in sorted(engines):
            out.append(Sample(m.ENGINE_GPUS, key, self._o.gpus_per_engine))
            out.extend(self._marginal(key, window))
            if self._o.priced:
                out.extend(self._priced(key, window))
        return out

    # -- GPU-seconds ---------------------------------------------------------------------------------------

    def _net_per_hour(self, saved: str, lost: str, key: Labels, middle: tuple[str, ...]) -> tuple[float, bool] | None:
        """GPU-seconds per hour saved less lost over the window, summed over confidence; and whether any of it
        was low-confidence."""
        total, low, seen = 0.0, False, False
        for confidence in ("high", "low"):
            for name, sign in ((saved, 1.0), (lost, -1.0)):
                rate = self._rates.per_hour((name, (*key, *middle, confidence)))
                if rate is None:
                    continue
                seen = True
                total += sign * rate * self._o.gpus_per_engine
                low = low or (confidence == "low" and rate != 0)
        return (total, low) if seen else None

    def _scenarios(self, key: Labels) -> dict[str, tuple[float, bool]]:
        """The what-if's GPU-seconds per hour saved by scenario (today's among them), and their low confidence."""
        names = {labels[3] for name, labels in self._rates.series() if name == wm.PREFILL_SAVED and labels[:3] == key}
        return {s: net for s in names if (net := self._net_per_hour(wm.PREFILL_SAVED, wm.PREFILL_LOST, key, (s,)))}

    def _marginal(self, key: Labels, window: Window) -> list[Reading]:
        scenarios = self._scenarios(key)
        if "today" not in scenarios:
            return []
        saved = {s: net for s, (net, _) in scenarios.items()}
        confidence = "low" if any(low for _, low in scenarios.values()) else "high"
        out: list[Reading] = []
        sizes = window.values(wm.CAPACITY_BYTES)
        for tier in TIERS:
            tier_sizes = {labels[3]: v for labels, v in sizes.items() if labels[:3] == key and labels[4] == tier}
            for step in curve.steps(tier, saved, tier_sizes):
                out.append(Sample(m.MARGINAL, (*key, tier, step.step, confidence), step.saved))
                if step.size_change is not None:
                    out.append(Sample(m.MARGINAL_STEP, (*key, tier, step.step), step.size_change))
        requests = sum(g for conf in ("high", "low")
                       if (g := self._rates.growth((wm.TTFT, (*key, "today", conf)))) is not None)
        out.append(Sample(m.MARGINAL_REQUESTS, key, requests))
        return out

    # -- with prices ---------------------------------------------------------------------------------------

    def _today_size(self, key: Labels, tier: str, window: Window) -> float | None:
        size = window.values(wm.CAPACITY_BYTES).get((*key, "today", tier)) if window.reads(wm.CAPACITY_BYTES) else None
        if size is None and window.reads(c.TIER_CAPACITY_BYTES):
            size = window.values(c.TIER_CAPACITY_BYTES).get((*key, tier))
        return size

    def _moved_gb_per_hour(self, key: Labels) -> dict[str, float]:
        """GB per hour on the billed links, as cost per hour, by the tier farther from G1 on each link."""
        out: dict[str, float] = defaultdict(float)
        for name, price in self._o.transfer_gb.items():
            src, _, dst = name.partition("->")
            rate = self._rates.per_hour((c.KV_TRANSFER_BYTES, (*key, src, dst)))
            if rate is not None:
                out[max(src, dst)] += rate / 1e9 * price
        return out

    def _priced(self, key: Labels, window: Window) -> list[Reading]:
        o = self._o
        out: list[Reading] = []
        transfer = self._moved_gb_per_hour(key)
        per_token = window.values(cm.TOKEN_BYTES).get(key) if window.reads(cm.TOKEN_BYTES) else None
        bandwidths = window.values(cm.TIER_BANDWIDTH) if window.reads(cm.TIER_BANDWIDTH) else {}
        saved = {s: net for s, (net, _) in self._scenarios(key).items()}
        sizes = window.values(wm.CAPACITY_BYTES) if window.reads(wm.CAPACITY_BYTES) else {}
        for tier in TIERS:
            size = self._today_size(key, tier, window)
            hourly = curve.hourly_cost(size or 0.0, o.tier_gib_month.get(tier, 0.0)) + transfer.get(tier, 0.0)
            net = self._net_per_hour(cm.TIER_SAVED, cm.TIER_LOST, key, (tier,))
            if net is not None:
                out.append(Sample(m.TIER_VALUE, (*key, tier), curve.gpu_value(net[0], o.gpu_hour)))
            if size is not None or tier in transfer:
                out.append(Sample(m.TIER_COST, (*key, tier), hourly))
            hits = self._rates.per_hour((c.KV_HIT_TOKENS, (*key, tier)))
            if hits and per_token:
                cost = curve.token_cost(per_token, bandwidths.get((*key, tier)) if tier != "G1" else None, hourly,
                                        hits, o.gpu_hour, o.gpus_per_engine)
                if cost is not None:
                    out.append(Sample(m.TOKEN_COST, (*key, tier), cost))
            points = [(sizes[(*key, s, tier)], v) for s, v in saved.items()
                      if (s == "today" or curve.scale_of(s, tier) is not None) and (*key, s, tier) in sizes]
            found = curve.breakeven(sorted(points), o.gpu_hour, o.tier_gib_month.get(tier, 0.0))
            if found is not None and tier in o.tier_gib_month:
                out.append(Sample(m.BREAKEVEN_SIZE, (*key, tier), found[0]))
                out.append(Sample(m.BREAKEVEN_BEYOND, (*key, tier), 1.0 if found[1] else 0.0))
        a, b, n = (window.values(name).get(key) if window.reads(name) else None
                   for name in (cm.COST_A, cm.COST_B, cm.BREAKEVEN_TOKENS))
        if a is not None and b is not None and n:
            out.append(Sample(m.RECOMPUTE_TOKEN_COST, key,
                              curve.recompute_token_cost(a, b, n, o.gpu_hour, o.gpus_per_engine)))
        return out


def build(options: ValueOptions, inputs: AnalysisInputs) -> ValueAnalysis:
    # Nothing to value when neither the correlation analysis (saved seconds per tier) nor a what-if with KV events
    # to replay runs (the KV access stream exists only when the what-if reads it): a wake-up every interval for
    # nothing costs an idle agent more than its scrapes (docs/scheduler.md).
    idle = (inputs.analyses is not None and "correlation" not in inputs.analyses
            and inputs.streams.get(KV_ACCESS) is None)
    analysis = ValueAnalysis(options, inputs.store, inputs.wall_clock, idle)
    if idle:
        log.info("value analysis: idle, nothing to value (it needs the correlation analysis or the what-if "
                 "analysis with [collectors.vllm_kv_events])")
    return analysis


SPEC = AnalysisSpec(
    name="value",
    description="what the cache is worth: GPU-seconds saved per tier, the marginal value of each tier's next and "
                "last size step (from the what-if), and with configured prices cost per token, value against cost "
                "and the break-even size",
    options=ValueOptions,
    factory=build,
    metrics=m.METRICS,
    enabled_by_default=True,
)
