"""Labels whose values nothing bounds are capped in the store, with the overflow counted."""

from __future__ import annotations

from kvscope.agent.core.catalogue import AGENT_METRICS, Catalogue, counter, gauge
from kvscope.agent.core.label_caps import LabelCaps
from kvscope.agent.core.readings import Sample
from kvscope.agent.core.store import Store

DISK = "kvscope_test_read_bytes_total"
UP = "kvscope_test_target_up"


def capped_store(caps: dict[str, int], stale_after: int = 5) -> Store:
    specs = [counter(DISK, "bytes", ("device",), "test", "test"),
             gauge(UP, "", ("collector", "target"), "test", "test"), *AGENT_METRICS]
    return Store(Catalogue(specs), stale_after=stale_after, label_caps=LabelCaps(caps))


def disks(*names: str) -> list[Sample]:
    return [Sample(DISK, (name,), 1.0) for name in names]


def test_new_values_past_the_cap_are_refused_and_counted() -> None:
    store = capped_store({"device": 3})
    result = store.ingest("disk", disks("sda", "sdb", "sdc", "sdd", "sde"), now=0.0)
    assert sorted(store.values(DISK)) == [("sda",), ("sdb",), ("sdc",)]
    assert result.accepted == 3 and result.capped == {"device": 2}
    assert store.value("kvscope_store_capped_readings_total", ("disk", "device")) == 2
    # the held values keep being admitted, the refused ones keep being counted
    store.ingest("disk", disks("sda", "sdb", "sdc", "sdd", "sde"), now=1.0)
    assert store.value(DISK, ("sda",)) == 1.0
    assert store.value("kvscope_store_capped_readings_total", ("disk", "device")) == 4


def test_the_cap_is_on_values_not_series_and_spans_metrics() -> None:
    store = capped_store({"target": 2})
    store.ingest("a", [Sample(UP, ("a", "http://x"), 1.0), Sample(UP, ("a", "http://y"), 1.0)], now=0.0)
    # another collector with a value already held is admitted; a third value is not
    result = store.ingest("b", [Sample(UP, ("b", "http://x"), 1.0), Sample(UP, ("b", "http://z"), 1.0)], now=0.0)
    assert result.capped == {"target": 1}
    assert sorted(store.values(UP)) == [("a", "http://x"), ("a", "http://y"), ("b", "http://x")]


def test_a_value_is_released_once_its_last_series_is_forgotten() -> None:
    store = capped_store({"device": 1}, stale_after=1)
    store.ingest("disk", disks("sda"), now=0.0)
    assert store.ingest("disk", disks("sdb"), now=1.0).capped == {"device": 1}  # sda forgotten after this one
    assert store.ingest("disk", disks("sdb"), now=2.0).capped == {}
    assert list(store.values(DISK)) == [("sdb",)]


def test_labels_without_a_cap_are_not_limited() -> None:
    store = capped_store({"target": 1})
    store.ingest("disk", disks(*(f"sd{i}" for i in range(300))), now=0.0)
    assert len(store.values(DISK)) == 300
