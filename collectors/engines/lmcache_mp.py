"""LMCache's multiprocess mode (`lmcache_mp_*`): the name table beside the in-process `lmcache:` family.

In MP mode one LMCache server process serves every vLLM worker over ZMQ; its metrics are OpenTelemetry
instruments named `lmcache_mp.<name>`, exposed on Prometheus (the server's /metrics, port 9090 by default, or an
OTel collector) as `lmcache_mp_<name>[_<unit>][_total]`. Source: LMCache `lmcache/v1/mp_observability/METRICS.md`
(the table of OTel and Prometheus names). L1 is the MP server's CPU memory (G2); L2 its storage adapters, each
named by `l2_name` (`fs`, `nixl_store`, `mooncake_store`, ...), placed by `l2_tiers`.

- `lookup_requested_tokens_total` / `lookup_hit_tokens_total` (L1 and L2 together, by `model_name` and
  `cache_salt`) → `kvscope_connector_lookup_tokens_total` / `kvscope_connector_hit_tokens_total`, and the hits
  to `kvscope_kv_hit_tokens_total{tier=hit_tier}` (the counter does not split L1 from L2);
- `l2_prefetch_lookup_objects_chunks_total` / `l2_prefetch_hit_chunks_total` → the connector's chunk lookups
  and hits in L2 (`l2_tier`: LMCache does not label them by adapter);
- `l0_l1_store_throughput` / `l0_l1_load_throughput` (GB/s per request) → bandwidth G1 → G2 / G2 → G1;
  `l2_store_throughput` / `l2_load_throughput{l2_name}` → G2 → L2 / L2 → G2 (submit to completion, queueing
  included, as LMCache says). METRICS.md spells the unit suffix `_GBs` in one table and `_GB_per_second`
  in another; both are read;
- `l1_memory_usage_bytes` → `kvscope_tier_used_bytes{tier="G2"}`, `l2_usage_bytes{l2_name}` → the L2's tier;
- `l1_chunk_lifetime_seconds`, `l1_chunk_idle_before_evict_seconds`, `l1_chunk_reuse_gap_seconds` (G2) and
  `l0_block_*` (vLLM's GPU blocks, G1) → kvscope_kv_block_lifetime_seconds, _idle_before_evict_seconds,
  _reuse_gap_seconds (sampled chunks, 1 % by default).
Series without `model_name` take the page's one model. `cache_salt` (a tenant) is summed over; per tenant with
`tenants_top_n`: label_tenants.py.
"""

from __future__ import annotations

from kvscope.agent.core import contract as c
from kvscope.collectors.engines.contract_map import Dialect, HistogramRule, Rule

PREFIX = "lmcache_mp_"
# LMCache's L2 adapter (`l2_name`) → tier; names not here are unattributed unless configured
DEFAULT_L2_TIERS: dict[str, str] = {"fs": "G3", "nixl_store": "G4", "mooncake_store": "G4"}
L2 = "l2"  # resolver name: l2_name → (tier,)
L2_LOAD = "l2_load"  # resolver name: l2_name → (tier, "G2"), the link of a load from that L2
GBS_SUFFIXES = ("GBs", "GB_per_second")  # both spellings of METRICS.md


def mp_dialect(hit_tier: str, l2_tier: str) -> Dialect:
    counters = (
        Rule("lookup_requested_tokens_total", c.CONNECTOR_LOOKUP_TOKENS),
        Rule("lookup_hit_tokens_total", c.CONNECTOR_HIT_TOKENS),
        Rule("lookup_hit_tokens_total", c.KV_HIT_TOKENS, (hit_tier,)),
        Rule("l2_prefetch_lookup_objects_chunks_total", c.CONNECTOR_TIER_LOOKUP_BLOCKS, (l2_tier,)),
        Rule("l2_prefetch_hit_chunks_total", c.CONNECTOR_TIER_HIT_BLOCKS, (l2_tier,)),
    )
    gauges = (
        Rule("l1_memory_usage_bytes", c.TIER_USED_BYTES, ("G2",)),
        Rule("l2_usage_bytes", c.TIER_USED_BYTES, label="l2_name", resolve=L2),
    )
    histograms = [
        HistogramRule("l1_chunk_lifetime_seconds", c.KV_LIFETIME_SECONDS, ("G2",)),
        HistogramRule("l1_chunk_idle_before_evict_seconds", c.KV_IDLE_BEFORE_EVICT_SECONDS, ("G2",)),
        HistogramRule("l1_chunk_reuse_gap_seconds", c.KV_REUSE_GAP_SECONDS, ("G2",)),
        HistogramRule("l0_block_lifetime_seconds", c.KV_LIFETIME_SECONDS, ("G1",)),
        HistogramRule("l0_block_idle_before_evict_seconds", c.KV_IDLE_BEFORE_EVICT_SECONDS, ("G1",)),
        HistogramRule("l0_block_reuse_gap_seconds", c.KV_REUSE_GAP_SECONDS, ("G1",)),
    ]
    for suffix in GBS_SUFFIXES:
        histograms += [
            HistogramRule(f"l0_l1_store_throughput_{suffix}", c.KV_TRANSFER_BANDWIDTH, ("G1", "G2"), unit="gb"),
            HistogramRule(f"l0_l1_load_throughput_{suffix}", c.KV_TRANSFER_BANDWIDTH, ("G2", "G1"), unit="gb"),
            HistogramRule(f"l2_store_throughput_{suffix}", c.KV_TRANSFER_BANDWIDTH, ("G2",), unit="gb",
                          label="l2_name", resolve=L2),
            HistogramRule(f"l2_load_throughput_{suffix}", c.KV_TRANSFER_BANDWIDTH, unit="gb", label="l2_name",
                          resolve=L2_LOAD),
        ]
    return Dialect((PREFIX,), counters, gauges, tuple(histograms))
