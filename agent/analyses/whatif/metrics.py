"""Every metric the what-if analysis exports (its part of the catalogue)."""

from __future__ import annotations

from kvscope.agent.core.catalogue import counter, gauge, histogram
from kvscope.agent.core.contract import ENGINE_LABELS

_E = ENGINE_LABELS
_SRC = "what-if analysis"

HIT_TOKENS = "kvscope_whatif_hit_tokens_total"
CAPACITY_TOKENS = "kvscope_whatif_tier_capacity_tokens"
CAPACITY_BYTES = "kvscope_whatif_tier_capacity_bytes"
TTFT = "kvscope_whatif_ttft_seconds"
PREFILL_SAVED = "kvscope_whatif_prefill_saved_seconds_total"
PREFILL_LOST = "kvscope_whatif_prefill_lost_seconds_total"
SIMULATED = "kvscope_whatif_simulated_blocks_total"
DROPPED = "kvscope_whatif_dropped_blocks_total"
G1_HITS_SEEN = "kvscope_whatif_g1_hits_seen_ratio"
CLAMPED = "kvscope_whatif_model_clamped"

# vLLM's time_to_first_token_seconds buckets (as kvscope_ttft_seconds carries them from vLLM 0.33)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)

METRICS = (
    counter(HIT_TOKENS, "tokens", (*_E, "scenario", "tier"),
            "Prompt tokens the tier would have served at the scenario's sizes, as the model of the hierarchy counts "
            "them (sampled accesses x block tokens / reuse_sample_rate). scenario=today is the model at today's "
            "sizes: its distance from kvscope_kv_hit_tokens_total is the model's error, sampling included. "
            "Predicted served share = rate of this / rate of kvscope_kv_lookup_tokens_total.", _SRC),
    gauge(CAPACITY_TOKENS, "tokens", (*_E, "scenario", "tier"),
          "Size of the tier in the scenario, in tokens (blocks x the KV events' block_size).", _SRC),
    gauge(CAPACITY_BYTES, "bytes", (*_E, "scenario", "tier"),
          "Size of the tier in the scenario, in bytes (tokens x kv_bytes_per_token); absent without it.", _SRC),
    histogram(TTFT, "seconds", (*_E, "scenario", "confidence"),
              "Predicted time to first token of each attributed request at the scenario's sizes: its measured "
              "TTFT with compute and fetch re-estimated for where its tokens would come from; confidence is the "
              "prefill cost model's.", _SRC),
    counter(PREFILL_SAVED, "seconds", (*_E, "scenario", "confidence"),
            "Predicted prefill time the cache would save at the scenario's sizes (recompute cost minus compute "
            "and fetch), summed over requests where it is positive.", _SRC),
    counter(PREFILL_LOST, "seconds", (*_E, "scenario", "confidence"),
            "Predicted time the cache would cost at the scenario's sizes, summed over requests where fetching "
            "would be slower than recomputing.", _SRC),
    counter(SIMULATED, "blocks", _E,
            "Block accesses (G1 stores, re-announced reuses included) replayed through the models, sampled ones "
            "scaled by 1/reuse_sample_rate.", _SRC),
    counter(DROPPED, "blocks", _E,
            "Sampled block accesses lost between the KV-event collector and the analysis (it fell behind), scaled "
            "by 1/reuse_sample_rate.", _SRC),
    gauge(G1_HITS_SEEN, "ratio", _E,
          "Tokens of G1 hits the KV events showed (stores of blocks already resident: vLLM's "
          "kv_cache_report_mode=full) / the engine's G1 hit tokens. Near 1: the events carry the whole access "
          "stream; near 0: G1 hits are invisible and the predictions do not hold.", _SRC),
    gauge(CLAMPED, "", (*_E, "scenario"),
          "1 when the scenario's sizes exceed what one model holds (max_model_blocks / reuse_sample_rate "
          "blocks): reuse farther apart is not seen.", _SRC),
)
