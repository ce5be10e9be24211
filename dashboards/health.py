"""Agent health: is kvscope itself seeing everything it should?"""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from kvscope.dashboards.panels import ENGINE, HOST, Query, build_dashboard, stat_panel, timeseries_panel
from kvscope.dashboards.thresholds import UP

UID = "kvscope-agent"


def _rate(metric: str, by: str, selector: str = HOST) -> str:
    return f"sum by ({by}) (rate({metric}{{{selector}}}[$__rate_interval]))"


def build() -> Dashboard:
    jobs = [
        stat_panel("Collectors and analyses up", (
            "Up while the collector's or analysis's last run succeeded or found no hardware to read, Down "
            "when it raised or hung (kvscope_collector_up, kvscope_analysis_up; the lowest over the selected "
            "pods)."), "bool_yes_no",
            [Query(f"min by (collector) (kvscope_collector_up{{{HOST}}})", "{{collector}}"),
             Query(f"min by (analysis) (kvscope_analysis_up{{{HOST}}})", "{{analysis}}")], span=24, height=4,
            look=UP),
        timeseries_panel("Run duration", (
            "Wall time of each collector's and analysis's last run, the slowest over the selected pods "
            "(kvscope_collector_duration_seconds, kvscope_analysis_duration_seconds). A run near its timeout "
            "is about to be reported as hung."), "s",
            [Query(f"max by (collector) (kvscope_collector_duration_seconds{{{HOST}}})", "{{collector}}"),
             Query(f"max by (analysis) (kvscope_analysis_duration_seconds{{{HOST}}})", "{{analysis}}")]),
        timeseries_panel("Errors per second", (
            "Runs that raised, timed out or returned invalid readings (kvscope_collector_errors_total, "
            "kvscope_analysis_errors_total), and source files a host collector could not parse "
            "(kvscope_host_input_errors_total)."), "cps",
            [Query(_rate("kvscope_collector_errors_total", "collector"), "{{collector}}"),
             Query(_rate("kvscope_analysis_errors_total", "analysis"), "{{analysis}}"),
             Query(_rate("kvscope_host_input_errors_total", "collector"), "{{collector}} input")]),
    ]
    events = [
        timeseries_panel("KV events applied per second", (
            "KV-cache events received from the engine and applied to kvscope's view of residency, by type "
            "(kvscope_kv_events_total)."), "cps",
            [Query(_rate("kvscope_kv_events_total", "type", ENGINE), "{{type}}")]),
        timeseries_panel("KV event batches dropped, missed and malformed", (
            "Event batches missing from the live stream (dropped: sequence gaps, recovered by replay or not), "
            "lost for good (missed), and messages skipped as garbage (malformed), per second "
            "(kvscope_kv_events_dropped_total, _missed_total, _malformed_total). Missed or malformed batches "
            "leave residency unknown."), "cps",
            [Query(_rate("kvscope_kv_events_dropped_total", "instance", ENGINE), "dropped {{instance}}"),
             Query(_rate("kvscope_kv_events_missed_total", "instance", ENGINE), "missed {{instance}}"),
             Query(_rate("kvscope_kv_events_malformed_total", "instance", ENGINE), "malformed {{instance}}")]),
        timeseries_panel("Request records attributed per second", (
            "Per-request records (OTLP spans, AIPerf exports) the correlation engine attributed, by source "
            "(kvscope_requests_attributed_total), and spans the OTLP receiver took, by result "
            "(kvscope_otlp_spans_total)."), "cps",
            [Query(_rate("kvscope_requests_attributed_total", "source", ENGINE), "attributed from {{source}}"),
             Query(_rate("kvscope_otlp_spans_total", "result"), "spans {{result}}")], span=24),
    ]
    targets = [
        stat_panel("Engine endpoints answering", (
            "Up while kvscope's last scrape of the engine's /metrics succeeded (kvscope_scrape_target_up, "
            "one per scraped URL)."), "bool_yes_no",
            [Query(f"min by (target) (kvscope_scrape_target_up{{{HOST}}})", "{{target}}")], span=8, height=8,
            look=UP),
        timeseries_panel("Engine scrape errors by kind", (
            "Failed scrapes of the engine per second by kind: connect, timeout, http_status, too_large, "
            "truncated, protocol, duplicate_series (kvscope_scrape_errors_total); and scrapes whose page named a "
            "value the adapter has no tier for, by value (kvscope_engine_unmapped_values_total, e.g. an SGLang "
            "storage backend: its tokens are exported as unattributed until storage_backend_tiers maps it). The errors "
            "are 5-minute rates per pod and kind (recording rule kvscope:scrape_errors:rate5m, once a minute: "
            "every pod exports each kind for each target, errors or not), one point a minute."), "cps",
            [Query(f"sum by (kind) (kvscope:scrape_errors:rate5m{{{HOST}}})", "{{kind}}"),
             Query(_rate("kvscope_engine_unmapped_values_total", "label, value"), "no tier for {{label}}={{value}}")],
            span=8, min_interval="1m"),
        timeseries_panel("Prometheus scraping kvscope", (
            "1 while Prometheus' last scrape of the agent's /metrics succeeded (Prometheus' own `up` series "
            "of the kvscope job)."), "bool_yes_no",
            [Query(f'up{{{HOST}, job=~".*kvscope.*"}}', "{{instance}}")], span=8, look=UP),
    ]
    cost = [
        timeseries_panel("Agent CPU", (
            "CPU time the agent process used per second of wall time, in cores (process_cpu_seconds_total)."),
            "suffix: cores", [Query(f"rate(process_cpu_seconds_total{{{HOST}}}[$__rate_interval])", "{{instance}}")],
            span=8),
        timeseries_panel("Agent memory", (
            "Resident memory of the agent process (process_resident_memory_bytes) and the series its store "
            "holds (kvscope_store_series, right axis)."), "bytes",
            [Query(f"process_resident_memory_bytes{{{HOST}}}", "resident {{instance}}"),
             Query(f"sum by (state) (kvscope_store_series{{{HOST}}})", "series {{state}}")],
            right_axis={1: "suffix: series"}, span=8),
        timeseries_panel("Counter resets and rejected readings", (
            "Source counters that went backwards and were taken as restarts (kvscope_source_resets_total) and "
            "readings the store rejected as uncatalogued or malformed (kvscope_store_rejected_readings_total), "
            "per second over the selected pods. Both series appear with their first event; until then the "
            "panel shows 0."), "cps",
            [Query(f"sum(rate(kvscope_source_resets_total{{{HOST}}}[$__rate_interval])) or vector(0)",
                   "counter resets"),
             Query(f"sum(rate(kvscope_store_rejected_readings_total{{{HOST}}}[$__rate_interval])) or vector(0)",
                   "rejected readings")], span=8),
    ]
    return build_dashboard(
        "kvscope / Agent health", UID,
        "Is kvscope seeing everything? Collectors and analyses, the engine's KV-event stream and request "
        "records, the engine endpoints it scrapes, and what the agent itself costs.",
        ("instance", "engine", "model"),
        [("Collectors and analyses", jobs), ("KV events and request records", events),
         ("Scrape targets", targets), ("The agent's own cost", cost)])
