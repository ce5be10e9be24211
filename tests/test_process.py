"""process: the agent's own CPU, memory and descriptors under the standard process_* names."""

from __future__ import annotations

import os
from collections.abc import Iterator

import psutil
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from kvscope.agent.catalogue import AGENT_METRICS, Catalogue
from kvscope.agent.pipeline import CollectorContext
from kvscope.agent.readings import Sample
from kvscope.agent.store import Store
from kvscope.collectors import process
from kvscope.collectors.process import ProcessCollector


class FakeSource:
    """Families as prometheus-client's ProcessCollector yields them, plus one the collector must skip."""

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("process_resident_memory_bytes", "Resident memory size in bytes.", 31_000_000)
        yield CounterMetricFamily("process_cpu_seconds", "Total user and system CPU time spent in seconds.", 1.75)
        yield GaugeMetricFamily("process_open_fds", "Number of open file descriptors.", 17)
        yield GaugeMetricFamily("python_gc_objects", "not ours", 5)


def as_dict(readings: list[Sample]) -> dict[str, float]:
    return {r.name: r.value for r in readings}


def test_takes_the_standard_samples_by_their_exposed_names() -> None:
    out = ProcessCollector(FakeSource()).collect()
    assert as_dict([r for r in out if isinstance(r, Sample)]) == {
        "process_cpu_seconds_total": 1.75,
        "process_resident_memory_bytes": 31_000_000,
        "process_open_fds": 17,
    }


def test_factory_describes_this_process() -> None:
    c = process.SPEC.factory(process.ProcessOptions(), CollectorContext(proc_root="/nonexistent"))
    before = as_dict([r for r in c.collect() if isinstance(r, Sample)])
    assert set(before) == {m.name for m in process.METRICS}
    with open(os.devnull, "rb"):  # one more descriptor while it is open
        during = as_dict([r for r in c.collect() if isinstance(r, Sample)])
    assert during["process_open_fds"] == before["process_open_fds"] + 1
    own = psutil.Process()
    assert 0.5 * own.memory_info().rss < during["process_resident_memory_bytes"] < 2 * own.memory_info().rss
    assert during["process_cpu_seconds_total"] >= before["process_cpu_seconds_total"] > 0
    assert abs(during["process_start_time_seconds"] - own.create_time()) < 2.0


def test_metrics_are_catalogued_and_stored() -> None:
    store = Store(Catalogue([*AGENT_METRICS, *process.METRICS]))
    result = store.ingest("process", ProcessCollector(FakeSource()).collect(), 0.0)
    assert (result.accepted, result.rejected) == (3, 0)
    assert store.value("process_cpu_seconds_total", ()) == 1.75
