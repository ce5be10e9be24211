"""The demo's figures: what the agent measured in its two experiments, next to the engine's truth.

Everything a figure says comes from the agent's side — its per-request JSONL lines (TTFT and the split)
and its /metrics exposition (the fitted cost model, transfer bytes) — except the run's wall time, which
the load driver (the client) measured, as a benchmark client would. The truth is carried beside it so
the report can say how far apart the two are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kvscope.agent.core.records import COMPONENTS
from kvscope.agent.tools.reference.scenarios import LoadResult, SweepRow
from kvscope.agent.tools.reference.truth import RequestTruth
from kvscope.agent.tools.selftest.checks import engine_samples, measured_figures, shares, truth_figures
from kvscope.agent.tools.selftest.harness import RunCapture


def truth_split(t: RequestTruth) -> dict[str, float]:
    """One request's truth, in seconds per component."""
    return t.components()


def agent_split(line: dict[str, Any]) -> dict[str, float]:
    """One JSONL line's components, in seconds (a component the agent did not attribute is 0)."""
    parts = line.get("components", {})
    return {c: float((parts.get(c) or {}).get("seconds") or 0.0) for c in COMPONENTS}


def _lines(run: RunCapture) -> dict[str, dict[str, Any]]:
    return {str(line["request_id"]): line for line in run.requests}


def _gauge(run: RunCapture, name: str, tier: str | None = None) -> float:
    return next((value for metric, labels, value in engine_samples(run.exposition)
                 if metric == name and (tier is None or labels.get("tier") == tier)), math.nan)


@dataclass(frozen=True, slots=True)
class LengthPoint:
    """One prompt length of the sweep: recomputed, sent cold (the fill) and warm (KV from G4)."""

    tokens: int
    recompute_s: float  # TTFT as the agent saw it, on the engine without a cache
    cold_s: float  # the first send to the engine with G4: compute, and storing its KV down to G4
    warm_s: float  # the second send: KV fetched from G4
    speedup: float  # recompute_s / warm_s
    reused_tokens: int
    fetch_bandwidth: float  # reused bytes / the agent's fetch seconds for the warm request (B/s)
    breakeven_bandwidth: float  # below this, fetching the reused prefix costs more than recomputing it (B/s)
    split: dict[str, dict[str, float]]  # recompute / cold / warm (agent) and warm_truth: seconds per component


@dataclass(frozen=True, slots=True)
class Sweep:
    points: list[LengthPoint]
    bytes_per_token: int
    cost_a: float  # the agent's fitted prefill cost model (the cache run's)
    cost_b: float
    latency: float  # the agent's per-fetch latency of G4 (0 until it has enough fetches to fit one)
    confident: bool

    @property
    def headline(self) -> LengthPoint:
        return self.points[-1]


def sweep_figures(recompute_run: RunCapture, cache_run: RunCapture, recomputed: list[RequestTruth],
                  rows: list[SweepRow]) -> Sweep:
    before, after = _lines(recompute_run), _lines(cache_run)
    per_token = cache_run.config.geometry.bytes_per_token
    a = _gauge(cache_run, "kvscope_prefill_cost_linear_seconds_per_token")
    b = _gauge(cache_run, "kvscope_prefill_cost_quadratic_seconds_per_token_squared")
    latency = _gauge(cache_run, "kvscope_tier_fetch_latency_seconds", "G4")
    latency = 0.0 if math.isnan(latency) else latency
    points = []
    for truth, row in zip(recomputed, rows, strict=True):
        base, cold, warm = before[truth.request_id], after[row.cold.request_id], after[row.warm.request_id]
        reused = int(warm.get("cached_tokens") or 0)
        fetch = agent_split(warm)["fetch"]
        recompute_cost = a * reused + b * reused * reused - latency  # as kvscope_fetch_breakeven_bandwidth
        points.append(LengthPoint(
            row.prompt_tokens, float(base["ttft"]), float(cold["ttft"]), float(warm["ttft"]),
            float(base["ttft"]) / float(warm["ttft"]), reused,
            reused * per_token / fetch if fetch > 0 else math.nan,
            reused * per_token / recompute_cost if recompute_cost > 0 else math.inf,
            {"recompute": agent_split(base), "cold": agent_split(cold), "warm": agent_split(warm),
             "warm_truth": truth_split(row.warm)}))
    confident = _gauge(cache_run, "kvscope_prefill_cost_confident") == 1.0
    return Sweep(points, per_token, a, b, latency, confident)


@dataclass(frozen=True, slots=True)
class Throughput:
    requests: int
    prompts: int
    concurrency: int
    prompt_tokens: int
    cache_seconds: float
    recompute_seconds: float
    reused_share: float  # of the prompt tokens, in the cache run
    mean_ttft_s: dict[str, float]  # cache / recompute, as the agent saw it
    split_pct: dict[str, dict[str, float]]  # agent / truth shares of the cache run's TTFT
    prefill_saved_s: dict[str, float] = field(default_factory=dict)  # agent / truth

    @property
    def cache_rps(self) -> float:
        return self.requests / self.cache_seconds

    @property
    def recompute_rps(self) -> float:
        return self.requests / self.recompute_seconds

    @property
    def speedup(self) -> float:
        return self.cache_rps / self.recompute_rps


def throughput_figures(cache_run: RunCapture, recompute_run: RunCapture, cache: LoadResult,
                       recompute: LoadResult, prompts: int, concurrency: int) -> Throughput:
    t, m = truth_figures(cache_run), measured_figures(cache_run)
    rm = measured_figures(recompute_run)
    return Throughput(cache.requests, prompts, concurrency, cache.truths[0].prompt_tokens if cache.truths else 0,
                      cache.seconds, recompute.seconds, cache.reused_share,
                      {"cache": m.ttft_sum / m.ttft_count, "recompute": rm.ttft_sum / rm.ttft_count},
                      {"agent": shares(m.components), "truth": shares(t.components)},
                      {"agent": m.prefill_saved, "truth": t.prefill_saved})
