"""Every metric the correlation engine exports (its part of the catalogue)."""

from __future__ import annotations

from kvscope.agent.core.catalogue import counter, gauge, histogram
from kvscope.agent.core.contract import ENGINE_LABELS

_E = ENGINE_LABELS
_SRC = "correlation engine"

TTFT_ATTRIBUTED = "kvscope_ttft_attributed_seconds_total"
ATTRIBUTION_ERROR = "kvscope_ttft_attribution_error_seconds_total"
REQUEST_ATTRIBUTED = "kvscope_request_ttft_attributed_seconds_total"
REQUESTS_ATTRIBUTED = "kvscope_requests_attributed_total"
FETCH_SHARE = "kvscope_ttft_fetch_share_ratio"
PREFILL_SAVED = "kvscope_prefill_saved_seconds_total"
PREFILL_LOST = "kvscope_prefill_lost_seconds_total"
TIER_SAVED = "kvscope_tier_prefill_saved_seconds_total"
TIER_LOST = "kvscope_tier_prefill_lost_seconds_total"
COUNTERFACTUAL_TTFT = "kvscope_counterfactual_ttft_seconds_total"
COST_A = "kvscope_prefill_cost_linear_seconds_per_token"
COST_B = "kvscope_prefill_cost_quadratic_seconds_per_token_squared"
FIT_R2 = "kvscope_prefill_cost_fit_r_squared"
FIT_RMSE = "kvscope_prefill_cost_fit_rmse_seconds"
FIT_SAMPLES = "kvscope_prefill_cost_fit_requests"
COST_CONFIDENT = "kvscope_prefill_cost_confident"
COST_UNCERTAINTY = "kvscope_prefill_cost_fit_uncertainty_ratio"
COST_SPREAD = "kvscope_prefill_cost_fit_prompt_spread_ratio"
TIER_BANDWIDTH = "kvscope_tier_fetch_bandwidth_bytes_per_second"
TIER_LATENCY = "kvscope_tier_fetch_latency_seconds"
TOKEN_BYTES = "kvscope_kv_token_size_bytes"
BREAKEVEN = "kvscope_fetch_breakeven_bandwidth_bytes_per_second"
BREAKEVEN_TOKENS = "kvscope_fetch_breakeven_prefix_tokens"
FETCH_STALL = "kvscope_gpu_fetch_stall_seconds_total"
PATH_UTILISATION = "kvscope_tier_path_utilisation_ratio"
BANDWIDTH_DROP = "kvscope_tier_fetch_bandwidth_drop_ratio"
NON_KV_SHARE = "kvscope_tier_path_non_kv_share_ratio"
NOISY_NEIGHBOUR = "kvscope_tier_noisy_neighbour"
SATURATED = "kvscope_tier_saturated"
RECORDS_DROPPED = "kvscope_request_records_dropped_total"

FETCH_SHARE_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)

METRICS = (
    counter(TTFT_ATTRIBUTED, "seconds", (*_E, "component", "method"),
            "TTFT sum split into frontend, queue, fetch, offload, prefill and other from the engine's histogram "
            "sums and transfer times (offload: store time, for engines that store inside the step); method says "
            "measured, estimated or derived. Components add up to the TTFT sum plus the negative_remainder "
            "error.", _SRC),
    counter(ATTRIBUTION_ERROR, "seconds", (*_E, "basis", "kind"),
            "Attribution inconsistencies, never hidden: negative_remainder (measured parts exceed TTFT), "
            "fetch_overflow (fetch exceeds the phase containing it), estimate_overflow (estimated compute "
            "exceeds measured prefill), offload_overflow (offload exceeds what is left of the prefill phase), "
            "idle_overflow (GPU idle in prefill phases exceeds what is left of the window's prefill). "
            "basis is aggregate or request.", _SRC),
    counter(REQUEST_ATTRIBUTED, "seconds", (*_E, "component", "method"),
            "Per-request TTFT attribution (frontend, queue, fetch, offload, prefill, other) summed over "
            "attributed requests; method is measured, estimated (cost model) or derived.", _SRC),
    counter(REQUESTS_ATTRIBUTED, "requests", (*_E, "source"),
            "Per-request records attributed, by source (otlp, aiperf, reference).", _SRC),
    histogram(FETCH_SHARE, "ratio", _E, "Per request: fetch time / TTFT, for requests whose fetch is known.",
              _SRC),
    counter(PREFILL_SAVED, "seconds", (*_E, "confidence"),
            "Recompute time the cache avoided: Σ max(0, compute(prompt,0) − (prefill + fetch)) over requests "
            "that reused tokens (cost model). confidence=low: the cost model fell back to its prior's shape.",
            _SRC),
    counter(PREFILL_LOST, "seconds", (*_E, "confidence"),
            "Time the cache cost: Σ max(0, (prefill + fetch) − compute(prompt,0)) over requests where "
            "reuse was slower than recomputing. confidence as for the saved time.", _SRC),
    counter(TIER_SAVED, "seconds", (*_E, "tier", "confidence"),
            "Prefill seconds saved by the tier that served the reused tokens: each request's compute avoided "
            "(compute(prompt,0) − prefill) split by the engine's hit tokens per tier, less its fetch split by "
            "the tier reads' transfer seconds (docs/value.md); summed where positive. × the GPUs one engine "
            "spans = GPU-seconds. confidence as for the saved time.", _SRC),
    counter(TIER_LOST, "seconds", (*_E, "tier", "confidence"),
            "Prefill seconds the tier cost: the same split, summed where a request's fetch from the tier "
            "took longer than recomputing its tokens.", _SRC),
    counter(COUNTERFACTUAL_TTFT, "seconds", (*_E, "cache", "confidence"),
            "TTFT summed over requests with known reuse, as measured (cache=with) and with every prompt token "
            "recomputed (cache=without: frontend + queue + compute(prompt,0) + other). confidence as for the "
            "saved time.",
            _SRC),
    gauge(COST_A, "seconds", _E, "Prefill cost a in compute(new,ctx) = a·new + b·new·(2·ctx+new) in use: fitted, "
          "or the prior's scaled to the data (see kvscope_prefill_cost_confident).", _SRC),
    gauge(COST_B, "seconds", _E, "Prefill cost b (seconds per token pair) of the same model.", _SRC),
    gauge(FIT_R2, "", _E, "R² of the last two-coefficient prefill cost fit.", _SRC),
    gauge(FIT_RMSE, "seconds", _E, "Root-mean-square residual of the last two-coefficient prefill cost fit.", _SRC),
    gauge(FIT_SAMPLES, "requests", _E, "Pure-compute requests in the prefill cost fit's sliding window.", _SRC),
    gauge(COST_CONFIDENT, "", _E,
          "1 when the fit's a and b are pinned down (prompt lengths spread enough, small standard errors) and "
          "used; 0 when the model fell back to its prior's shape (configured, else the seeds'), scaled to the "
          "data: counterfactuals are then low-confidence.", _SRC),
    gauge(COST_UNCERTAINTY, "ratio", _E,
          "The fit's larger term standard error at the longest prompt in its window, over the estimated "
          "recompute time of that prompt (trusted up to fit_max_relative_error).", _SRC),
    gauge(COST_SPREAD, "ratio", _E,
          "Longest over shortest prompt in the fit's window (trusted from fit_min_spread).", _SRC),
    gauge(TIER_BANDWIDTH, "bytes_per_second", (*_E, "tier"),
          "Achieved fetch bandwidth of the tier: transfer bytes / transfer seconds of its onboard links over "
          "the last window that moved bytes.", _SRC),
    gauge(TIER_LATENCY, "seconds", (*_E, "tier"),
          "Per-fetch latency of the tier (intercept of seconds on bytes over measured fetches; 0 until fitted).",
          _SRC),
    gauge(TOKEN_BYTES, "bytes", _E,
          "KV bytes per token used for fetch estimates: configured, or bytes onboarded into G1 / tokens hit "
          "below G1.", _SRC),
    gauge(BREAKEVEN, "bytes_per_second", (*_E, "tier"),
          "Bandwidth at which fetching the typical reused prefix from the tier costs what recomputing it "
          "does: n·B_tok / (a·n + b·n² − L_t). Below it, reuse from that tier is slower.", _SRC),
    gauge(BREAKEVEN_TOKENS, "tokens", _E,
          "The reused-prefix length n the break-even bandwidth is computed at: the window's median reused "
          "tokens over requests that reused, else hit tokens below G1 per request from engine counters.", _SRC),
    counter(FETCH_STALL, "seconds", ("gpu",),
            "GPU idle time (NVML samples) while at least one request was fetching KV and none computing.", _SRC),
    gauge(PATH_UTILISATION, "ratio", ("tier",),
          "Traffic on the tier's path (configured disk/NIC/RDMA/FS series) / its peak (observed or configured).",
          _SRC),
    gauge(BANDWIDTH_DROP, "ratio", ("tier",),
          "1 − the tier's achieved fetch bandwidth / its baseline (median of recent quiet windows).", _SRC),
    gauge(NON_KV_SHARE, "ratio", ("tier",),
          "Share of the tier path's traffic that is not KV transfer to or from the tier.", _SRC),
    gauge(NOISY_NEIGHBOUR, "", ("tier",),
          "1 when the tier's path is near its peak, its fetch bandwidth dropped and KV's share of the path "
          "fell: something else is using the storage path.", _SRC),
    gauge(SATURATED, "", ("tier",),
          "1 when the tier's path is at its peak while the fetch share of TTFT grows.", _SRC),
    counter(RECORDS_DROPPED, "", (),
            "Per-request records dropped because the correlation engine fell behind the receivers.", _SRC),
)
