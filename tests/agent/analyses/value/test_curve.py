"""The value arithmetic: steps of a tier's size, break-even, per-token costs, windowed rates."""

from __future__ import annotations

import pytest

from kvscope.agent.analyses.value.curve import (
    GIB,
    Rates,
    breakeven,
    hourly_cost,
    recompute_token_cost,
    scale_of,
    steps,
    token_cost,
)

TIB = 1024 * GIB


def test_next_and_last_steps_are_the_nearest_scales_around_today() -> None:
    saved = {"today": 100.0, "G4x2": 130.0, "G4x4": 140.0, "G4x0.5": 60.0, "G2x2": 500.0, "no-G2": 0.0}
    sizes = {"today": 1 * TIB, "G4x2": 2 * TIB, "G4x4": 4 * TIB, "G4x0.5": 0.5 * TIB}
    got = {s.step: s for s in steps("G4", saved, sizes)}
    assert (got["next"].scenario, got["next"].saved, got["next"].size_change) == ("G4x2", 30.0, TIB)
    assert (got["last"].scenario, got["last"].saved, got["last"].size_change) == ("G4x0.5", 40.0, TIB / 2)
    assert steps("G3", saved, sizes) == []  # no scaled scenario of G3
    assert scale_of("G4x0.5", "G4") == 0.5 and scale_of("G4x2", "G2") is None and scale_of("no-G2", "G2") is None


def test_breakeven_is_the_size_where_value_less_cost_peaks() -> None:
    # GPU at 2/h: 3600 GPU-s/h are worth 2/h; G4 at 0.073 per GiB-month is 0.1 per TiB-hour
    curve = [(1 * TIB, 3600.0), (2 * TIB, 3600.0 * 1.08), (4 * TIB, 3600.0 * 1.1)]
    size, beyond = breakeven(curve, gpu_hour=2.0, gib_month=0.073 * 1000 / 1024) or (0.0, True)
    assert hourly_cost(TIB, 0.073 * 1000 / 1024) == pytest.approx(0.1)
    assert (size, beyond) == (2 * TIB, False)  # 1->2 TiB saves 0.16/h for 0.1/h; 2->4 saves 0.04/h for 0.2/h
    cheap = breakeven(curve, gpu_hour=2.0, gib_month=0.0)
    assert cheap == (4 * TIB, True)  # free capacity: more always pays, up to the curve's end
    assert breakeven(curve[:1], 2.0, 0.0) is None


def test_token_costs_at_the_seeds_scale() -> None:
    """gpt-oss-120b, 36,864 B/token, GPU at 2/h; 130k-token prefix at the seeds' cost model."""
    a, b = 4.136e-5, 1.584e-9
    recompute = recompute_token_cost(a, b, 130_000, gpu_hour=2.0, gpus=1.0)
    assert recompute == pytest.approx((a + b * 130_000) * 2 / 3600)  # ~1.4e-7 per token
    # G4 read at 10 GB/s, 0.5/h of storage over 10M tokens/h served
    g4 = token_cost(36_864, 10e9, hourly=0.5, tokens_per_hour=10e6, gpu_hour=2.0, gpus=1.0)
    assert g4 == pytest.approx(36_864 / 10e9 * 2 / 3600 + 0.5 / 10e6)
    assert token_cost(36_864, 10e9, 0.5, 0.0, 2.0, 1.0) is None


def test_rates_are_per_hour_over_the_window() -> None:
    rates = Rates(window=100.0)
    key = ("m", ("a",))
    rates.add(0.0, {key: 0.0})
    assert rates.per_hour(key) is None  # one snapshot: no span
    rates.add(50.0, {key: 5.0})
    rates.add(150.0, {key: 25.0})  # the first snapshot leaves the window
    assert rates.span == 100.0 and rates.per_hour(key) == pytest.approx(20.0 / 100 * 3600)
    assert rates.per_hour(("other", ())) is None
