"""The figures `kvscope analyze` reports, as plain data (build.py fills them, render.py and charts.py show them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class LengthBin:
    low: int  # prompt tokens, inclusive
    high: int  # exclusive
    requests: int
    ttft_mean: float
    ttft_p50: float
    ttft_p90: float
    cold: int
    cold_ttft_mean: float | None
    warm: int
    warm_ttft_mean: float | None


@dataclass(frozen=True, slots=True)
class Split:
    source: str  # "recording" (per request) or "server metrics" (histogram sums)
    requests: float
    ttft: float  # seconds, summed
    components: dict[str, float]  # seconds, summed
    methods: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Counterfactuals:
    """What the agent's cost model says the cache changed, over the recorded requests that reused tokens."""

    requests: int  # recorded requests with a counterfactual
    prefill_saved: float  # seconds, net (negative: the cache cost time)
    ttft_with: float  # seconds, summed over the requests with a TTFT-without-cache
    ttft_without: float
    confidence: str  # high, low or mixed (the cost model fell back to its prior for some or all of them)
    low_confidence_requests: int

    @property
    def speedup(self) -> float:
        return self.ttft_without / self.ttft_with if self.ttft_with else float("nan")


@dataclass(frozen=True, slots=True)
class Comparison:
    baseline_dir: str
    baseline_rps: float
    baseline_ttft_mean: float
    rps_speedup: float  # this run's RPS / the baseline's
    ttft_speedup: float  # the baseline's mean TTFT / this run's
    duration_speedup: float
    by_length: list[tuple[int, int, float]]  # (low, high, baseline mean TTFT / this run's) for bins in both
    warnings: list[str] = field(default_factory=list)  # where the two runs are not the same workload


@dataclass
class Report:
    directory: str
    requests: int
    skipped: int  # records not counted (warm-up, cancelled, failed, no TTFT)
    duration_s: float
    rps: float
    ttft_mean: float
    ttft_p50: float
    ttft_p90: float
    prompt_tokens: int
    cached_tokens: int
    bins: list[LengthBin]
    start_ns: int = 0  # the run's time window: first request start, last request end (client clock)
    end_ns: int = 0
    aiperf: dict[str, float] = field(default_factory=dict)  # AIPerf's own aggregates, where present
    server_source: str = ""  # the server-metrics file the server-side figures come from
    hits: dict[str, float] = field(default_factory=dict)  # tier -> hit tokens over the run
    lookup_tokens: float | None = None
    computed_tokens: float | None = None
    links: dict[str, dict[str, float]] = field(default_factory=dict)  # "G4->G2" -> bytes, seconds, bytes/s
    server_split: Split | None = None
    split: Split | None = None
    recording_kept: int = 0  # recorded requests inside the run's time window
    recording_total: int = 0
    counterfactuals: Counterfactuals | None = None
    per_request: list[dict[str, Any]] = field(default_factory=list)  # from the recording
    timeline: list[tuple[float, dict[str, float]]] = field(default_factory=list)  # s from 1st request, bytes
    scatter: list[tuple[int, float, float]] = field(default_factory=list)  # prompt tokens, TTFT s, cached share
    baseline: Comparison | None = None
    notes: list[str] = field(default_factory=list)
    # what the cache was worth (value.py): net GPU-seconds saved per hour by tier, and each tier's size steps
    saved_per_hour: dict[str, float] = field(default_factory=dict)
    marginal: list[dict[str, Any]] = field(default_factory=list)
