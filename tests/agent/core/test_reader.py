"""The store reader: one snapshot a window, growth that knows the store's resets and forgetting, labels by name."""

from __future__ import annotations

import threading

import pytest

from kvscope.agent.core import contract
from kvscope.agent.core.catalogue import AGENT_METRICS, Catalogue
from kvscope.agent.core.reader import StoreReader
from kvscope.agent.core.readings import HistogramSample, Sample
from kvscope.agent.core.store import Store

E = ("vllm", "llama", "0")
MOVED = contract.KV_TRANSFER_BYTES
HITS = contract.KV_HIT_TOKENS


def make_store(stale_after: int = 3) -> Store:
    return Store(Catalogue([*AGENT_METRICS, *contract.CONTRACT_METRICS]), stale_after=stale_after)


def moved(value: float, src: str = "G2") -> Sample:
    return Sample(MOVED, (*E, src, "G1"), value)


def test_growth_between_windows_and_the_first_sight() -> None:
    store = make_store()
    reader = StoreReader(store, [MOVED])
    store.ingest("vllm", [moved(100.0)], 0.0)
    (first,) = reader.window().series(MOVED)
    assert (first.value, first.growth, first.rate_growth, first.is_new) == (100.0, 100.0, 0.0, True)
    store.ingest("vllm", [moved(130.0)], 1.0)
    (second,) = reader.window().series(MOVED)
    assert (second.growth, second.rate_growth, second.is_new) == (30.0, 30.0, False)
    (third,) = reader.window().series(MOVED)  # nothing new in the store: no growth
    assert third.growth == 0.0


def test_a_source_reset_is_the_stores_and_the_reader_sees_only_growth() -> None:
    store = make_store()
    reader = StoreReader(store, [MOVED])
    store.ingest("vllm", [moved(500.0)], 0.0)
    reader.window()
    store.ingest("vllm", [moved(20.0)], 1.0)  # the engine restarted: its counter starts again
    (point,) = reader.window().series(MOVED)
    assert (point.value, point.growth) == (520.0, 20.0)


def test_labels_by_name_and_the_metric_index() -> None:
    store = make_store()
    reader = StoreReader(store, [MOVED, HITS])
    store.ingest("vllm", [moved(1.0, "G2"), moved(2.0, "G4"), Sample(HITS, (*E, "G4"), 7.0)], 0.0)
    window = reader.window()
    by_src = {p.labels["src"]: p.value for p in window.series(MOVED)}
    assert by_src == {"G2": 1.0, "G4": 2.0}
    (hit,) = window.series(HITS)
    assert dict(hit.labels) == {"engine": "vllm", "model": "llama", "dp_rank": "0", "tier": "G4"}
    assert window.get(MOVED, (*E, "G4", "G1")) is not None and window.get(MOVED, (*E, "G3", "G1")) is None
    assert store.values(HITS) == {(*E, "G4"): 7.0}  # one metric's series, not every key's


def test_a_series_held_but_omitted_keeps_its_growth_for_when_it_comes_back() -> None:
    """The source left it out for a collection (below stale_after): the store keeps its total, and so the
    reader keeps its previous value; its growth on return is what it grew meanwhile, not its whole total."""
    store = make_store(stale_after=3)
    reader = StoreReader(store, [MOVED])
    store.ingest("vllm", [moved(100.0)], 0.0)
    reader.window()
    store.ingest("vllm", [], 1.0)
    window = reader.window()
    assert list(window.series(MOVED)) == [] and window.values(MOVED) == {}  # not exported: not read as a point
    assert window.value(MOVED, (*E, "G2", "G1")) == 100.0 == store.value(MOVED, (*E, "G2", "G1"))  # but held
    assert len(reader) == 1  # and remembered, as the store holds it
    store.ingest("vllm", [moved(140.0)], 2.0)
    (point,) = reader.window().series(MOVED)
    assert (point.growth, point.is_new) == (40.0, False)


def test_a_series_forgotten_and_made_again_starts_afresh() -> None:
    """Omitted for stale_after collections, the store forgets it, and so does the reader; back, it is a new
    series (a new `born`), whatever its value: never the difference to the old one."""
    store = make_store(stale_after=2)
    reader = StoreReader(store, [MOVED])
    store.ingest("vllm", [moved(100.0)], 0.0)
    reader.window()
    for t in (1.0, 2.0):
        store.ingest("vllm", [], t)
    reader.window()
    assert len(reader) == 0  # the reader's memory follows the store's
    store.ingest("vllm", [moved(150.0)], 3.0)
    (point,) = reader.window().series(MOVED)
    assert (point.growth, point.rate_growth, point.is_new) == (150.0, 0.0, True)


def test_histogram_count_and_sum_grow_together() -> None:
    store = make_store()
    reader = StoreReader(store, [contract.TTFT_SECONDS])
    for n, (count, total) in enumerate(((2.0, 1.5), (5.0, 4.0))):
        store.ingest("vllm", [HistogramSample(contract.TTFT_SECONDS, E, ((1.0, count), (float("inf"), count)),
                                              total, count)], float(n))
        (point,) = reader.window().series(contract.TTFT_SECONDS)
    assert (point.value, point.growth, point.sum, point.sum_growth) == (5.0, 3.0, 4.0, 2.5)


def test_a_window_is_one_moment_of_the_store() -> None:
    """Two metrics a collector writes in one ingest are read together: a writer racing the reader never
    leaves a window with one metric's new value beside the other's old one."""
    store = make_store()
    reader = StoreReader(store, [MOVED, contract.KV_TRANSFER_SECONDS])
    stop = threading.Event()

    def write() -> None:
        n = 0.0
        while not stop.is_set():
            n += 1.0
            store.ingest("vllm", [moved(n), Sample(contract.KV_TRANSFER_SECONDS, (*E, "G2", "G1"), n)], n)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for _ in range(2000):
            window = reader.window()
            a, b = list(window.series(MOVED)), list(window.series(contract.KV_TRANSFER_SECONDS))
            assert [p.value for p in a] == [p.value for p in b]
    finally:
        stop.set()
        writer.join()


def test_a_reader_names_only_catalogued_metrics() -> None:
    with pytest.raises(KeyError, match="kvscope_no_such_total"):
        StoreReader(make_store(), ["kvscope_no_such_total"])
