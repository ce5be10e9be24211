"""The advancing engine page the cardinality budget and the fleet bench serve: counters grow, gauges stay."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from testkit.advancing import advance
from testkit.engine_pages import page


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_counters_and_histograms_scale_gauges_and_created_do_not() -> None:
    text = page("vllm", "v0.33.0-cpu-offload-dp2.prom").decode()
    before, after = samples(text), samples(advance(text, 1.5))
    assert before.keys() == after.keys()
    kinds = {s.name: f.type for f in text_string_to_metric_families(text) for s in f.samples}
    scaled = [key for key in before if not key[0].endswith("_created") and (
        kinds[key[0]] in ("counter", "histogram") or (kinds[key[0]] == "summary" and "quantile" not in dict(key[1])))]
    assert len(scaled) > 300
    for key in scaled:
        assert after[key] == before[key] * 1.5, key
    for key, value in before.items():
        if key not in scaled:
            assert after[key] == value, key


def test_a_timestamped_sample_keeps_its_timestamp() -> None:
    text = "# TYPE x_total counter\nx_total{a=\"1\"} 4 1700000000000\n# TYPE g gauge\ng 2\n"
    assert advance(text, 2.0) == "# TYPE x_total counter\nx_total{a=\"1\"} 8.0 1700000000000\n# TYPE g gauge\ng 2\n"
