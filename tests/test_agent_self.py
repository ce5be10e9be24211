"""agent_self: the agent's own CPU, memory and descriptors."""

from __future__ import annotations

import os
from collections import namedtuple

import psutil

from kvscope.agent.catalogue import AGENT_METRICS, Catalogue
from kvscope.agent.readings import Sample
from kvscope.agent.store import Store
from kvscope.collectors import agent_self
from kvscope.collectors.agent_self import AgentSelfCollector
from kvscope.collectors.base import CollectorContext

Times = namedtuple("Times", "user system children_user children_system")
Memory = namedtuple("Memory", "rss vms")


class FakeProcess:
    def __init__(self, user: float, system: float, rss: int, fds: int) -> None:
        self.times = Times(user, system, 99.0, 99.0)  # children's time is not ours
        self.rss, self.fds = rss, fds

    def cpu_times(self) -> Times:
        return self.times

    def memory_info(self) -> Memory:
        return Memory(self.rss, 10 * self.rss)

    def num_fds(self) -> int:
        return self.fds


def as_dict(readings: list[Sample]) -> dict[str, float]:
    return {r.name: r.value for r in readings}


def test_reads_user_plus_system_rss_and_fds_of_the_given_process() -> None:
    out = AgentSelfCollector(FakeProcess(1.25, 0.5, 31_000_000, 17)).collect()
    assert as_dict([r for r in out if isinstance(r, Sample)]) == {
        "kvscope_agent_cpu_seconds_total": 1.75,
        "kvscope_agent_resident_memory_bytes": 31_000_000,
        "kvscope_agent_open_fds": 17,
    }


def test_factory_describes_this_process() -> None:
    c = agent_self.SPEC.factory(agent_self.AgentSelfOptions(), CollectorContext(proc_root="/nonexistent"))
    before = as_dict([r for r in c.collect() if isinstance(r, Sample)])
    with open(os.devnull, "rb"):  # one more descriptor while it is open
        during = as_dict([r for r in c.collect() if isinstance(r, Sample)])
    assert during["kvscope_agent_open_fds"] == before["kvscope_agent_open_fds"] + 1
    own = psutil.Process().memory_info().rss
    assert 0.5 * own < during["kvscope_agent_resident_memory_bytes"] < 2 * own
    assert during["kvscope_agent_cpu_seconds_total"] >= before["kvscope_agent_cpu_seconds_total"] > 0


def test_metrics_are_catalogued_and_stored() -> None:
    store = Store(Catalogue([*AGENT_METRICS, *agent_self.METRICS]))
    result = store.ingest("agent_self", AgentSelfCollector(FakeProcess(2.0, 1.0, 1, 3)).collect(), 0.0)
    assert (result.accepted, result.rejected) == (3, 0)
    assert store.value("kvscope_agent_cpu_seconds_total", ()) == 3.0
