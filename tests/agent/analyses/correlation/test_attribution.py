"""TTFT attribution arithmetic: aggregate windows and single requests."""

from __future__ import annotations

import pytest

from kvscope.agent.analyses.correlation.attribution import (
    WindowTotals,
    attribute_request,
    attribute_window,
    compute_sample,
    estimate_fetch,
)
from kvscope.agent.analyses.correlation.costmodel import PrefillCostModel
from kvscope.agent.analyses.correlation.counterfactuals import (
    recompute_avoided,
    ttft_without_cache,
    typical_reused_tokens,
)
from kvscope.agent.core.records import Part, RequestRecord, TierFetch


def total(attribution: object) -> float:
    return sum(p.seconds for p in attribution.parts.values())  # type: ignore[attr-defined]


def test_sync_fetch_comes_out_of_prefill() -> None:
    a = attribute_window(WindowTotals(ttft=10.0, queue=2.0, prefill=6.0, fetch=1.5), "prefill")
    assert {k: (p.seconds, p.method) for k, p in a.parts.items()} == {
        "queue": (2.0, "measured"), "prefill": (4.5, "derived"), "fetch": (1.5, "measured"),
        "frontend": (2.0, "derived"), "other": (0.0, "derived")}
    assert total(a) == pytest.approx(10.0)
    assert a.negative_remainder == 0 and a.fetch_overflow == 0


def test_async_fetch_comes_out_of_queue() -> None:
    a = attribute_window(WindowTotals(ttft=10.0, queue=2.0, prefill=6.0, fetch=1.5), "queue")
    assert a.seconds("queue") == pytest.approx(0.5) and a.parts["queue"].method == "derived"
    assert a.seconds("prefill") == 6.0 and a.parts["prefill"].method == "measured"
    assert a.seconds("frontend") == pytest.approx(2.0) and a.seconds("other") == 0.0
    assert total(a) == pytest.approx(10.0)


def test_negative_remainder_is_reported_not_hidden() -> None:
    a = attribute_window(WindowTotals(ttft=5.0, queue=2.0, prefill=4.0, fetch=1.0), "prefill")
    assert a.seconds("other") == 0.0
    assert a.negative_remainder == pytest.approx(1.0)
    assert total(a) == pytest.approx(5.0 + a.negative_remainder)  # the documented identity


def test_fetch_larger_than_its_phase_is_capped_and_reported() -> None:
    a = attribute_window(WindowTotals(ttft=10.0, queue=1.0, prefill=2.0, fetch=3.0), "prefill")
    assert a.seconds("fetch") == 2.0 and a.seconds("prefill") == 0.0
    assert a.fetch_overflow == pytest.approx(1.0)
    assert total(a) == pytest.approx(10.0)


def test_engine_without_phase_histograms_takes_fetch_from_the_remainder() -> None:
    a = attribute_window(WindowTotals(ttft=4.0, queue=None, prefill=None, fetch=1.0), "prefill")
    assert set(a.parts) == {"fetch", "other"}  # no phases timed: no frontend either
    assert a.seconds("other") == pytest.approx(3.0)
    assert attribute_window(WindowTotals(4.0, None, None, None), "queue").parts["other"].seconds == 4.0


def span_record(**kw: object) -> RequestRecord:
    base: dict[str, object] = dict(request_id="r", engine="vllm", model="m", dp_rank="0", arrival=100.0, ttft=2.0)
    base.update(kw)
    return RequestRecord(**base)  # type: ignore[arg-type]


def test_per_request_sync_split_by_the_model() -> None:
    model = PrefillCostModel(prior_a=1e-4)  # 1000 new tokens -> 0.1 s of compute
    r = span_record(ttft=2.0, queue=0.5, prefill=1.2, prompt_tokens=5000, cached_tokens=4000)
    a = attribute_request(r, model, None, "prefill")
    assert a.parts["prefill"].method == "estimated" and a.seconds("prefill") == pytest.approx(0.1 + 1e-4 * 0)
    assert a.parts["fetch"].method == "derived" and a.seconds("fetch") == pytest.approx(1.1)
    assert a.parts["queue"].method == "measured" and a.seconds("frontend") == pytest.approx(0.3)
    assert total(a) == pytest.approx(2.0)


def test_per_request_estimate_larger_than_measured_prefill_is_reported() -> None:
    model = PrefillCostModel(prior_a=1e-3)  # 1000 new tokens -> 1 s, but only 0.4 s were measured
    r = span_record(ttft=1.0, queue=0.1, prefill=0.4, prompt_tokens=1000, cached_tokens=0)
    a = attribute_request(r, model, None, "prefill")
    # cached_tokens == 0: the fetch is a known zero, so prefill stays measured
    assert a.seconds("fetch") == 0.0 and a.parts["prefill"].method == "measured"
    r2 = span_record(ttft=1.0, queue=0.1, prefill=0.4, prompt_tokens=2000, cached_tokens=1000)
    a2 = attribute_request(r2, model, None, "prefill")
    assert a2.estimate_overflow == pytest.approx(0.6)
    assert a2.seconds("prefill") == pytest.approx(0.4) and a2.seconds("fetch") == 0.0


def test_per_request_async_fetch_estimated_from_tiers_comes_out_of_queue() -> None:
    r = span_record(ttft=3.0, queue=1.0, prefill=1.5, prompt_tokens=3000, cached_tokens=2000,
                    fetches=(TierFetch("G4", 2000),))
    estimate = estimate_fetch(r, lambda tier, moved: moved / 1e9 if tier == "G4" else None, lambda _t: 200_000.0)
    assert estimate == pytest.approx(0.4)
    a = attribute_request(r, PrefillCostModel(), estimate, "queue")
    assert a.parts["fetch"].method == "estimated" and a.seconds("fetch") == pytest.approx(0.4)
    assert a.parts["queue"].method == "derived" and a.seconds("queue") == pytest.approx(0.6)
    assert a.parts["prefill"].method == "measured" and a.seconds("frontend") == pytest.approx(0.5)


def test_estimate_fetch_unknown_tier_or_unplaced_reuse_is_none() -> None:
    r = span_record(cached_tokens=100, fetches=(TierFetch("G3", 100),))
    assert estimate_fetch(r, lambda t, b: None, lambda t: 1.0) is None
    assert estimate_fetch(span_record(cached_tokens=100), lambda t, b: 1.0, lambda t: 1.0) is None
    assert estimate_fetch(span_record(cached_tokens=0), lambda t, b: 1.0, lambda t: 1.0) == 0.0
    measured = span_record(fetches=(TierFetch("G2", 10, 1e6, 0.25),))
    assert estimate_fetch(measured, lambda t, b: None, lambda t: None) == 0.25


def test_reuse_the_source_places_all_in_g1_fetched_nothing() -> None:
    g1_only = span_record(ttft=0.3, queue=0.01, prefill=0.2, prompt_tokens=3000, cached_tokens=2000, g1_tokens=2000)
    assert g1_only.nothing_fetched and estimate_fetch(g1_only, lambda t, b: None, lambda t: None) == 0.0
    a = attribute_request(g1_only, PrefillCostModel(prior_a=1e-4), 0.0, "queue")
    assert a.parts["fetch"] == Part(0.0, "measured") and a.parts["queue"] == Part(0.01, "measured")
    partly = span_record(cached_tokens=2000, g1_tokens=1500)  # 500 tokens from a tier the record does not name
    assert not partly.nothing_fetched and estimate_fetch(partly, lambda t, b: 1.0, lambda t: 1.0) is None


def test_client_record_without_phases() -> None:
    model = PrefillCostModel(prior_a=1e-4)
    r = span_record(source="aiperf", ttft=0.5, prompt_tokens=3000, cached_tokens=1000)
    a = attribute_request(r, model, 0.05, "queue")
    assert a.parts["prefill"].method == "estimated" and a.seconds("prefill") == pytest.approx(0.2)
    assert a.seconds("fetch") == pytest.approx(0.05) and a.seconds("other") == pytest.approx(0.25)
    assert "queue" not in a.parts


def test_compute_samples_only_where_compute_is_pinned_down() -> None:
    cold = span_record(prefill=0.8, prompt_tokens=1000, cached_tokens=0)
    assert compute_sample(cold, "prefill") == (1000, 0, 0.8)
    warm_unknown_fetch = span_record(prefill=0.8, prompt_tokens=1000, cached_tokens=500)
    assert compute_sample(warm_unknown_fetch, "prefill") is None
    assert compute_sample(warm_unknown_fetch, "queue") == (500, 500, 0.8)  # async: prefill is pure compute
    measured = span_record(prefill=0.8, prompt_tokens=1000, cached_tokens=500, fetch_seconds=0.3)
    assert compute_sample(measured, "prefill") == (500, 500, pytest.approx(0.5))
    client = span_record(ttft=0.6, prompt_tokens=1000, cached_tokens=0)
    assert compute_sample(client, "queue") is None
    assert compute_sample(client, "queue", ttft_when_no_prefill=True) == (1000, 0, 0.6)
    assert compute_sample(span_record(prefill=0.8), "queue") is None  # a span: reuse unknown


def test_counterfactuals_keep_negative_savings() -> None:
    model = PrefillCostModel(prior_a=1e-4)  # prompt of 10k tokens -> 1 s to recompute
    fast = span_record(ttft=0.5, queue=0.1, prefill=0.3, prompt_tokens=10_000, cached_tokens=9000, fetch_seconds=0.1)
    a = attribute_request(fast, model, None, "prefill")
    assert recompute_avoided(fast, a, model) == pytest.approx(1.0 - 0.3)
    assert ttft_without_cache(fast, a, model) == pytest.approx(0.1 + 1.0 + 0.1)  # other = 0.5 − 0.1 − 0.3
    slow = span_record(ttft=2.0, queue=0.1, prefill=1.6, prompt_tokens=10_000, cached_tokens=9000, fetch_seconds=1.5)
    assert recompute_avoided(slow, attribute_request(slow, model, None, "prefill"), model) == pytest.approx(-0.6)
    cold = span_record(prompt_tokens=10_000, cached_tokens=0, prefill=1.0)
    assert recompute_avoided(cold, attribute_request(cold, model, None, "prefill"), model) is None


def test_typical_reused_tokens_is_the_median_of_reusing_requests() -> None:
    records = [span_record(cached_tokens=c) for c in (0, 100, 300, 1000, None)]
    assert typical_reused_tokens(records) == 300.0
    assert typical_reused_tokens([span_record(cached_tokens=0)]) is None


def test_gpu_idle_in_the_prefill_phase_beyond_fetch_and_offload_is_other() -> None:
    record = span_record(ttft=1.0, queue=0.1, prefill=0.8, prompt_tokens=4096, cached_tokens=2048,
                         fetch_seconds=0.2, offload_seconds=0.1)
    # the GPU idled 0.45 s of the 0.8 s phase: 0.3 s of it fetch and offload, 0.15 s nothing of this request
    a = attribute_request(record, PrefillCostModel(), None, "prefill", prefill_idle=0.45)
    assert a.seconds("prefill") == pytest.approx(0.8 - 0.2 - 0.1 - 0.15)
    assert a.seconds("frontend") == pytest.approx(0.1) and a.seconds("other") == pytest.approx(0.15)
    assert a.prefill_idle == pytest.approx(0.15)
    assert total(a) == pytest.approx(1.0)
    quiet = attribute_request(record, PrefillCostModel(), None, "prefill", prefill_idle=0.25)
    assert quiet.prefill_idle == 0.0 and quiet.seconds("prefill") == pytest.approx(0.5)  # idle only while loading
    assert compute_sample(record, "prefill", prefill_idle=0.45) == (2048, 2048, pytest.approx(0.35))
    assert compute_sample(record, "prefill") == (2048, 2048, pytest.approx(0.5))


def test_window_gpu_idle_leaves_prefill_and_what_does_not_fit_is_reported() -> None:
    a = attribute_window(WindowTotals(ttft=10.0, queue=2.0, prefill=6.0, fetch=1.5, prefill_idle=1.0), "prefill")
    assert a.seconds("prefill") == pytest.approx(3.5) and a.seconds("frontend") == pytest.approx(2.0)
    assert a.seconds("other") == pytest.approx(1.0)
    assert a.prefill_idle == 1.0 and a.idle_overflow == 0.0
    over = attribute_window(WindowTotals(ttft=10.0, queue=2.0, prefill=2.0, fetch=1.5, prefill_idle=1.0), "prefill")
    assert over.seconds("prefill") == 0.0 and over.idle_overflow == pytest.approx(0.5)
    assert total(over) == pytest.approx(10.0)
