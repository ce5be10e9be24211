"""KV tiers overview: is the cache hierarchy paying off, tier by tier?"""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from kvscope.dashboards.panels import (
    ENGINE,
    HOST,
    MODEL_ENGINE,
    TIER,
    PanelBuilder,
    Query,
    bargauge_panel,
    build_dashboard,
    stat_panel,
    tier_total,
    timeseries_panel,
)

UID = "kvscope-tiers"

ONBOARD = (f'kvscope:kv_transfer_bytes:rate5m{{{ENGINE}, src="G2", dst="G1"}}'
           f' or kvscope:kv_transfer_bytes:rate5m{{{ENGINE}, src="G3", dst=~"G1|G2"}}'
           f' or kvscope:kv_transfer_bytes:rate5m{{{ENGINE}, src="G4", dst=~"G1|G2|G3"}}')
OFFLOAD = (f'kvscope:kv_transfer_bytes:rate5m{{{ENGINE}, src="G1", dst=~"G2|G3|G4"}}'
           f' or kvscope:kv_transfer_bytes:rate5m{{{ENGINE}, src="G2", dst=~"G3|G4"}}'
           f' or kvscope:kv_transfer_bytes:rate5m{{{ENGINE}, src="G3", dst="G4"}}')


def _median(histogram: str) -> str:
    """p50 per tier of a histogram over every pod of the selected models, from its buckets' rate recorded by
    model (kvscope.kv_age); a tier with no observations in the window (NaN) is not drawn."""
    return (f"histogram_quantile(0.5, sum by (tier, le) (model:{histogram}_bucket:rate5m{{{MODEL_ENGINE}, {TIER}}}))"
            " >= 0")


def build() -> Dashboard:
    paying_off = [
        stat_panel("Prompt tokens served from the cache", (
            "Share of the prompt tokens looked up in the KV hierarchy that some tier served (G1 to G4 and "
            "unattributed hits), over the last 5 minutes, for the selected pods. From the engine's prefix-cache "
            "counters (kvscope_kv_hit_tokens_total / kvscope_kv_lookup_tokens_total)."), "percentunit",
            [Query(f"sum(kvscope:kv_hit_tokens:rate5m{{{ENGINE}}})"
                   f" / (sum(kvscope:kv_lookup_tokens:rate5m{{{ENGINE}}}) > 0)")]),
        stat_panel("Prefill time the cache saved", (
            "Recompute time the cache avoided over the dashboard's time range, summed over the selected pods: "
            "for each request that reused tokens, the fitted cost of computing its whole prompt minus what its "
            "prefill and fetch actually took (correlation engine, kvscope_prefill_saved_seconds_total)."), "s",
            [Query(f"sum(increase(kvscope_prefill_saved_seconds_total{{{ENGINE}}}[$__range]))")]),
        stat_panel("TTFT without the cache ÷ with it", (
            "How many times longer time to first token would have been had every prompt token been recomputed, "
            "over the time range: the correlation engine's counterfactual TTFT (cache=without) over the measured "
            "TTFT (cache=with) of the same requests (kvscope_counterfactual_ttft_seconds_total)."), "suffix:×",
            [Query(f'sum(increase(kvscope_counterfactual_ttft_seconds_total{{{ENGINE}, cache="without"}}[$__range]))'
                   f' / (sum(increase(kvscope_counterfactual_ttft_seconds_total{{{ENGINE}, cache="with"}}[$__range]))'
                   " > 0)")],
            decimals=2),
        stat_panel("Lookups per second", (
            "Prompt tokens the selected engines looked up in their KV hierarchy per second "
            "(kvscope_kv_lookup_tokens_total, from the engine's prefix-cache queries)."), "suffix: tokens/s",
            [Query(f"sum(kvscope:kv_lookup_tokens:rate5m{{{ENGINE}}})")]),
        timeseries_panel("Prefill seconds saved and lost per second", (
            "Seconds of prefill compute the cache avoided per second of wall time (above zero) and seconds "
            "that reuse cost where fetching was slower than recomputing (below zero), by model. From the "
            "correlation engine's cost model (kvscope_prefill_saved_seconds_total, "
            "kvscope_prefill_lost_seconds_total)."), "suffix: s/s",
            [Query(f"sum by (model) (rate(kvscope_prefill_saved_seconds_total{{{ENGINE}}}[$__rate_interval]))",
                   "{{model}} saved"),
             Query(f"sum by (model) (rate(kvscope_prefill_lost_seconds_total{{{ENGINE}}}[$__rate_interval]))",
                   "{{model}} lost")], span=24, negative=[1]),
    ]
    hit_rates = [
        timeseries_panel("Served share per tier", (
            "Of all prompt tokens the selected pods looked up, the share each tier served: hit tokens at the "
            "tier summed over the pods and data-parallel ranks, over lookup tokens summed the same way "
            "(recording rules kvscope:kv_hit_tokens:rate5m and kvscope:kv_lookup_tokens:rate5m, 5-minute rates). "
            "Stacked, the tiers add up to the share served from cache, at most 100 %; the rest was recomputed. "
            "'unattributed' are hits the engine did not place in a tier. One pod's shares: pick it in Pod / "
            "instance (recording rule kvscope:kv_served_share:ratio_rate5m has them per pod)."), "percentunit",
            [Query(f"sum by (tier) (kvscope:kv_hit_tokens:rate5m{{{ENGINE}, {TIER}}})"
                   f" / ignoring(tier) group_left() (sum(kvscope:kv_lookup_tokens:rate5m{{{ENGINE}}}) > 0)",
                   "{{tier}}")],
            stack=True, percent_max=True),
        timeseries_panel("Conditional hit rate per tier", (
            "Of the prompt tokens that missed every faster tier and so reached this one, the share it served, "
            "over the selected pods: hit tokens at the tier over the tokens that reached it, each summed over "
            "the pods and data-parallel ranks (recording rules kvscope:kv_hit_tokens:rate5m and "
            "kvscope:kv_tokens_reaching_tier:rate5m; per pod, kvscope:kv_conditional_hit_ratio:rate5m). A tier "
            "whose line falls while tokens still reach it is being evicted, shrunk or bypassed: "
            "KVScopeTierHitRateCollapsed fires when it falls below half its one-day average."), "percentunit",
            [Query(f'sum by (tier) (kvscope:kv_hit_tokens:rate5m{{{ENGINE}, {TIER}, tier=~"G1|G2|G3|G4"}})'
                   f" / (sum by (tier) (kvscope:kv_tokens_reaching_tier:rate5m{{{ENGINE}, {TIER}}}) > 0)",
                   "{{tier}}")],
            percent_max=True),
        timeseries_panel("Routing's predicted G1 hits against the hits the engine got", (
            "Solid: the share of each routed request's prompt blocks that the KV router expected the chosen "
            "worker's GPU cache to hold, averaged over requests (kvscope_router_predicted_hit_ratio, Dynamo's "
            "router_kv_hit_rate). Dashed: the share of prompt tokens the engines actually served from G1, and "
            "from any tier (kvscope_kv_hit_tokens_total over kvscope_kv_lookup_tokens_total, per token). Predicted "
            "well above served: the router routes on blocks the workers have evicted (or sees GPU events only "
            "while hits come from lower tiers)."), "percentunit",
            [Query("sum by (model) (rate(kvscope_router_predicted_hit_ratio_sum"
                   f'{{{HOST}, model=~"$model"}}[$__rate_interval])) / (sum by (model) '
                   "(rate(kvscope_router_predicted_hit_ratio_count"
                   f'{{{HOST}, model=~"$model"}}[$__rate_interval])) > 0)', "predicted by the router {{model}}"),
             Query(f'sum by (model) (kvscope:kv_hit_tokens:rate5m{{{ENGINE}, tier="G1"}}) / (sum by (model) '
                   f"(kvscope:kv_lookup_tokens:rate5m{{{ENGINE}}}) > 0)", "served from G1 {{model}}"),
             Query(f"sum by (model) (kvscope:kv_hit_tokens:rate5m{{{ENGINE}}}) / (sum by (model) "
                   f"(kvscope:kv_lookup_tokens:rate5m{{{ENGINE}}}) > 0)", "served from any tier {{model}}")],
            dashed=[1, 2], percent_max=True, span=24),
        timeseries_panel("Served share by tenant", (
            "Of what each tenant's requests looked up, the share a tier already held, over the selected pods. "
            "vLLM's LoRA adapters (base: no adapter), read from the KV events when the vllm_kv_events "
            "collector's tenants_top_n is set: G1, in full blocks (kvscope_tenant_kv_hit_blocks_total over "
            "kvscope_tenant_kv_lookup_blocks_total; hits need kv_cache_report_mode=full on the requests). "
            "LMCache's cache_salt on its multiprocess server, when the lmcache collector's tenants_top_n is set: "
            "L1 and L2 together, in the collector's hit_tier, in tokens (kvscope_tenant_kv_hit_tokens_total over "
            "kvscope_tenant_kv_lookup_tokens_total). SGLang's request label (tenant_label, from its "
            "x-custom-labels header): prompt tokens served per tier by cache_source, in tokens. Each pod shows its N "
            "busiest tenants, the rest as 'other', so a tenant busy on one pod may sit in another pod's 'other' "
            "(docs/vllm-kv-events.md, docs/lmcache.md, docs/sglang.md)."), "percentunit",
            [Query("sum by (tenant, tier) (rate(kvscope_tenant_kv_hit_blocks_total"
                   f"{{{ENGINE}, {TIER}}}[$__rate_interval])) / ignoring(tier) group_left() (sum by (tenant) "
                   f"(rate(kvscope_tenant_kv_lookup_blocks_total{{{ENGINE}}}[$__rate_interval])) > 0)",
                   "{{tenant}} {{tier}}"),
             Query("sum by (tenant, tier) (rate(kvscope_tenant_kv_hit_tokens_total"
                   f"{{{ENGINE}, {TIER}}}[$__rate_interval])) / ignoring(tier) group_left() (sum by (tenant) "
                   f"(rate(kvscope_tenant_kv_lookup_tokens_total{{{ENGINE}}}[$__rate_interval])) > 0)",
                   "{{tenant}} {{tier}} (tokens)")],
            percent_max=True),
    ]
    links = [
        timeseries_panel("KV bytes per link: onboard up, offload down", (
            "Bytes per second moved between tiers, per link, as the engine reports its transfers "
            "(kvscope_kv_transfer_bytes_total). Above zero: blocks moving toward the GPU (G4→G2, G3→G2, G2→G1, "
            "and direct G3/G4→G1). Below zero: blocks offloaded away from it (G1→G2, G2→G3, G2→G4, ...). "
            "From the 5-minute rates of recording rule kvscope:kv_transfer_bytes:rate5m, one point a minute."),
            "Bps",
            [Query(f"sum by (src, dst) ({ONBOARD})", "{{src}} → {{dst}}"),
             Query(f"sum by (src, dst) ({OFFLOAD})", "{{src}} → {{dst}}")], negative=[1], min_interval="1m"),
        bargauge_panel("KV bytes moved per link over the time range", (
            "Total bytes each link carried over the dashboard's time range, summed over the selected pods "
            "(increase of kvscope_kv_transfer_bytes_total)."), "bytes",
            [Query(f"sum by (src, dst) (increase(kvscope_kv_transfer_bytes_total{{{ENGINE}}}[$__range]))",
                   "{{src}} → {{dst}}", instant=True)]),
        timeseries_panel("Achieved bandwidth per link", (
            "Bytes moved over seconds spent moving them, per link (recording rule "
            "kvscope:kv_transfer_bandwidth_bytes_per_second:rate5m). Only links whose engine reports transfer "
            "time appear."), "Bps",
            [Query(f"kvscope:kv_transfer_bandwidth_bytes_per_second:rate5m{{{ENGINE}}}",
                   "{{src}} → {{dst}} {{instance}}")], log_scale=True),
        timeseries_panel("Blocks stored and removed per tier", (
            "KV blocks per second that became resident in each tier (above zero) and left it (below zero), "
            "from the engine's KV events (kvscope_kv_blocks_stored_total, kvscope_kv_blocks_removed_total). "
            "Both high and equal is churn: the tier evicts what it just stored."), "suffix: blocks/s",
            [Query(f"sum by (tier) (rate(kvscope_kv_blocks_stored_total{{{ENGINE}, {TIER}}}[$__rate_interval]))",
                   "{{tier}} stored"),
             Query(f"sum by (tier) (rate(kvscope_kv_blocks_removed_total{{{ENGINE}, {TIER}}}[$__rate_interval]))",
                   "{{tier}} removed")], negative=[1]),
        timeseries_panel("Tokens evicted per tier (engine's count)", (
            "KV tokens per second the engine freed from each tier by eviction, as the engine counts them "
            "(kvscope_kv_evicted_tokens_total; SGLang's evicted_tokens_total: G1 slots freed, whether HiCache "
            "backed them up to host or dropped them). Beside the G1 hit share, a high rate means G1 is too small "
            "for the reuse the workload has."), "suffix: tokens/s",
            [Query(f"sum by (tier) (rate(kvscope_kv_evicted_tokens_total{{{ENGINE}, {TIER}}}[$__rate_interval]))",
                   "{{tier}} evicted")]),
        timeseries_panel("Offload tiers: lookup time (p99) and space pinned by transfers", (
            "99th percentile of the time one lookup of a block (a chunk) in each offload tier took, blocking "
            "(kvscope_tier_lookup_delay_seconds, mode=sync; vLLM's tiering offload). Right axis, dashed: the "
            "largest share of a selected pod's G2 offload space pinned by stores and loads in flight "
            "(kvscope_tier_transfer_pinned_ratio, vLLM's kv_offload_cpu_cache_usage_perc). That is not how full "
            "G2 is: high and sustained, transfers are being dropped for want of room."), "s",
            [Query("histogram_quantile(0.99, sum by (tier, le) (rate(kvscope_tier_lookup_delay_seconds_bucket"
                   f'{{{ENGINE}, {TIER}, mode="sync"}}[$__rate_interval])))', "{{tier}} lookup p99"),
             Query(f"max by (tier) (kvscope_tier_transfer_pinned_ratio{{{ENGINE}, {TIER}}})", "{{tier}} pinned")],
            dashed=[1], right_axis={1: "percentunit"}, log_scale=True),
        bargauge_panel("Offload jobs that failed, per link, over the time range", (
            "Transfer jobs between tiers that failed, summed over the selected pods (increase of "
            "kvscope_kv_transfer_failed_jobs_total; vLLM's tiering offload: promotions T→G2, cascades G2→T). "
            "A failed promotion is a hit the engine recomputes; a failed cascade, a block the lower tier lacks."),
            "suffix: jobs",
            [Query(f"sum by (src, dst) (increase(kvscope_kv_transfer_failed_jobs_total{{{ENGINE}}}[$__range]))",
                   "{{src}} → {{dst}}", instant=True)]),
    ]
    residency = [
        timeseries_panel("Resident blocks per tier", (
            "KV blocks resident in each tier, summed over the selected pods, as kvscope rebuilds it from the "
            "engine's KV events (kvscope_kv_resident_blocks). The dashed line on the right axis says whether "
            "the count is exact: 1 when every selected pod's residency is exact (kvscope_kv_residency_known), "
            "0 when at least one lost event batches for good; the count is then an estimate, off by at most the "
            "blocks those batches stored and removed, until the engine clears its prefix cache or restarts. "
            "Absent for an agent that joined late without a full replay (see Agent health)."),
            "suffix: blocks",
            [Query(f"sum by (tier) (kvscope_kv_resident_blocks{{{ENGINE}, {TIER}}})", "{{tier}}"),
             Query(f"min by (tier) (kvscope_kv_residency_known{{{ENGINE}, {TIER}}})",
                   "{{tier}} exact (1) or estimate (0)")],
            dashed=[1], right_axis={1: "none"}, span=8),
        timeseries_panel("Used bytes and capacity per tier", (
            "KV bytes resident in each tier (kvscope_tier_used_bytes: resident blocks from the KV events × "
            "tokens per block × the configured kv_bytes_per_token), summed over the selected pods, against the "
            "tier's capacity as the engine's configuration gives it (kvscope_tier_capacity_bytes, dashed). The "
            "pods' own tiers (G1–G3) add up; a G4 they share is counted once per cluster (the largest capacity "
            "a pod reports), and its used bytes are what each pod stored, summed. After lost KV-event batches "
            "the used bytes are an estimate like the resident blocks (see that panel)."),
            "bytes",
            [Query(f"sum by (tier) (kvscope_tier_used_bytes{{{ENGINE}, {TIER}}})", "{{tier}} used"),
             Query(tier_total("kvscope_tier_capacity_bytes", f"{ENGINE}, {TIER}"), "{{tier}} capacity")],
            dashed=[1], span=8),
        bargauge_panel("Capacity per tier (tokens)", (
            "KV capacity of each tier in tokens as the engine reports it (kvscope_tier_capacity_tokens): the "
            "selected pods' own tiers (G1–G3) summed, a G4 they share counted once per cluster."),
            "suffix: tokens",
            [Query(tier_total("kvscope_tier_capacity_tokens", f"{ENGINE}, {TIER}"), "{{tier}}", instant=True)],
            span=8),
        timeseries_panel("How long each tier keeps blocks, as the engine measures it (p50)", (
            "Median lifetime of a block (an LMCache chunk) in each tier from its store to its eviction, its idle "
            "time from last use to eviction, and the time between two uses of it, from the engine's own sampled "
            "histograms (kvscope_kv_block_lifetime_seconds, _idle_before_evict_seconds, _reuse_gap_seconds: "
            "vLLM with --kv-cache-metrics for G1, LMCache's multiprocess mode for G1 and its L1/L2 tiers). Right "
            "axis, dashed: kvscope's own median reuse distance in each tier, in distinct "
            "blocks stored between two uses (kvscope_kv_block_reuse_distance_blocks, from the KV events). A "
            "reuse gap longer than the idle time before eviction means blocks leave G1 before they are used "
            "again. Over every pod of the selected engines and models, whichever pods are selected: the buckets' "
            "rate is recorded by model once a minute (recording group kvscope.kv_age; summing every pod's "
            "buckets at each point took 2 s at 1,000 pods)."), "s",
            [Query(_median("kvscope_kv_block_lifetime_seconds"), "{{tier}} lifetime"),
             Query(_median("kvscope_kv_block_idle_before_evict_seconds"), "{{tier}} idle before eviction"),
             Query(_median("kvscope_kv_block_reuse_gap_seconds"), "{{tier}} reuse gap"),
             Query(_median("kvscope_kv_block_reuse_distance_blocks"), "{{tier}} reuse distance (kvscope)")],
            dashed=[3], right_axis={3: "suffix: blocks"}, log_scale=True, span=12, min_interval="1m"),
    ]
    what_if = [
        bargauge_panel("What if the tiers were other sizes: served share", (
            "Share of the looked-up prompt tokens the cache would serve at each scenario's tier sizes over the time "
            "range, beside what it served (measured). The what-if analysis replays the engine's access stream from "
            "its KV events (needs kv_cache_report_mode=full) through models of the tiers at today's sizes and at "
            "each scenario's (G1x2: G1 twice as large; configured ones by name), and counts the tokens each would "
            "serve (kvscope_whatif_hit_tokens_total). Shown: the measured share scaled by each model's count over "
            "the today model's, which cancels most of the sampling error (docs/whatif.md)."), "percentunit",
            [Query(f"sum by (scenario) (increase(kvscope_whatif_hit_tokens_total{{{ENGINE}}}[$__range]))"
                   " / on() group_left() (sum(increase(kvscope_whatif_hit_tokens_total"
                   f'{{{ENGINE}, scenario="today"}}[$__range])) > 0)'
                   f" * on() group_left() (sum(increase(kvscope_kv_hit_tokens_total{{{ENGINE}}}[$__range]))"
                   f" / (sum(increase(kvscope_kv_lookup_tokens_total{{{ENGINE}}}[$__range])) > 0))",
                   "{{scenario}}", instant=True),
             Query(f"sum(increase(kvscope_kv_hit_tokens_total{{{ENGINE}}}[$__range]))"
                   f" / (sum(increase(kvscope_kv_lookup_tokens_total{{{ENGINE}}}[$__range])) > 0)",
                   "measured", instant=True)]),
        timeseries_panel("What if the tiers were other sizes: TTFT", (
            "Predicted time to first token of the attributed requests at each scenario's sizes: p50 from the "
            "predicted histogram (solid) and mean (dashed), with the correlation analysis' cost and fetch models "
            "(kvscope_whatif_ttft_seconds). Scenario today is the measured TTFT; read "
            "kvscope_prefill_cost_confident beside it: at 0 the cost model kept its prior's shape."), "s",
            [Query("histogram_quantile(0.5, sum by (scenario, le) "
                   f"(rate(kvscope_whatif_ttft_seconds_bucket{{{ENGINE}}}[$__rate_interval])))", "{{scenario}} p50"),
             Query(f"sum by (scenario) (rate(kvscope_whatif_ttft_seconds_sum{{{ENGINE}}}[$__rate_interval]))"
                   f" / sum by (scenario) (rate(kvscope_whatif_ttft_seconds_count{{{ENGINE}}}[$__rate_interval]))",
                   "{{scenario}} mean")], dashed=[1]),
    ]
    return build_dashboard(
        "kvscope / KV tiers overview", UID,
        "Is the KV-cache hierarchy paying off? Hit rates per tier, bytes per link, residency and capacity, "
        "the prefill time the cache saved, and what other tier sizes would serve.",
        ("instance", "engine", "model", "tier"),
        [("Is the cache paying off?", paying_off), ("Hit rates per tier", hit_rates),
         ("Bytes per link", links), ("Residency and capacity", residency),
         ("What if the tiers were other sizes?", what_if), ("What is each tier worth?", worth())])


def worth() -> list[PanelBuilder]:
    """What the cache is worth (docs/value.md): GPU time per tier, the marginal value of size, and with prices
    value against cost."""
    return [
        timeseries_panel("GPU time saved and lost per tier", (
            "GPU-seconds of prefill each tier saved per hour over the last hour (above zero), and lost where "
            "fetching from it was slower than recomputing (below zero), summed over the selected pods: each "
            "request's saved time split by the tier that served its reused tokens, x the GPUs an engine spans "
            "(recording rules kvscope:tier_prefill_saved_gpu_seconds_per_hour:rate1h and _lost_; "
            "kvscope_tier_prefill_saved_seconds_total). KVScopeTierSavesNothing fires for a tier that serves "
            "tokens and saves nothing for three hours."), "suffix: GPU-s/h",
            [Query(f"sum by (tier) (kvscope:tier_prefill_saved_gpu_seconds_per_hour:rate1h{{{ENGINE}, {TIER}}})",
                   "{{tier}} saved"),
             Query(f"sum by (tier) (kvscope:tier_prefill_lost_gpu_seconds_per_hour:rate1h{{{ENGINE}, {TIER}}})",
                   "{{tier}} lost")], negative=[1]),
        timeseries_panel("Marginal value of capacity against the tier's size", (
            "GPU-seconds of prefill per hour the next step of each tier's size would save (next: the what-if's "
            "smallest scale above today's size, 2x by default) and that its last step saves today (last: today's "
            "size against the largest scale below it, 0.5x), from the what-if's predicted prefill saved at both "
            "sizes over the last hour, summed over the selected pods "
            "(kvscope_tier_marginal_saved_gpu_seconds_per_hour; its confidence label is the cost model's, "
            "kvscope_tier_marginal_requests the requests it rests on). Dashed, right axis: the tier's size today "
            "(kvscope_whatif_tier_capacity_bytes, scenario today). A next step worth much less than the last: "
            "the tier is near the size beyond which more capacity saves little."), "suffix: GPU-s/h",
            [Query(f"sum by (tier, step) (kvscope_tier_marginal_saved_gpu_seconds_per_hour{{{ENGINE}, {TIER}}})",
                   "{{tier}} {{step}} step"),
             Query(tier_total("kvscope_whatif_tier_capacity_bytes", f'{ENGINE}, {TIER}, scenario="today"'),
                   "{{tier}} size today")], dashed=[1], right_axis={1: "bytes"}),
        timeseries_panel("Tier value and cost per hour (with prices)", (
            "Only where [analyses.value] prices are configured: the GPU time each tier saved over the last hour "
            "at the GPU-hour price (kvscope_tier_value_per_hour), summed over the selected pods, against the "
            "tier's cost per hour, its size at the price per GiB-month plus its billed transfers "
            "(kvscope_tier_cost_per_hour, dashed: the pods' own tiers summed, a shared G4 counted once). "
            "KVScopeTierCostsMoreThanItSaves fires when cost stays above value for a day."), "short",
            [Query(f"sum by (tier) (kvscope_tier_value_per_hour{{{ENGINE}, {TIER}}})", "{{tier}} value"),
             Query(tier_total("kvscope_tier_cost_per_hour", f"{ENGINE}, {TIER}"), "{{tier}} cost")],
            dashed=[1]),
        bargauge_panel("Cost per prompt token: served from each tier, or recomputed (with prices)", (
            "What serving one prompt token from each tier costs (its fetch as GPU time, plus the tier's cost per "
            "hour over the tokens it served per hour: kvscope_tier_token_cost), against recomputing one token of "
            "the typical reused prefix (kvscope_recompute_token_cost), averaged over the selected pods. A tier "
            "whose bar is longer than recompute's costs more than it saves per token."), "short",
            [Query(f"avg by (tier) (kvscope_tier_token_cost{{{ENGINE}, {TIER}}})", "{{tier}}", instant=True),
             Query(f"avg(kvscope_recompute_token_cost{{{ENGINE}}})", "recompute", instant=True)], span=6),
        bargauge_panel("Break-even size per tier (with prices)", (
            "Of the sizes the what-if explores for each tier (today's and its scales), the one where the GPU time "
            "saved less the tier's cost is largest: beyond it more capacity costs more than the GPU time it saves "
            "(kvscope_tier_breakeven_capacity_bytes, the largest over the selected pods; "
            "kvscope_tier_breakeven_beyond_curve 1: the break-even lies beyond the largest size explored)."),
            "bytes",
            [Query(f"max by (tier) (kvscope_tier_breakeven_capacity_bytes{{{ENGINE}, {TIER}}})", "{{tier}}",
                   instant=True)], span=6),
    ]
