"""Fleet and shared tier: every pod reads the same G4, so what happens to TTFT when they all read it?"""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from kvscope.dashboards.panels import SCOPE, Query, bargauge_panel, build_dashboard, stat_panel, timeseries_panel
from kvscope.dashboards.thresholds import above

UID = "kvscope-fleet"
MODEL = f'{SCOPE}, model=~"$model"'
# the tier:... rules sum a shared tier over every pod of a cluster, whatever their namespace
SHARED = 'cluster=~"$cluster", tier=~"$tier"'


def build() -> Dashboard:
    load = [
        timeseries_panel("Fetch traffic from the shared tier, all pods together", (
            "Bytes per second every pod together fetches from the tier (recording rule "
            "tier:kvscope_kv_fetch_bytes:rate5m, the sum of each pod's onboard transfers out of it), against "
            "the read bandwidth the tier can serve, dashed (kvscope:tier_fetch_capacity_bytes_per_second, "
            "yours to set in kvscope-site.rules.yml; no line until you do)."), "Bps",
            [Query(f"tier:kvscope_kv_fetch_bytes:rate5m{{{SHARED}}}", "{{tier}} fetched by all pods"),
             Query('kvscope:tier_fetch_capacity_bytes_per_second{tier=~"$tier"}', "{{tier}} capacity")],
            dashed=[1], span=12),
        stat_panel("Shared tier load", (
            "The fleet's fetch traffic from the tier over its configured read bandwidth (recording rule "
            "tier:kvscope_kv_fetch_utilisation:ratio_rate5m; empty until kvscope-site.rules.yml gives the "
            "tier's bandwidth). Red where KVScopeSharedTierNearCapacity fires."),
            "percentunit", [Query(f"tier:kvscope_kv_fetch_utilisation:ratio_rate5m{{{SHARED}}}", "{{tier}}")],
            look=above("KVScopeSharedTierNearCapacity")),
        stat_panel("Pods fetching from it", (
            "Pods that fetched KV blocks from the tier in the last 5 minutes (recording rule "
            "tier:kvscope_kv_fetch_pods:count5m)."), "suffix: pods",
            [Query(f"tier:kvscope_kv_fetch_pods:count5m{{{SHARED}}}", "{{tier}}")]),
        timeseries_panel("Fetch share of TTFT against the shared tier's load", (
            "The fetch share of TTFT per model over all its pods, per engine that times the requests (recording "
            "rule model:kvscope_ttft_fetch_share:ratio_rate5m), beside the shared tier's load (fetch traffic over "
            "configured bandwidth). The seeds measured one GPU against an idle cluster; when the fetch share "
            "climbs with the load, the shared tier is what TTFT waits on."), "percentunit",
            [Query(f"model:kvscope_ttft_fetch_share:ratio_rate5m{{{MODEL}}}", "fetch share {{model}} {{engine}}"),
             Query(f"tier:kvscope_kv_fetch_utilisation:ratio_rate5m{{{SHARED}}}", "{{tier}} load")], span=24),
    ]
    models = [
        timeseries_panel("TTFT p95 and p99 by model", (
            "TTFT quantiles of each model over all pods serving it (recording rule "
            "model:kvscope_ttft_seconds:quantile_rate5m, from the pods' TTFT histograms summed), one line per "
            "engine that reports them: a frontend and its workers see the same requests."), "s",
            [Query(f'model:kvscope_ttft_seconds:quantile_rate5m{{{MODEL}, quantile="{q}"}}',
                   f"{{{{model}}}} {{{{engine}}}} p{q[2:]}") for q in ("0.95", "0.99")]),
        timeseries_panel("Served share by model and tier", (
            "Of all prompt tokens a model's pods looked up, the share each tier served (recording rule "
            "model:kvscope_kv_served_share:ratio_rate5m). One line per model and tier, not stacked: the "
            "shares of one model add up to at most 100 %, those of several models do not."), "percentunit",
            [Query(f'model:kvscope_kv_served_share:ratio_rate5m{{{MODEL}, tier=~"$tier"}}', "{{model}} {{tier}}")],
            percent_max=True),
        timeseries_panel("Prefill seconds saved per second, by model", (
            "Recompute time the cache avoided per second of wall time, over all pods of each model "
            "(recording rule model:kvscope_prefill_saved_seconds:rate5m)."), "suffix: s/s",
            [Query(f"model:kvscope_prefill_saved_seconds:rate5m{{{MODEL}}}", "{{model}}")], span=24),
    ]
    outliers = [
        bargauge_panel("Pods whose fetch share is furthest above their model's", (
            "Each pod's fetch share of TTFT (kvscope:ttft_fetch_share:ratio_rate5m) minus its model's over all "
            "pods, the ten largest. A pod far above the others shares the tier but not its fate: look at its "
            "node's NIC, RDMA port or FS client in Hardware path."), "percentunit",
            [Query(f"topk(10, kvscope:ttft_fetch_share:ratio_rate5m{{{MODEL}}}"
                   " - on(cluster, namespace, model, engine) group_left() model:kvscope_ttft_fetch_share:ratio_rate5m)",
                   "{{instance}}", instant=True)], span=8),
        bargauge_panel("Pods whose TTFT p95 is furthest above their model's", (
            "Each pod's TTFT p95 (kvscope:ttft_seconds:quantile_rate5m) over its model's p95 across all pods, "
            "the ten largest: 2× means that pod's slow requests take twice the fleet's."), "suffix:×",
            [Query(f'topk(10, kvscope:ttft_seconds:quantile_rate5m{{{MODEL}, quantile="0.95"}}'
                   " / on(cluster, namespace, model, engine, quantile) group_left()"
                   " model:kvscope_ttft_seconds:quantile_rate5m)",
                   "{{instance}}", instant=True)], span=8),
        bargauge_panel("Pods with the slowest fetch from the shared tier", (
            "The ten pods with the lowest achieved fetch bandwidth from the tier (recording rule "
            "kvscope:kv_fetch_bandwidth_bytes_per_second:rate5m)."), "Bps",
            [Query(f'bottomk(10, kvscope:kv_fetch_bandwidth_bytes_per_second:rate5m{{{MODEL}, tier=~"$tier"}})',
                   "{{instance}} {{tier}}", instant=True)], span=8),
        timeseries_panel("Pods whose storage path has a noisy neighbour or is saturated", (
            "How many pods' correlation engines currently flag the tier's path: near its peak with fetch "
            "bandwidth and KV share down (noisy neighbour, kvscope_tier_noisy_neighbour), or at its peak "
            "while the fetch share grows (kvscope_tier_saturated). Many pods at once point at the shared "
            "tier or the fabric, one pod at its node."), "suffix: pods",
            [Query(f'sum by (tier) (kvscope_tier_noisy_neighbour{{{SCOPE}, tier=~"$tier"}})',
                   "{{tier}} noisy neighbour"),
             Query(f'sum by (tier) (kvscope_tier_saturated{{{SCOPE}, tier=~"$tier"}})', "{{tier}} saturated")],
            span=24),
    ]
    return build_dashboard(
        "kvscope / Fleet and shared tier", UID,
        "Every pod reads the shared tier (G4) at once: its aggregate load against its capacity, the fetch "
        "share of TTFT against that load, each model over its pods, and the pods that stand out.",
        ("model", "tier"),
        [("The shared tier's load", load), ("Models across pods", models), ("Per-pod outliers", outliers)])
