"""Every metric the value analysis exports (its part of the catalogue)."""

from __future__ import annotations

from kvscope.agent.core.catalogue import gauge
from kvscope.agent.core.contract import ENGINE_LABELS

_E = ENGINE_LABELS
_SRC = "value analysis"

ENGINE_GPUS = "kvscope_engine_gpus"
MARGINAL = "kvscope_tier_marginal_saved_gpu_seconds_per_hour"
MARGINAL_STEP = "kvscope_tier_marginal_step_bytes"
MARGINAL_REQUESTS = "kvscope_tier_marginal_requests"
TIER_VALUE = "kvscope_tier_value_per_hour"
TIER_COST = "kvscope_tier_cost_per_hour"
TOKEN_COST = "kvscope_tier_token_cost"
RECOMPUTE_TOKEN_COST = "kvscope_recompute_token_cost"
BREAKEVEN_SIZE = "kvscope_tier_breakeven_capacity_bytes"
BREAKEVEN_BEYOND = "kvscope_tier_breakeven_beyond_curve"

METRICS = (
    gauge(ENGINE_GPUS, "", _E,
          "GPUs one engine's prefill occupies (configured [analyses.value] gpus_per_engine): prefill seconds x this "
          "= GPU-seconds. Recording rules multiply the saved seconds by it.", _SRC),
    gauge(MARGINAL, "seconds", (*_E, "tier", "step", "confidence"),
          "GPU-seconds per hour of prefill the tier's next size step would save (step=next: the what-if's smallest "
          "scale above today's size) or its last step saves today (step=last: today's size against the largest "
          "scale below it), from the what-if's predicted prefill saved at both sizes over the last window "
          "(x gpus_per_engine). confidence is the cost model's.", _SRC),
    gauge(MARGINAL_STEP, "bytes", (*_E, "tier", "step"),
          "Size of that step: the bytes it adds (next) or removes (last).", _SRC),
    gauge(MARGINAL_REQUESTS, "requests", _E,
          "Requests the marginal values rest on: predicted at today's sizes in the window.", _SRC),
    gauge(TIER_VALUE, "", (*_E, "tier"),
          "With prices: the GPU time the tier saved over the last window, per hour, at the configured GPU-hour "
          "price (saved − lost GPU-seconds / 3600 x gpu_hour).", _SRC),
    gauge(TIER_COST, "", (*_E, "tier"),
          "With prices: the tier's cost per hour, today's size x its GiB-month price / 730, plus the GB moved per "
          "hour on its billed links x their price. A shared tier's is its whole cost, seen by each engine.", _SRC),
    gauge(TOKEN_COST, "", (*_E, "tier"),
          "With prices: what serving one prompt token from the tier costs: its fetch (bytes per token / the "
          "tier's fetch bandwidth, as GPU time) plus its cost per hour over the tokens it served per hour.", _SRC),
    gauge(RECOMPUTE_TOKEN_COST, "", _E,
          "With prices: what recomputing one token of the typical reused prefix n costs: compute(n, 0) / n of GPU "
          "time (kvscope_fetch_breakeven_prefix_tokens is n).", _SRC),
    gauge(BREAKEVEN_SIZE, "bytes", (*_E, "tier"),
          "With prices: of the sizes the what-if explores for the tier (today and its scales), the one where the "
          "GPU time saved less the tier's cost is largest: beyond it more capacity costs more than it saves.",
          _SRC),
    gauge(BREAKEVEN_BEYOND, "", (*_E, "tier"),
          "1 when that size is the largest explored: the break-even lies beyond the what-if's curve (add a larger "
          "scale to [analyses.whatif] scales).", _SRC),
)
