"""The correlation analysis' options (`[analyses.correlation]`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from kvscope.agent.analyses.correlation.paths import parse_selector
from kvscope.agent.core.tiers import Tier


@dataclass
class CorrelationOptions:
    # where an engine's KV load time sits: "queue" (async loads: vLLM OffloadingConnector) or "prefill"
    fetch_inside: Literal["queue", "prefill"] = "queue"
    # engine kind -> queue|prefill; the reference engine loads synchronously inside the step; SGLang starts a
    # request's host -> GPU load-back when the request joins a prefill batch (PrefillAdder.add_one_req ->
    # init_load_back), after it left the waiting queue, and the forward waits for it
    fetch_inside_by_engine: dict[str, str] = field(
        default_factory=lambda: {"reference": "prefill", "sglang": "prefill"})
    # where an engine's store (offload) time sits: "none" (asynchronous stores: vLLM's OffloadingConnector
    # defers them to the next step) or "prefill" (stores and evictions inside the step)
    offload_inside: Literal["prefill", "none"] = "none"
    offload_inside_by_engine: dict[str, str] = field(default_factory=lambda: {"reference": "prefill"})
    fit_window: int = 512  # pure-compute requests kept for the prefill cost fit
    fit_min_samples: int = 8
    # the prior: used as it is before any sample, its shape scaled to the samples while a fit is not trusted;
    # 0, 0 = the seeds' shape (and no model before the first sample)
    prefill_a: float = 0.0  # s/token
    prefill_b: float = 0.0  # s/token²
    fit_min_spread: float = 2.0  # longest / shortest prompt in the fit window before a and b are trusted
    fit_max_relative_error: float = 0.1  # either term's standard error, at the longest prompt, / compute(P, 0)
    fit_ttft_when_no_prefill: bool = False  # cold client records (AIPerf) count TTFT as compute
    bytes_per_token: float = 0.0  # KV bytes per token; 0 = learn from transfer bytes / hit tokens
    record_buffer: int = 65536  # request records held between windows before the oldest are dropped
    # half-life, seconds, of the engine counters' split of hits and fetch time by tier that a request's saved
    # prefill time is split by (tiermix.py)
    tier_mix_half_life: float = 600.0
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
        for engine, where in self.offload_inside_by_engine.items():
            if where not in ("prefill", "none"):
                raise ValueError(f"offload_inside_by_engine.{engine}: expected 'prefill' or 'none', got {where!r}")
        if self.fit_min_spread < 1:
            raise ValueError("fit_min_spread must be >= 1")
        if self.tier_mix_half_life <= 0:
            raise ValueError("tier_mix_half_life must be > 0")
        if self.fit_max_relative_error <= 0:
            raise ValueError("fit_max_relative_error must be > 0")
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
