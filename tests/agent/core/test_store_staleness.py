"""Staleness in the store: omitted and failed series leave the exposition as Prometheus would see a
vanished target series, their state is held for `stale_after` collections, and memory stays bounded
under label churn."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvscope.agent.core.catalogue import AGENT_METRICS, Catalogue, counter, gauge, histogram
from kvscope.agent.core.label_caps import LabelCaps
from kvscope.agent.core.readings import HistogramSample, Reading, Sample
from kvscope.agent.core.store import Store
from kvscope.exporters.prometheus.exposition import TextRenderer

C = "kvscope_test_bytes_total"
G = "kvscope_test_blocks"
H = "kvscope_test_seconds"
CATALOGUE = Catalogue([
    counter(C, "bytes", ("device",), "test counter", "test"),
    gauge(G, "blocks", ("tier",), "test gauge", "test"),
    histogram(H, "seconds", ("model",), "test histogram", "test"),
    *AGENT_METRICS,
])
INF = math.inf


def hist(model: str, low: float, total: float, seconds: float) -> HistogramSample:
    return HistogramSample(H, (model,), ((0.1, low), (INF, total)), seconds, total)


def counters(store: Store, *values: tuple[str, float], owner: str = "c") -> None:
    store.ingest(owner, [Sample(C, (device,), v) for device, v in values], 0.0)


def test_stale_after_must_be_a_positive_keyword() -> None:
    for bad in (0, -1):
        with pytest.raises(ValueError, match="stale_after"):
            Store(CATALOGUE, stale_after=bad)
    with pytest.raises(TypeError):
        Store(CATALOGUE, 3)  # type: ignore[misc]
    assert Store(CATALOGUE, stale_after=1).size() == (0, 0)


def test_omitted_series_leaves_the_exposition_at_once_and_stays_held() -> None:
    store = Store(CATALOGUE, stale_after=3)
    counters(store, ("sda", 10.0), ("sdb", 5.0))
    assert store.size() == (2, 2)
    counters(store, ("sda", 20.0))
    assert store.values(C) == {("sda",): 20.0}
    assert b"sdb" not in TextRenderer(store).render()
    assert store.size() == (2, 1)
    assert store.value(C, ("sdb",)) == 5.0  # held, not exported


@pytest.mark.parametrize("stale_after", [1, 2, 5])
def test_counter_back_before_stale_after_omissions_continues_its_total(stale_after: int) -> None:
    store = Store(CATALOGUE, stale_after=stale_after)
    counters(store, ("sda", 1.0), ("sdb", 100.0))
    counters(store, ("sda", 1.0), ("sdb", 20.0))  # a reset: the total is 120, above the source
    for _ in range(stale_after - 1):
        counters(store, ("sda", 1.0))
    counters(store, ("sda", 1.0), ("sdb", 30.0))
    assert store.values(C)[("sdb",)] == 130.0
    assert store.value("kvscope_source_resets_total", ("c",)) == 1.0


def test_a_series_back_and_omitted_again_counts_its_omissions_afresh() -> None:
    store = Store(CATALOGUE, stale_after=3)
    counters(store, ("sda", 1.0), ("sdb", 100.0))
    counters(store, ("sda", 1.0), ("sdb", 20.0))  # total 120
    for back in (False, True, False, False, True):
        counters(store, ("sda", 1.0), *([("sdb", 20.0)] if back else []))
    assert store.values(C)[("sdb",)] == 120.0


@pytest.mark.parametrize("stale_after", [1, 2, 5])
def test_counter_omitted_stale_after_times_is_forgotten_and_starts_afresh(stale_after: int) -> None:
    store = Store(CATALOGUE, stale_after=stale_after)
    counters(store, ("sda", 1.0), ("sdb", 100.0))
    counters(store, ("sda", 1.0), ("sdb", 20.0))  # a reset: the total is 120, above the source
    for i in range(stale_after):
        assert store.value(C, ("sdb",)) == 120.0, f"forgotten after {i} omissions"
        counters(store, ("sda", 1.0))
    assert store.value(C, ("sdb",)) is None
    assert store.size() == (2, 2)  # sda and the resets counter
    counters(store, ("sda", 1.0), ("sdb", 30.0))
    # afresh from the source's value: the exported total goes down once (a reset to Prometheus),
    # and it is not one the store counts, since it never saw the source go back
    assert store.values(C)[("sdb",)] == 30.0
    assert store.value("kvscope_source_resets_total", ("c",)) == 1.0


def test_histogram_back_within_the_window_continues_and_after_it_starts_afresh() -> None:
    store = Store(CATALOGUE, stale_after=2)
    store.ingest("v", [hist("m", 1, 2, 0.5)], 0.0)
    store.ingest("v", [hist("m", 3, 5, 1.5)], 0.0)
    store.ingest("v", [], 0.0)
    store.ingest("v", [hist("m", 1, 1, 0.25)], 0.0)  # back after one omission, the engine restarted
    assert store.histogram(H, ("m",)) == ((0.1, INF), [4.0, 6.0], 1.75, 6.0)
    store.ingest("v", [], 0.0)
    store.ingest("v", [], 0.0)
    with pytest.raises(KeyError):
        store.histogram(H, ("m",))
    store.ingest("v", [hist("m", 2, 3, 0.75)], 0.0)
    assert store.histogram(H, ("m",)) == ((0.1, INF), [2.0, 3.0], 0.75, 3.0)


def test_failed_collections_keep_the_last_values_exported_until_the_stale_after_th() -> None:
    store = Store(CATALOGUE, stale_after=3)
    store.ingest("c", [Sample(C, ("sda",), 10.0), hist("m", 1, 2, 0.5)], 0.0)
    rendered = TextRenderer(store).render()
    for _ in range(2):
        store.collection_failed("c", 0.0)
        assert TextRenderer(store).render() == rendered
    store.collection_failed("c", 0.0)
    assert store.values(C) == {} and store.values(H) == {}
    assert TextRenderer(store).render() == b""
    assert store.size() == (2, 0)
    for _ in range(10):  # state is held however long the owner keeps failing
        store.collection_failed("c", 0.0)
    assert store.size() == (2, 0)
    store.ingest("c", [Sample(C, ("sda",), 15.0), hist("m", 2, 4, 1.0)], 0.0)
    assert store.values(C) == {("sda",): 15.0}
    assert store.histogram(H, ("m",)) == ((0.1, INF), [2.0, 4.0], 1.0, 4.0)


def test_a_successful_collection_resets_the_failure_count() -> None:
    store = Store(CATALOGUE, stale_after=3)
    counters(store, ("sda", 10.0))
    store.collection_failed("c", 0.0)
    store.collection_failed("c", 0.0)
    counters(store, ("sda", 12.0))
    store.collection_failed("c", 0.0)
    store.collection_failed("c", 0.0)
    assert store.values(C) == {("sda",): 12.0}


def test_failures_do_not_advance_the_forgetting_of_omitted_series() -> None:
    store = Store(CATALOGUE, stale_after=2)
    counters(store, ("sda", 1.0), ("sdb", 100.0))
    counters(store, ("sda", 1.0), ("sdb", 20.0))  # total 120
    counters(store, ("sda", 1.0))
    for _ in range(5):
        store.collection_failed("c", 0.0)
    counters(store, ("sda", 1.0), ("sdb", 30.0))
    assert store.values(C)[("sdb",)] == 130.0


def test_a_failing_owner_leaves_other_owners_alone() -> None:
    store = Store(CATALOGUE, stale_after=1)
    counters(store, ("sda", 1.0), owner="disk")
    store.ingest("engine", [Sample(G, ("G1",), 3.0)], 0.0)
    store.collection_failed("engine", 0.0)
    store.collection_failed("never-succeeded", 0.0)
    assert store.values(C) == {("sda",): 1.0}
    assert store.values(G) == {}


def test_agent_internal_series_are_never_dropped() -> None:
    store = Store(CATALOGUE, stale_after=1)
    store.set_gauge("kvscope_collector_up", ("c",), 0.0, 0.0)
    store.bump("kvscope_collector_errors_total", ("c",), 1.0, 0.0)
    counters(store, ("sda", 10.0), ("sda", 5.0))  # a reset, counted in an internal counter
    for _ in range(3):
        store.collection_failed("c", 0.0)
        counters(store)
    assert store.values("kvscope_collector_up") == {("c",): 0.0}
    assert store.values("kvscope_collector_errors_total") == {("c",): 1.0}
    assert store.values("kvscope_source_resets_total") == {("c",): 1.0}


def test_a_series_another_owner_still_reports_is_not_forgotten() -> None:
    store = Store(CATALOGUE, stale_after=2)
    renderer = TextRenderer(store)
    counters(store, ("shared", 10.0), owner="a")
    counters(store, ("shared", 10.0), owner="b")
    counters(store, ("shared", 2.0), owner="b")  # a reset: the total is 12
    for v in (3.0, 4.0, 5.0):
        counters(store, owner="a")
        renderer.render()
        counters(store, ("shared", v), owner="b")
    assert store.values(C) == {("shared",): 15.0}


# -- label churn ---------------------------------------------------------------------------------

STABLE = 1000
CHURN = 50


def churn_collection(i: int) -> list[Reading]:
    """1,000 stable series (counters, gauges, histograms) and 50 whose label values are new each time."""
    out: list[Reading] = []
    for n in range(STABLE):
        if n % 100 == 0:
            out.append(hist(f"model-{n}", i, 2 * i, 0.1 * i))
        elif n % 2:
            out.append(Sample(C, (f"nvme{n}n1",), 1000.0 * i + n))
        else:
            out.append(Sample(G, (f"G{n}",), float(n)))
    out.extend(Sample(C, (f"req-{i}-{k}",), float(k)) for k in range(CHURN))
    return out


def rendered_series(text: bytes) -> set[tuple[str, frozenset[tuple[str, str]]]]:
    """The (metric, labels) pairs a text exposition holds, histograms as one series each."""
    out = set()
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            labels = frozenset((k, v) for k, v in sample.labels.items() if k != "le")
            out.add((family.name if family.type != "counter" else f"{family.name}_total", labels))
    return out


def expected_series(readings: list[Reading]) -> set[tuple[str, frozenset[tuple[str, str]]]]:
    return {(r.name, frozenset(zip(CATALOGUE[r.name].labels, r.labels, strict=True))) for r in readings}


@pytest.mark.parametrize("stale_after", [1, 5])
def test_label_churn_keeps_memory_bounded_and_the_exposition_exact(stale_after: int) -> None:
    # 500 devices and churned ones: uncapped here, this is about what the store holds (label_caps.py caps them)
    store = Store(CATALOGUE, stale_after=stale_after, label_caps=LabelCaps({}))
    renderer = TextRenderer(store)
    for i in range(60):
        readings = churn_collection(i)
        store.ingest("churn", readings, float(i))
        held, exported = store.size()
        assert exported == STABLE + CHURN
        assert held <= exported + stale_after * CHURN
        # what is held: this collection's series plus the churned ones of the omissions not yet
        # stale_after long
        assert held == exported + min(i, stale_after - 1) * CHURN
        assert rendered_series(renderer.render()) == expected_series(readings)
