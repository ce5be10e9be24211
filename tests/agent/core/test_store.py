"""The store: monotonic counters across resets and wraps, histograms, series ownership."""

from __future__ import annotations

import itertools
import math

import pytest

from kvscope.agent.core.catalogue import Catalogue, counter, gauge, histogram
from kvscope.agent.core.readings import HistogramSample, Sample
from kvscope.agent.core.store import Store

C = "kvscope_test_bytes_total"
G = "kvscope_test_blocks"
H = "kvscope_test_seconds"


@pytest.fixture
def store() -> Store:
    from kvscope.agent.core.catalogue import AGENT_METRICS

    specs = [
        counter(C, "bytes", ("device",), "test counter", "test"),
        gauge(G, "blocks", ("tier",), "test gauge", "test"),
        histogram(H, "seconds", (), "test histogram", "test"),
        *AGENT_METRICS,
    ]
    return Store(Catalogue(specs))


def feed(store: Store, *values: float, modulus: int | None = None) -> list[float]:
    totals = []
    for i, v in enumerate(values):
        store.ingest("c", [Sample(C, ("sda",), v, modulus)], now=float(i))
        totals.append(store.value(C, ("sda",)) or 0.0)
    return totals


def test_counter_first_sight_is_the_source_total(store: Store) -> None:
    assert feed(store, 1000.0, 1500.0) == [1000.0, 1500.0]


def test_counter_reset_counts_from_zero_and_never_goes_down(store: Store) -> None:
    totals = feed(store, 100.0, 250.0, 30.0, 80.0)
    assert totals == [100.0, 250.0, 280.0, 330.0]
    assert all(b >= a for a, b in itertools.pairwise(totals))
    assert store.value("kvscope_source_resets_total", ("c",)) == 1.0


def test_counter_wrap_with_known_modulus(store: Store) -> None:
    totals = feed(store, 2**32 - 10, 5, modulus=2**32)
    assert totals == [2**32 - 10, 2**32 + 5]


def test_histogram_accumulates_and_survives_reset(store: Store) -> None:
    inf = math.inf

    def h(counts: tuple[float, float], total: float) -> HistogramSample:
        return HistogramSample(H, (), ((0.1, counts[0]), (inf, counts[1])), total, counts[1])

    store.ingest("c", [h((1, 2), 0.5)], 0.0)
    store.ingest("c", [h((3, 5), 1.5)], 1.0)
    store.ingest("c", [h((1, 1), 0.05)], 2.0)  # engine restarted
    bounds, buckets, total, count = store.histogram(H, ())
    assert bounds == (0.1, inf)
    assert buckets == [4.0, 6.0]
    assert count == 6.0
    assert total == pytest.approx(1.55)


def test_vanished_series_stops_being_exported_and_resumes_monotonic(store: Store) -> None:
    store.ingest("c", [Sample(C, ("sda",), 10.0), Sample(C, ("sdb",), 5.0)], 0.0)
    store.ingest("c", [Sample(C, ("sda",), 20.0)], 1.0)
    assert store.values(C) == {("sda",): 20.0}
    store.ingest("c", [Sample(C, ("sda",), 20.0), Sample(C, ("sdb",), 2.0)], 2.0)
    assert store.values(C)[("sdb",)] == 7.0


def test_unknown_metric_and_wrong_label_count_are_rejected_and_counted(store: Store) -> None:
    result = store.ingest("c", [Sample("kvscope_nope_total", (), 1.0), Sample(C, (), 1.0),
                                Sample(G, ("G1",), 3.0)], 0.0)
    assert (result.accepted, result.rejected) == (1, 2)
    assert store.value("kvscope_store_rejected_readings_total", ("c",)) == 2.0


def test_a_rejected_reading_holds_no_memory(store: Store) -> None:
    wrong_type = [HistogramSample(C, (f"dev{i}",), ((math.inf, 1.0),), 1.0, 1.0) for i in range(50)]
    wrong_type += [Sample(H, (), 1.0)]
    assert store.ingest("c", wrong_type, 0.0).rejected == 51
    assert store.size() == (1, 1)  # the rejected-readings counter alone


def test_a_negative_counter_value_is_rejected_and_the_total_never_falls(store: Store) -> None:
    """A source counter of 100, then -50, then 10 exported 100 -> 50 -> 110; -50 is no counter value."""
    exported = []
    for i, v in enumerate((100.0, -50.0, 10.0)):
        result = store.ingest("c", [Sample(C, ("sda",), v)], now=float(i))
        exported.append(store.values(C).get(("sda",)))
        assert result.invalid == (v < 0) and result.rejected == 0
    assert exported == [100.0, None, 110.0]  # left out while invalid, then a reset from 100
    assert store.value("kvscope_store_invalid_values_total", ("c",)) == 1.0
    assert store.value("kvscope_source_resets_total", ("c",)) == 1.0


@pytest.mark.parametrize("value", [-1e20, -0.5, math.nan, math.inf, -math.inf])
def test_an_impossible_first_counter_value_is_never_exported(store: Store, value: float) -> None:
    store.ingest("c", [Sample(C, ("sda",), value)], now=0.0)
    assert store.values(C) == {} and store.value(C, ("sda",)) is None  # no series, no memory
    assert store.value("kvscope_store_invalid_values_total", ("c",)) == 1.0
    store.ingest("c", [Sample(C, ("sda",), 7.0)], now=1.0)
    assert store.values(C) == {("sda",): 7.0}


def test_a_counter_at_or_above_its_wrap_modulus_is_rejected(store: Store) -> None:
    assert feed(store, 10.0, 2.0**32, 20.0, modulus=2**32) == [10.0, 10.0, 20.0]
    assert store.value("kvscope_store_invalid_values_total", ("c",)) == 1.0


def test_gauges_may_be_negative(store: Store) -> None:
    assert store.ingest("c", [Sample(G, ("G1",), -3.0)], now=0.0).invalid == 0
    assert store.values(G) == {("G1",): -3.0}


@pytest.mark.parametrize(("counts", "total"), [((1.0, -2.0), 0.5), ((math.nan, 2.0), 0.5), ((1.0, 2.0), math.inf)])
def test_impossible_histograms_are_rejected(store: Store, counts: tuple[float, float], total: float) -> None:
    good = HistogramSample(H, (), ((0.1, 1.0), (math.inf, 2.0)), 0.5, 2.0)
    store.ingest("c", [good], now=0.0)
    bad = HistogramSample(H, (), ((0.1, counts[0]), (math.inf, counts[1])), total, counts[1])
    assert store.ingest("c", [bad], now=1.0).invalid == 1
    assert store.histogram(H, ()) == ((0.1, math.inf), [1.0, 2.0], 0.5, 2.0)
    assert () not in store.values(H)


def test_a_last_value_past_the_wrap_modulus_does_not_wrap(store: Store) -> None:
    """A counter read once without its modulus at 1.8e139 and then with a 32-bit modulus at 5: a "wrap"
    took the total down to 0 (found by tests/lib/testkit/fuzz.py). Only a value below the modulus can wrap."""
    store.ingest("c", [Sample(C, ("sda",), 1.85e139)], now=0.0)
    store.ingest("c", [Sample(C, ("sda",), 5.0, 2.0**32)], now=1.0)
    assert store.value(C, ("sda",)) == 1.85e139 + 5.0  # a reset


def test_a_total_past_the_largest_float_is_rejected_not_infinite(store: Store) -> None:
    store.ingest("c", [Sample(C, ("sda",), 1e308)], now=0.0)
    store.ingest("c", [Sample(C, ("sda",), 1.0)], now=1.0)  # a reset: 1e308 + 1
    result = store.ingest("c", [Sample(C, ("sda",), 1.7e308)], now=2.0)  # would pass the largest float
    assert result.invalid == 1
    assert store.value(C, ("sda",)) == 1e308 + 1.0 and store.values(C) == {}
