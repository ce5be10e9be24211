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
)
