"""TTFT attribution: when time to first token is slow, is it queueing, KV fetch or prefill compute?"""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from kvscope.dashboards.panels import (
    ENGINE,
    MODEL_ENGINE,
    TIER,
    Query,
    build_dashboard,
    stat_panel,
    timeseries_panel,
)

UID = "kvscope-ttft"


def _quantile(q: str, metric: str) -> str:
    """A quantile per engine: engines that see the same requests (a frontend and its workers) each have their
    own bucket layout, and summed together they would count every request twice."""
    return f"histogram_quantile({q}, sum by (engine, le) (rate({metric}_bucket{{{ENGINE}}}[$__rate_interval])))"


def _split(per: str) -> str:
    """Attributed seconds per component over the TTFT histogram's `sum` (a share) or `count` (per request)."""
    return (f"sum by (component) (rate(kvscope_ttft_attributed_seconds_total{{{ENGINE}}}[$__rate_interval]))"
            f" / ignoring(component) group_left()"
            f" (sum(rate(kvscope_ttft_seconds_{per}{{{ENGINE}}}[$__rate_interval])) > 0)")


def build() -> Dashboard:
    ttft = [
        timeseries_panel("TTFT p50 / p95 / p99", (
            "Time to first token of the selected engines, by the engine's own definition, as quantiles of its "
            "TTFT histogram over every pod of the selected models and the last 5 minutes (recording rule "
            "model:kvscope_ttft_seconds_bucket:rate5m, the buckets of kvscope_ttft_seconds per second summed over "
            "a model's pods). The pod selection does not narrow it: summing every selected pod's buckets at each "
            "point read 42,000 series at 1,000 pods (over 1 s); the next panel shows the selected pods."), "s",
            [Query(f"histogram_quantile({q}, sum by (engine, le) "
                   f"(model:kvscope_ttft_seconds_bucket:rate5m{{{MODEL_ENGINE}}}))",
                   f"{{{{engine}}}} {name}") for q, name in (("0.5", "p50"), ("0.95", "p95"), ("0.99", "p99"))],
            span=12),
        timeseries_panel("TTFT p95 of the selected pods: the 10 highest", (
            "Each selected pod's own TTFT p95 over the last 5 minutes, per engine (recording rule "
            "kvscope:ttft_seconds:quantile_rate5m, recorded once a minute), for the 10 pods and engines with the "
            "highest at each point. One point a minute."), "s",
            [Query(f'topk(10, kvscope:ttft_seconds:quantile_rate5m{{{ENGINE}, quantile="0.95"}})',
                   "{{instance}} {{engine}}")], span=12, min_interval="1m"),
        stat_panel("Mean TTFT", (
            "Mean time to first token: the TTFT histogram's sum over its count (kvscope_ttft_seconds)."), "s",
            [Query(f"sum(rate(kvscope_ttft_seconds_sum{{{ENGINE}}}[$__rate_interval]))"
                   f" / (sum(rate(kvscope_ttft_seconds_count{{{ENGINE}}}[$__rate_interval])) > 0)")]),
        stat_panel("First tokens per second", (
            "Requests that produced their first token per second (count of the TTFT histogram, "
            "kvscope_ttft_seconds_count)."), "reqps",
            [Query(f"sum(rate(kvscope_ttft_seconds_count{{{ENGINE}}}[$__rate_interval]))")]),
    ]
    split = [
        timeseries_panel("Share of TTFT: frontend / queue / fetch / offload / prefill / other", (
            "Where time to first token goes, as a share of the TTFT sum: the engine's API server before the "
            "request is queued and on the first token's way out (frontend), waiting to be scheduled (queue), "
            "moving KV blocks toward the GPU (fetch), evicting and storing blocks down inside the step "
            "(offload; only engines that store synchronously have it), computing the prompt (prefill) and "
            "what no timer of the engine places: GPU idle inside the prefill phase, or all of the remainder "
            "where the engine reports no phases (other). "
            "From the correlation engine's attribution of the engine's histogram sums and transfer times "
            "(kvscope_ttft_attributed_seconds_total / kvscope_ttft_seconds_sum); per pod it is the recording "
            "rule kvscope:ttft_component_share:ratio_rate5m."), "percentunit",
            [Query(_split("sum"), "{{component}}")], stack=True, percent_max=True),
        timeseries_panel("TTFT split per request", (
            "The same split in seconds per request: attributed seconds over first tokens "
            "(kvscope_ttft_attributed_seconds_total / kvscope_ttft_seconds_count)."), "s",
            [Query(_split("count"), "{{component}}")], stack=True),
        timeseries_panel("Fetch share of TTFT against prompt length", (
            "Left: fetch's share of TTFT per pod (recording rule kvscope:ttft_fetch_share:ratio_rate5m) and the "
            "median request's fetch share (kvscope_ttft_fetch_share_ratio, per request where the fetch is "
            "known). Right: the mean prompt length of the same requests (kvscope_prompt_tokens_total over "
            "first tokens). Fetch share that grows with prompt length points at fetch bandwidth; at a "
            "constant length, at the tier's path."), "percentunit",
            [Query(f"kvscope:ttft_fetch_share:ratio_rate5m{{{ENGINE}}}", "fetch share {{instance}}"),
             Query(_quantile("0.5", "kvscope_ttft_fetch_share_ratio"), "{{engine}} median request's fetch share"),
             Query(f"sum(rate(kvscope_prompt_tokens_total{{{ENGINE}}}[$__rate_interval]))"
                   f" / (sum(rate(kvscope_ttft_seconds_count{{{ENGINE}}}[$__rate_interval])) > 0)",
                   "mean prompt tokens")],
            right_axis={2: "suffix: tokens"}),
        timeseries_panel("Break-even against measured fetch bandwidth per tier", (
            "Solid: the fetch bandwidth each tier achieved (recording rule "
            "kvscope:kv_fetch_bandwidth_bytes_per_second:rate5m: bytes onboarded from the tier over the "
            "seconds spent). Dashed: the bandwidth below which fetching the typical reused prefix from that "
            "tier takes longer than recomputing it (correlation engine's cost model, "
            "kvscope_fetch_breakeven_bandwidth_bytes_per_second). Solid under dashed: reuse from that tier "
            "makes TTFT worse."), "Bps",
            [Query(f"kvscope:kv_fetch_bandwidth_bytes_per_second:rate5m{{{ENGINE}, {TIER}}}",
                   "{{tier}} measured {{instance}}"),
             Query(f"kvscope_fetch_breakeven_bandwidth_bytes_per_second{{{ENGINE}, {TIER}}}",
                   "{{tier}} break-even {{instance}}")], dashed=[1], log_scale=True),
    ]
    engine = [
        timeseries_panel("Queue and prefill time as the engine reports them (p95)", (
            "95th percentile of the engine's own phase histograms: time waiting before first being scheduled "
            "(kvscope_queue_time_seconds) and time from first schedule to first token "
            "(kvscope_prefill_time_seconds; in vLLM, synchronous KV loads sit inside it)."), "s",
            [Query(_quantile("0.95", "kvscope_queue_time_seconds"), "{{engine}} queue p95"),
             Query(_quantile("0.95", "kvscope_prefill_time_seconds"), "{{engine}} prefill p95")]),
        timeseries_panel("Requests running and waiting", (
            "Requests in the engine's running batch and waiting to be scheduled, summed over the selected "
            "pods (kvscope_requests_running, kvscope_requests_waiting); dashed, the waiting ones by why, where "
            "the engine says it (vLLM: capacity = no room to schedule them, deferred = held by a LoRA budget, a "
            "KV transfer or a blocked status; kvscope_requests_waiting_by_reason)."), "suffix: requests",
            [Query(f"sum(kvscope_requests_running{{{ENGINE}}})", "running"),
             Query(f"sum(kvscope_requests_waiting{{{ENGINE}}})", "waiting"),
             Query(f"sum by (reason) (kvscope_requests_waiting_by_reason{{{ENGINE}}})", "waiting: {{reason}}")],
            dashed=[2]),
    ]
    return build_dashboard(
        "kvscope / TTFT attribution", UID,
        "Time to first token and where it goes: frontend, queue, KV fetch, offload, prefill and other, fetch share "
        "against prompt length, and each tier's fetch bandwidth against its break-even.",
        ("instance", "engine", "model", "tier"),
        [("Time to first token", ttft), ("Where TTFT goes", split), ("The engine's phases", engine)])
