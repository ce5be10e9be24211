"""The store: monotonic counters across resets and wraps, histograms, series ownership."""

from __future__ import annotations

import itertools
import math

import pytest

from kvscope.agent.catalogue import Catalogue, counter, gauge, histogram
from kvscope.agent.readings import HistogramSample, Sample
from kvscope.agent.store import Store

C = "kvscope_test_bytes_total"
G = "kvscope_test_blocks"
H = "kvscope_test_seconds"


@pytest.fixture
def store() -> Store:
    from kvscope.agent.catalogue import AGENT_METRICS

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
