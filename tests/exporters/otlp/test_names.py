"""The OTel names, units and types of the whole catalogue, and the way back to the names /metrics shows."""

from __future__ import annotations

import re

import pytest

from kvscope.agent.app.wiring import all_metric_specs
from kvscope.agent.core import catalogue
from kvscope.agent.core.catalogue import MetricSpec, counter, gauge, histogram
from kvscope.exporters.otlp.names import UCUM, OtelMetric, otel_metric
from testkit.otlp_receiver import prometheus_name

SPECS = all_metric_specs()


def test_every_catalogued_unit_has_a_ucum_unit() -> None:
    assert set(UCUM) == catalogue._UNITS


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_every_catalogued_metric_maps_and_comes_back_as_its_exposition_name(spec: MetricSpec) -> None:
    otel = otel_metric(spec)
    assert not otel.name.endswith("_total") and re.fullmatch(r"[a-z_][a-z0-9_]*", otel.name)
    assert otel.kind == {"counter": "sum", "gauge": "gauge", "histogram": "histogram"}[spec.type]
    assert otel.monotonic == (spec.type == "counter")
    assert otel.unit == UCUM[spec.unit]
    # an OTel Collector's Prometheus exporters, or Prometheus' OTLP receiver, give the dashboards' name back
    assert prometheus_name(otel.name, otel.unit, otel.kind, otel.monotonic) == spec.name


@pytest.mark.parametrize(("spec", "expected"), [
    (counter("kvscope_kv_transfer_bytes_total", "bytes", (), "h", "s"), OtelMetric("kvscope_kv_transfer_bytes", "By",
                                                                                    "sum", True)),
    (counter("kvscope_kv_hit_tokens_total", "tokens", (), "h", "s"), OtelMetric("kvscope_kv_hit_tokens", "{token}",
                                                                                 "sum", True)),
    (counter("process_cpu_seconds_total", "seconds", (), "h", "s"), OtelMetric("process_cpu_seconds", "s", "sum",
                                                                               True)),
    (histogram("kvscope_ttft_seconds", "seconds", (), "h", "s"), OtelMetric("kvscope_ttft_seconds", "s", "histogram",
                                                                            False)),
    (gauge("kvscope_kv_cache_usage_ratio", "ratio", (), "h", "s"), OtelMetric("kvscope_kv_cache_usage_ratio", "1",
                                                                              "gauge", False)),
    (gauge("kvscope_tier_fetch_bandwidth_bytes_per_second", "bytes_per_second", (), "h", "s"),
     OtelMetric("kvscope_tier_fetch_bandwidth_bytes_per_second", "By/s", "gauge", False)),
    (gauge("kvscope_collector_up", "", (), "h", "s"), OtelMetric("kvscope_collector_up", "", "gauge", False)),
])
def test_literal_mappings(spec: MetricSpec, expected: OtelMetric) -> None:
    assert otel_metric(spec) == expected


def test_the_way_back_is_not_the_identity() -> None:
    """The rules the round trip is checked against do add suffixes where a name lacks them."""
    assert prometheus_name("http_server_duration", "s", "histogram", False) == "http_server_duration_seconds"
    assert prometheus_name("queue_fill", "1", "gauge", False) == "queue_fill_ratio"
    assert prometheus_name("packets_dropped", "{packet}", "sum", True) == "packets_dropped_total"
    assert prometheus_name("up", "", "gauge", False) == "up"
    assert prometheus_name("kvscope_collector_up", "1", "gauge", False) == "kvscope_collector_up_ratio"  # why "" not 1
