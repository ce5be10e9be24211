"""How a catalogued metric is named, typed and united over OTLP: a pure function of its MetricSpec.

The mapping follows OpenTelemetry's Prometheus and OpenMetrics compatibility rules, in the direction a
Prometheus metric takes into OTLP, so that the way back (an OTel Collector's `prometheus` or
`prometheusremotewrite` exporter, Prometheus' own OTLP receiver, Mimir) gives every dashboard and rule
the names it already queries on `/metrics`:

- the name is the exposition name without the counter's `_total`; the unit word stays in the name,
  because the way back appends the unit only when the name lacks it, and drops annotation units
  (`{token}`), so `kvscope_kv_hit_tokens` + `{token}` returns as `kvscope_kv_hit_tokens_total`;
- the unit is UCUM: `By`, `s`, `By/s`, `1` for ratios, an annotation (`{token}`, `{block}`, ...) for
  counts of things, and empty for plain counts and 0/1 states (an empty unit adds no suffix; `1`
  would add `_ratio` to a gauge);
- counters are monotonic cumulative sums (kvscope's own totals), gauges are gauges, histograms are
  explicit-bucket histograms with the store's bounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvscope.agent.core.catalogue import MetricSpec

OtelKind = Literal["sum", "gauge", "histogram"]

# catalogue unit -> UCUM (https://ucum.org), as the OTel semantic conventions write units
UCUM: dict[str, str] = {
    "bytes": "By",
    "seconds": "s",
    "bytes_per_second": "By/s",
    "ratio": "1",
    "tokens": "{token}",
    "blocks": "{block}",
    "requests": "{request}",
    "events": "{event}",
    "": "",
}

_KINDS: dict[str, OtelKind] = {"counter": "sum", "gauge": "gauge", "histogram": "histogram"}


@dataclass(frozen=True, slots=True)
class OtelMetric:
    name: str
    unit: str
    kind: OtelKind
    monotonic: bool  # sums only: kvscope's counters never decrease while a series is held


def otel_metric(spec: MetricSpec) -> OtelMetric:
    """The OTLP name, UCUM unit and data type of a catalogued metric."""
    name = spec.name.removesuffix("_total") if spec.type == "counter" else spec.name
    return OtelMetric(name, UCUM[spec.unit], _KINDS[spec.type], spec.type == "counter")
