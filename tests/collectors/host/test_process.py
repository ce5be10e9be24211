"""process: the agent's own CPU, memory and descriptors under the standard process_* names."""

from __future__ import annotations

import os

import psutil
from prometheus_client.process_collector import ProcessCollector as ClientProcessCollector

from kvscope.agent.core.catalogue import AGENT_METRICS, Catalogue
from kvscope.agent.core.pipeline import CollectorContext
from kvscope.agent.core.readings import Sample
from kvscope.agent.core.store import Store
from kvscope.collectors.host import process
from kvscope.collectors.host.process import ProcessCollector, start_time


def fake_source() -> dict[str, float]:
    """Three of the figures, plus one the collector must skip."""
    return {"process_resident_memory_bytes": 31_000_000, "process_cpu_seconds_total": 1.75,
            "process_open_fds": 17, "python_gc_objects": 5}


def as_dict(readings: list[Sample]) -> dict[str, float]:
    return {r.name: r.value for r in readings}


def test_takes_the_standard_samples_by_their_exposed_names() -> None:
    out = ProcessCollector(fake_source).collect()
    assert as_dict([r for r in out if isinstance(r, Sample)]) == {
        "process_cpu_seconds_total": 1.75,
        "process_resident_memory_bytes": 31_000_000,
        "process_open_fds": 17,
    }


def test_factory_describes_this_process() -> None:
    c = process.SPEC.factory(process.ProcessOptions(), CollectorContext(proc_root="/nonexistent"))
    before = as_dict([r for r in c.collect() if isinstance(r, Sample)])
    assert set(before) == {m.name for m in process.METRICS}
    # 20 more descriptors while they are open. Threads other tests left behind may open or close one of
    # their own meanwhile, so the exact difference must show in one of three tries, not necessarily the first.
    differences = []
    for _ in range(3):
        before = as_dict([r for r in c.collect() if isinstance(r, Sample)])
        extra = [os.open(os.devnull, os.O_RDONLY) for _ in range(20)]
        try:
            during = as_dict([r for r in c.collect() if isinstance(r, Sample)])
        finally:
            for fd in extra:
                os.close(fd)
        differences.append(during["process_open_fds"] - before["process_open_fds"])
        if differences[-1] == 20:
            break
    assert differences[-1] == 20, differences
    own = psutil.Process()
    assert 0.5 * own.memory_info().rss < during["process_resident_memory_bytes"] < 2 * own.memory_info().rss
    assert during["process_cpu_seconds_total"] >= before["process_cpu_seconds_total"] > 0
    assert abs(during["process_start_time_seconds"] - own.create_time()) < 2.0


def test_the_same_figures_as_prometheus_clients_process_collector() -> None:
    theirs = {s.name: s.value for family in ClientProcessCollector(registry=None).collect() for s in family.samples}
    ours = as_dict([r for r in process.SPEC.factory(process.ProcessOptions(), CollectorContext()).collect()
                    if isinstance(r, Sample)])
    assert set(ours) == set(theirs)
    for name in ("process_virtual_memory_bytes", "process_resident_memory_bytes"):
        assert abs(ours[name] - theirs[name]) < 0.2 * theirs[name]
    assert abs(ours["process_open_fds"] - theirs["process_open_fds"]) <= 1
    assert ours["process_max_fds"] == theirs["process_max_fds"]
    assert ours["process_start_time_seconds"] == theirs["process_start_time_seconds"]
    assert abs(ours["process_cpu_seconds_total"] - theirs["process_cpu_seconds_total"]) < 0.05


def test_start_time_from_stat_lines() -> None:
    stat = "4242 (name with ) and spaces) S 1 " + " ".join(["0"] * 17) + " 12345 0 0"
    assert start_time(stat, "cpu 1 2 3\nbtime 1700000000\n", 100.0) == 1700000000 + 123.45


def test_metrics_are_catalogued_and_stored() -> None:
    store = Store(Catalogue([*AGENT_METRICS, *process.METRICS]))
    result = store.ingest("process", ProcessCollector(fake_source).collect(), 0.0)
    assert (result.accepted, result.rejected) == (3, 0)
    assert store.value("process_cpu_seconds_total", ()) == 1.75
