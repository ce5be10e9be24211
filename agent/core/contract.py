"""The engine-facing metric contract (architecture §3): what every engine adapter normalises to.

Adapters for vLLM, the reference engine, and later SGLang, LMCache and Dynamo emit these names with
these labels, so dashboards, rules and the correlation engine read one vocabulary. `engine` is the
engine kind, `model` the served model, `dp_rank` the engine's own data-parallel index ("0" if none).
"""

from __future__ import annotations

from kvscope.agent.core.catalogue import counter, gauge, histogram

ENGINE_LABELS = ("engine", "model", "dp_rank")

KV_LOOKUP_TOKENS = "kvscope_kv_lookup_tokens_total"
KV_HIT_TOKENS = "kvscope_kv_hit_tokens_total"
KV_COMPUTED_TOKENS = "kvscope_kv_computed_tokens_total"
KV_TRANSFER_BYTES = "kvscope_kv_transfer_bytes_total"
KV_TRANSFER_SECONDS = "kvscope_kv_transfer_seconds_total"
TIER_CAPACITY_BYTES = "kvscope_tier_capacity_bytes"
TIER_CAPACITY_TOKENS = "kvscope_tier_capacity_tokens"
TIER_USED_BYTES = "kvscope_tier_used_bytes"
KV_RESIDENT_BLOCKS = "kvscope_kv_resident_blocks"
TTFT_SECONDS = "kvscope_ttft_seconds"
QUEUE_SECONDS = "kvscope_queue_time_seconds"
PREFILL_SECONDS = "kvscope_prefill_time_seconds"
REQUESTS_RUNNING = "kvscope_requests_running"
REQUESTS_WAITING = "kvscope_requests_waiting"
PROMPT_TOKENS = "kvscope_prompt_tokens_total"

_E = ENGINE_LABELS

CONTRACT_METRICS = (
    counter(KV_LOOKUP_TOKENS, "tokens", _E, "Prompt tokens looked up in the KV hierarchy.", "engine"),
    counter(KV_HIT_TOKENS, "tokens", (*_E, "tier"),
            "Prompt tokens served from that tier (G1..G4, or unattributed when the engine does not say).",
            "engine"),
    counter(KV_COMPUTED_TOKENS, "tokens", _E, "Prompt tokens recomputed by prefill.", "engine"),
    counter(PROMPT_TOKENS, "tokens", _E, "Prompt tokens of finished prefills.", "engine"),
    counter(KV_TRANSFER_BYTES, "bytes", (*_E, "src", "dst"), "KV bytes moved from tier src to tier dst.",
            "engine"),
    counter(KV_TRANSFER_SECONDS, "seconds", (*_E, "src", "dst"),
            "Time spent moving KV bytes from src to dst, where the engine reports it.", "engine"),
    gauge(TIER_CAPACITY_BYTES, "bytes", (*_E, "tier"), "KV capacity of the tier.", "engine config"),
    gauge(TIER_CAPACITY_TOKENS, "tokens", (*_E, "tier"), "KV capacity of the tier in tokens.",
          "engine config"),
    gauge(TIER_USED_BYTES, "bytes", (*_E, "tier"),
          "KV bytes resident in the tier, where a source says it: from KV events, resident blocks x the events' "
          "block_size x the configured kv_bytes_per_token (absent while any is unknown); from LMCache, its usage "
          "per backend.", "KV events, LMCache"),
    gauge(KV_RESIDENT_BLOCKS, "blocks", (*_E, "tier"), "KV blocks resident in the tier.", "KV events"),
    histogram(TTFT_SECONDS, "seconds", _E, "Time to first token (engine's definition).", "engine"),
    histogram(QUEUE_SECONDS, "seconds", _E, "Time requests waited before first being scheduled.",
              "engine"),
    histogram(PREFILL_SECONDS, "seconds", _E,
              "Time from first schedule to first token (vLLM's prefill; synchronous KV loads sit inside).",
              "engine"),
    gauge(REQUESTS_RUNNING, "requests", _E, "Requests in the running batch.", "engine"),
    gauge(REQUESTS_WAITING, "requests", _E, "Requests waiting to be scheduled.", "engine"),
)

# -- added with the Dynamo KVBM, Dynamo, LMCache and SGLang adapters (docs/engines.md) -------------

KV_TRANSFER_BLOCKS = "kvscope_kv_transfer_blocks_total"
KV_TRANSFER_TOKENS = "kvscope_kv_transfer_tokens_total"
KV_TRANSFER_FAILED_BLOCKS = "kvscope_kv_transfer_failed_blocks_total"
KV_TRANSFER_BANDWIDTH = "kvscope_kv_transfer_bandwidth_bytes_per_second"
CONNECTOR_LOOKUP_TOKENS = "kvscope_connector_lookup_tokens_total"
CONNECTOR_HIT_TOKENS = "kvscope_connector_hit_tokens_total"
ENGINE_HIT_RATIO = "kvscope_engine_hit_ratio"
TIER_USED_TOKENS = "kvscope_tier_used_tokens"
TIER_PLACEMENT_INFO = "kvscope_tier_placement_info"
KV_BLOCK_SIZE_TOKENS = "kvscope_kv_block_size_tokens"
PREEMPTIONS = "kvscope_preemptions_total"
KV_LOAD_SECONDS = "kvscope_kv_load_seconds"
KV_STORE_SECONDS = "kvscope_kv_store_seconds"
KV_CACHED_TOKENS = "kvscope_kv_cached_tokens_total"
PEER_TRANSFER_BYTES = "kvscope_kv_peer_transfer_bytes_total"
PEER_TRANSFER_SECONDS = "kvscope_kv_peer_transfer_seconds_total"
PEER_TRANSFER_FAILURES = "kvscope_kv_peer_transfer_failures_total"
KV_EVICTED_TOKENS = "kvscope_kv_evicted_tokens_total"
KV_LIFETIME_SECONDS = "kvscope_kv_block_lifetime_seconds"
KV_IDLE_BEFORE_EVICT_SECONDS = "kvscope_kv_block_idle_before_evict_seconds"
KV_REUSE_GAP_SECONDS = "kvscope_kv_block_reuse_gap_seconds"
ROUTER_PREDICTED_HIT_RATIO = "kvscope_router_predicted_hit_ratio"
CONNECTOR_TIER_LOOKUP_BLOCKS = "kvscope_connector_tier_lookup_blocks_total"
CONNECTOR_TIER_HIT_BLOCKS = "kvscope_connector_tier_hit_blocks_total"
ENGINE_UNMAPPED_VALUES = "kvscope_engine_unmapped_values_total"

ENGINE_EXTRA_METRICS = (
    counter(KV_TRANSFER_BLOCKS, "blocks", (*_E, "src", "dst"),
            "KV blocks moved from tier src to tier dst, for engines that count blocks (Dynamo KVBM).", "engine"),
    counter(KV_TRANSFER_TOKENS, "tokens", (*_E, "src", "dst"),
            "Tokens of KV moved from tier src to tier dst, for engines that count tokens (SGLang HiCache).",
            "engine"),
    counter(KV_TRANSFER_FAILED_BLOCKS, "blocks", (*_E, "src", "dst"),
            "KV blocks whose move from src to dst failed (KVBM object-store read and write failures).", "engine"),
    histogram(KV_TRANSFER_BANDWIDTH, "bytes_per_second", (*_E, "src", "dst"),
              "Bandwidth of each batch moved from src to dst as the engine observed it (SGLang HiCache prefetch "
              "and backup; its GB/s taken as 1e9 bytes per second).", "engine"),
    counter(CONNECTOR_LOOKUP_TOKENS, "tokens", _E,
            "Prompt tokens the engine asked its KV connector for (those its own G1 cache did not hold).", "engine"),
    counter(CONNECTOR_HIT_TOKENS, "tokens", _E,
            "Prompt tokens the KV connector found in its tiers, all tiers together, as the connector counts them "
            "(KVBM matched_tokens, LMCache hit tokens).", "engine"),
    gauge(ENGINE_HIT_RATIO, "ratio", (*_E, "tier", "source_metric"),
          "A hit rate exactly as the engine reports it (its own window or definition, named by source_metric); "
          "kvscope's hit rates are computed from the token counters in PromQL.", "engine"),
    gauge(TIER_USED_TOKENS, "tokens", (*_E, "tier"), "Tokens of KV resident in the tier, as the engine reports it.",
          "engine"),
    gauge(TIER_PLACEMENT_INFO, "", ("engine", "pool", "tier", "path", "mount", "fstype", "decided_by"),
          "Always 1: which tier an engine's storage pool was placed in, and why (decided_by: mount_type from the "
          "mount table, config, or default when the mount was not found).", "mount table, config"),
    gauge(KV_BLOCK_SIZE_TOKENS, "tokens", (*_E, "source"),
          "Tokens per KV block the adapter converts block counts with; source: config, or the page it learned it "
          "from.", "engine config"),
    counter(PEER_TRANSFER_BYTES, "bytes", _E,
            "KV bytes pulled from a peer engine's GPU (disaggregated prefill over NIXL); a peer is not one of "
            "this pod's tiers, so these are not links.", "engine"),
    counter(PEER_TRANSFER_SECONDS, "seconds", _E, "Time the peer KV transfers took, as the engine timed them.",
            "engine"),
    counter(PEER_TRANSFER_FAILURES, "", (*_E, "kind"),
            "Peer KV transfers (kind=transfer) or their notifications (kind=notification) that failed.", "engine"),
    counter(PREEMPTIONS, "", _E,
            "Requests preempted (vLLM) or retracted (SGLang) because KV space ran out: KV pressure.", "engine"),
    counter(KV_CACHED_TOKENS, "tokens", _E,
            "Prompt tokens a router predicted cached on the worker it chose, at routing time (Dynamo's frontend "
            "cached_tokens, equal to its router's selected cached prefix tokens in 1.6.1): a prediction from the "
            "router's index of KV events, not tokens an engine served; those are kvscope_kv_hit_tokens_total.",
            "engine"),
    histogram(KV_LOAD_SECONDS, "seconds", _E,
              "Time of each load of KV from a connector's tiers toward G1, as the connector times it (LMCache "
              "retrieve).", "engine"),
    histogram(KV_STORE_SECONDS, "seconds", _E,
              "Time of each store of KV from G1 into a connector's tiers, as the connector times it (LMCache store).",
              "engine"),
    # -- issue 26: SGLang as its pages really speak --
    counter(KV_EVICTED_TOKENS, "tokens", (*_E, "tier"),
            "KV tokens freed from the tier by eviction, as the engine counts them (SGLang evicted_tokens_total: "
            "G1 slots freed, whether HiCache backed them up to host or dropped them).", "engine"),
    counter(ENGINE_UNMAPPED_VALUES, "", ("engine", "label", "value"),
            "Scrapes whose page named a value the adapter has no tier for (label=storage_backend: an SGLang "
            "storage backend missing from its table); the tokens it names are exported as unattributed until "
            "the adapter's options map it. At most 16 values per collector, the rest as value=\"other\".",
            "engine"),
    # -- eviction and reuse as the engine measures them (vLLM --kv-cache-metrics, LMCache's multiprocess mode) --
    histogram(KV_LIFETIME_SECONDS, "seconds", (*_E, "tier"),
              "How long a KV block (an LMCache chunk) lived in the tier, from its store to its eviction, as the "
              "engine measures it on a sample of them (vLLM kv_block_lifetime_seconds with --kv-cache-metrics: G1; "
              "LMCache MP l1_chunk_lifetime G2, l0_block_lifetime G1). Blocks never evicted are not in it; the "
              "engine's bucket edges are kept.", "engine"),
    histogram(KV_IDLE_BEFORE_EVICT_SECONDS, "seconds", (*_E, "tier"),
              "How long an evicted KV block (chunk) had gone untouched before the tier evicted it, as the engine "
              "measures it (vLLM kv_block_idle_before_evict_seconds: G1; LMCache MP). Idle times short of the "
              "reuse gap: the tier evicts what would have been reused.", "engine"),
    histogram(KV_REUSE_GAP_SECONDS, "seconds", (*_E, "tier"),
              "Time between consecutive uses of the same KV block (chunk) in the tier, as the engine measures it "
              "(vLLM kv_block_reuse_gap_seconds: G1, only its most recent uses kept; LMCache MP). kvscope's own "
              "reuse distance, in blocks, is kvscope_kv_block_reuse_distance_blocks from the KV events.",
              "engine"),
    counter(CONNECTOR_TIER_LOOKUP_BLOCKS, "blocks", (*_E, "tier"),
            "KV blocks the connector looked up in that tier, in its own block unit (LMCache MP: chunks of its "
            "chunk_size tokens looked up in L2 by prefetch).", "engine"),
    counter(CONNECTOR_TIER_HIT_BLOCKS, "blocks", (*_E, "tier"),
            "KV blocks the connector found in that tier, as a prefix of what it looked up (LMCache MP: L2 prefetch "
            "hit chunks).", "engine"),
    # -- issue 26: a router's prediction beside the engine's measured hits --
    histogram(ROUTER_PREDICTED_HIT_RATIO, "ratio", _E,
              "Per routed request, the share of its prompt blocks the KV router expected the chosen worker's GPU "
              "cache to hold (Dynamo dynamo_component_router_kv_hit_rate: overlap blocks / input blocks at "
              "routing time). Set beside kvscope_kv_hit_tokens_total{tier=\"G1\"} of the engine it shows "
              "predicted hits the engine did not get; the mean is per request, the engine's share per token.",
              "router"),
)
