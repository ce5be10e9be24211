"""NNLS and the prefill/fetch cost model: the seeds' two recompute points, noisy synthetic data."""

from __future__ import annotations

import math
import random

import pytest

from kvscope.agent.analyses.correlation.costmodel import PrefillCostModel, TierFetchModel, compute_features
from kvscope.agent.analyses.correlation.counterfactuals import breakeven_bandwidth
from kvscope.agent.analyses.correlation.nnls import nnls

# shared/seeds/summary.md: recompute TTFT 0.572 s at 10k tokens, 32.14 s at 130k (gpt-oss-120b, one GPU)
SEED_POINTS = ((10_000, 0.572), (130_000, 32.14))
BYTES_PER_TOKEN = 36_864  # gpt-oss-120b FP16 full-attention layers


def seed_model() -> PrefillCostModel:
    model = PrefillCostModel(min_samples=2)
    for tokens, seconds in SEED_POINTS:
        model.add(tokens, 0, seconds)
    model.refit()
    return model


def test_seed_points_give_the_published_coefficients() -> None:
    model = seed_model()
    assert model.a == pytest.approx(4.14e-5, rel=0.005)
    assert model.b == pytest.approx(1.58e-9, rel=0.005)
    for tokens, seconds in SEED_POINTS:  # two points, two parameters: an exact fit
        assert model.compute(tokens) == pytest.approx(seconds, rel=1e-9)
    assert model.fit is not None and model.fit.r2 == pytest.approx(1.0)


def test_noisy_synthetic_data_recovers_known_coefficients() -> None:
    rng = random.Random(7)
    a, b = 3e-5, 2e-9
    model = PrefillCostModel(window=400, min_samples=8)
    for _ in range(400):
        new, ctx = rng.randint(100, 60_000), rng.choice([0, 0, rng.randint(0, 60_000)])
        model.add(new, ctx, (a * new + b * new * (2 * ctx + new)) * (1 + rng.gauss(0, 0.03)))
    fit = model.refit()
    assert fit is not None and fit.n == 400
    assert model.a == pytest.approx(a, rel=0.1)
    assert model.b == pytest.approx(b, rel=0.03)
    assert fit.r2 > 0.99


def test_model_follows_drift_through_its_window() -> None:
    model = PrefillCostModel(window=50, min_samples=8)
    for new in range(1000, 51_000, 1000):
        model.add(new, 0, 1e-9 * new * new)
    model.refit()
    assert model.b == pytest.approx(1e-9, rel=1e-6)
    for new in range(1000, 51_000, 1000):  # the GPU got twice as slow: the old samples leave the window
        model.add(new, 0, 2e-9 * new * new)
    model.refit()
    assert model.b == pytest.approx(2e-9, rel=1e-6)


def test_nnls_clamps_a_negative_coefficient_to_zero() -> None:
    # y = 2·x1 − 1·x2 unconstrained; with β ≥ 0 the best is β2 = 0 and β1 the LS slope on x1 alone
    rows = [(1.0, 1.0), (2.0, 1.0), (3.0, 2.0), (4.0, 3.0)]
    y = [2 * x1 - x2 for x1, x2 in rows]
    fit = nnls(rows, y)
    assert fit.coefficients[1] == 0.0
    expected = sum(x1 * v for (x1, _), v in zip(rows, y, strict=True)) / sum(x1 * x1 for x1, _ in rows)
    assert fit.coefficients[0] == pytest.approx(expected)
    assert all(c >= 0 for c in fit.coefficients)


def test_nnls_with_three_parameters_and_an_intercept() -> None:
    rows = [(float(n), float(n * n), 1.0) for n in range(1, 30)]
    y = [0.5 * n + 0.01 * n * n + 3.0 for n in range(1, 30)]
    fit = nnls(rows, y)
    assert fit.coefficients == pytest.approx((0.5, 0.01, 3.0), rel=1e-6)


def test_nnls_rejects_ragged_rows() -> None:
    with pytest.raises(ValueError):
        nnls([(1.0, 2.0), (1.0,)], [1.0, 2.0])


def test_model_without_fit_uses_the_prior() -> None:
    model = PrefillCostModel(prior_a=1e-5, prior_b=0.0)
    assert model.known and model.compute(1000) == pytest.approx(0.01)
    assert not PrefillCostModel().known


def test_narrow_prompts_are_not_trusted_and_fall_back_to_the_scaled_prior() -> None:
    """Prompts of 1,650-1,800 tokens with 2 % noise: the free fit may land anywhere along the line a·n + b·n² at
    that length; the model refuses it (spread 1.09 < 2) and scales the seeds' shape to the data instead."""
    rng = random.Random(3)
    a, b = 3 * 4.136e-5, 3 * 1.584e-9  # an engine 3x slower than the seeds' GPU, the same shape
    model = PrefillCostModel(min_samples=8)
    for _ in range(32):
        n = rng.randint(1650, 1800)
        model.add(n, 0, (a * n + b * n * n) * (1 + rng.gauss(0, 0.02)))
    model.refit()
    assert model.fit is not None and model.spread == pytest.approx(1800 / 1650, rel=0.01)
    assert not model.confident and model.basis == "prior_scaled"
    assert model.prior_scale == pytest.approx(3.0, rel=0.02)
    assert (model.a, model.b) == pytest.approx((a, b), rel=0.02)


def test_a_wide_but_noisy_window_is_judged_by_its_standard_errors() -> None:
    """Enough spread, but so much noise that the quadratic term is anyone's guess: not trusted either."""
    rng = random.Random(5)
    model = PrefillCostModel(min_samples=8)
    for _ in range(12):
        n = rng.choice((1000, 4000))
        model.add(n, 0, (4e-5 * n + 1.6e-9 * n * n) * (1 + rng.gauss(0, 0.4)))
    model.refit()
    assert model.spread == 4.0 and model.uncertainty > model.max_relative_error and not model.confident
    precise = PrefillCostModel(min_samples=8)
    for n in (1000, 2000, 4000, 8000, 16_000) * 2:
        precise.add(n, 0, 4e-5 * n + 1.6e-9 * n * n)
    precise.refit()
    assert precise.confident and precise.basis == "fit" and precise.uncertainty < 1e-6


def test_few_samples_scale_the_prior_until_there_are_enough_to_fit() -> None:
    model = PrefillCostModel(min_samples=8, prior_a=2e-5, prior_b=1e-9)
    assert model.basis == "prior" and not model.confident
    model.add(4000, 0, 2 * (2e-5 * 4000 + 1e-9 * 4000 * 4000))
    model.refit()
    assert model.fit is None and model.basis == "prior_scaled" and model.a == pytest.approx(4e-5)


def test_compute_counts_attention_over_the_reused_context() -> None:
    assert compute_features(10, 100) == (10, 10 * 210)


def test_breakeven_bandwidth_reproduces_the_seeds_figures() -> None:
    model = seed_model()
    at_10k = breakeven_bandwidth(10_000, model.a, model.b, 0.0, BYTES_PER_TOKEN)
    at_130k = breakeven_bandwidth(130_000, model.a, model.b, 0.0, BYTES_PER_TOKEN)
    assert at_10k == pytest.approx(645e6, rel=0.005)  # correlation.md §4: "about 645 MB/s"
    assert at_130k == pytest.approx(149.1e6, rel=0.005)  # "about 150 MB/s"
    # a per-fetch latency raises the bar; latency beyond the recompute time: fetching never pays
    assert breakeven_bandwidth(10_000, model.a, model.b, 0.1, BYTES_PER_TOKEN) > at_10k
    assert breakeven_bandwidth(10_000, model.a, model.b, 1.0, BYTES_PER_TOKEN) == math.inf


def test_tier_model_bandwidth_and_latency() -> None:
    tier = TierFetchModel(min_samples=4)
    assert tier.seconds(1e6) is None  # nothing known yet
    for size in (1e6, 2e6, 4e6, 8e6, 16e6):
        tier.add_fetch(size, size / 2e9 + 0.003)
    tier.refit()
    assert tier.latency == pytest.approx(0.003, rel=1e-6)
    assert tier.effective_bandwidth == pytest.approx(2e9, rel=1e-6)
    assert tier.observe_window(3e9, 2.0) == 1.5e9  # the store's window bandwidth wins once known
    assert tier.seconds(3e9) == pytest.approx(2.0 + 0.003)
    assert tier.observe_window(0, 0) is None and tier.bandwidth == 1.5e9
