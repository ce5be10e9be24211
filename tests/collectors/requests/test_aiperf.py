"""AIPerf export parsing on literal fixtures built from the documented formats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvscope.collectors.requests.aiperf import (
    parse_profile_export,
    parse_profile_line,
    parse_server_metrics,
    parse_server_metrics_summary,
    read_artifact_dir,
    to_record,
)
from testkit.paths import FIXTURES

AIPERF = FIXTURES / "aiperf"


def test_profile_export_records() -> None:
    export = parse_profile_export((AIPERF / "profile_export.jsonl").read_text())
    assert export.bad_lines == 1 and len(export.requests) == 5
    first, second, warmup, cancelled, failed = export.requests
    assert first.request_id == "a4e1c0de-0000-4000-8000-000000000001"
    assert first.ttft == pytest.approx(0.17966) and first.latency == pytest.approx(0.26882)
    assert (first.input_tokens, first.prompt_tokens, first.cached_tokens) == (198, 161, None)
    assert first.start_ns == 1796056569375391814
    assert second.cached_tokens == 128 and second.ttft == pytest.approx(0.0382)
    assert warmup.phase == "warmup" and cancelled.cancelled and failed.failed


def test_records_for_the_correlation_engine() -> None:
    export = parse_profile_export((AIPERF / "profile_export.jsonl").read_text())
    records = [r for r in (to_record(q, "vllm", "fake-model") for q in export.requests) if r is not None]
    assert [r.request_id[-1] for r in records] == ["1", "2"]  # warmup, cancelled, failed left out
    second = records[1]
    assert (second.prompt_tokens, second.cached_tokens, second.new_tokens) == (161, 128, 33)
    assert second.arrival == pytest.approx(1796056569.41) and second.source == "aiperf"
    assert second.queue is None and second.prefill is None  # a client does not see server phases


def test_units_other_than_ms_and_bad_values() -> None:
    line = ('{"metadata":{"request_start_ns":5},"metrics":{"time_to_first_token":{"value":2.5e8,"unit":"ns"},'
            '"usage_prompt_tokens":{"value":-3}}}')
    request = parse_profile_line(line)
    assert request.ttft == pytest.approx(0.25) and request.prompt_tokens is None
    assert request.request_id == ":0:5"
    with pytest.raises(ValueError):
        parse_profile_line('{"metadata":{"request_start_ns":"soon"},"metrics":{}}')


def test_server_metrics_scrapes() -> None:
    export = parse_server_metrics((AIPERF / "server_metrics_export.jsonl").read_text())
    assert export.bad_lines == 1 and export.bad_entries == 1 and len(export.scrapes) == 2
    scrape = export.scrapes[1]
    assert scrape.endpoint_url == "http://127.0.0.1:8000/metrics"
    assert scrape.timestamp_ns == 1796056569433000000 and scrape.latency_ns == 1900000
    entries = {e.name: e for e in scrape.entries}
    assert entries["vllm:num_requests_running"].value == 4.0
    assert entries["vllm:num_requests_running"].labels == {"engine": "0", "model_name": "fake-model"}
    ttft = entries["vllm:time_to_first_token_seconds"]
    assert ttft.buckets == ((0.04, 1.0), (0.25, 2.0), (float("inf"), 2.0))
    assert (ttft.sum, ttft.count) == (0.2122, 2.0)
    summary = entries["fake:rpc_latency_seconds"]
    assert summary.quantiles == ((0.5, 0.012), (0.99, 0.031)) and summary.labels == {}


def test_read_artifact_dir(tmp_path: Path) -> None:
    (tmp_path / "profile_export.jsonl").write_text((AIPERF / "profile_export.jsonl").read_text())
    profile, server = read_artifact_dir(tmp_path)
    assert len(profile.requests) == 5 and server is None
    (tmp_path / "server_metrics_export.jsonl").write_text((AIPERF / "server_metrics_export.jsonl").read_text())
    assert read_artifact_dir(tmp_path)[1] is not None


def test_real_aiperf_0_13_histograms_under_buckets_parse_cleanly() -> None:
    """AIPerf 0.13.0's own output (captured live against the reference engine) names histograms "buckets"."""

    from kvscope.collectors.requests.aiperf import parse_server_metrics

    path = FIXTURES / "aiperf_live" / "cached" / "server_metrics_export.jsonl"
    export = parse_server_metrics(path.read_text())
    assert export.bad_lines == 0 and export.bad_entries == 0
    ttft = [e for e in export.scrapes[-1].entries if e.name == "vllm:time_to_first_token_seconds"]
    assert ttft and ttft[0].buckets[-1][0] == float("inf")
    assert ttft[0].count == ttft[0].buckets[-1][1] > 0


def test_the_json_summary_becomes_two_scrapes_of_growth() -> None:
    text = json.dumps({"summary": {"phase_time_ranges": {"profiling": {"start_ns": 1000, "end_ns": 5000}},
                                   "endpoints_successful": ["http://e/metrics"]},
                       "metrics": {
                           "vllm:prompt_tokens": {"type": "counter", "series": [
                               {"labels": {"engine": "0"}, "stats": {"total": 42.0, "rate": 1.0}}]},
                           "vllm:ttft": {"type": "histogram", "series": [
                               {"labels": {}, "stats": {"count": 3, "sum": 1.5}, "buckets": {"0.5": 1, "+Inf": 3}}]},
                           "vllm:running": {"type": "gauge", "series": [{"labels": {}, "stats": {"avg": 1.0}}]},
                           "vllm:broken": {"type": "counter", "series": [{"labels": {}, "stats": {}}]}}})
    export = parse_server_metrics_summary(text)
    start, end = export.scrapes
    assert (start.timestamp_ns, end.timestamp_ns) == (999, 5000) and end.endpoint_url == "http://e/metrics"
    grown = {e.name: e for e in end.entries}
    assert grown["vllm:prompt_tokens"].value == 42.0
    assert {e.name: e for e in start.entries}["vllm:prompt_tokens"].value == 0
    assert grown["vllm:ttft"].buckets == ((0.5, 1.0), (float("inf"), 3.0)) and grown["vllm:ttft"].count == 3
    assert "vllm:running" not in grown  # a gauge has no growth
    assert export.bad_entries == 1  # the counter without a total
    assert parse_server_metrics_summary("not json").bad_lines == 1
    no_phase = json.dumps({"metrics": {}, "summary": {}})
    assert parse_server_metrics_summary(no_phase).scrapes == []
