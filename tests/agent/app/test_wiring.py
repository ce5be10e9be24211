"""The wiring builds each shared object once, from its own option, and hands the same object to every user."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from kvscope.agent.analyses.correlation.analysis import CorrelationEngine
from kvscope.agent.analyses.whatif.analysis import WhatIfAnalysis
from kvscope.agent.app import wiring as wiring_module
from kvscope.agent.app.wiring import build_agent, components
from kvscope.agent.config.settings import load_config
from kvscope.agent.core.pipeline import AnalysisInputs, AnalysisSpec, CollectorContext, CollectorSpec, Components
from kvscope.agent.core.readings import Reading
from kvscope.agent.core.records import RecordBuffer
from kvscope.agent.core.streams import KV_ACCESS, Stream, StreamUse
from kvscope.collectors.gpu.nvml import NvmlCollector
from kvscope.collectors.requests.otlp_traces import OtlpTracesReceiver
from kvscope.exporters.jsonl import JsonlSink

BASE = "[exporters.prometheus]\nenabled = false\n[collectors.otlp_traces]\nenabled = true\nlisten = '127.0.0.1:0'\n"


def test_record_buffer_is_sized_by_its_option_whatever_else_is_enabled() -> None:
    agent = build_agent(load_config(BASE + "[analyses.correlation]\nrecord_buffer = 10\n", components(), environ={}))
    receiver = agent.collectors["otlp_traces"]
    assert isinstance(receiver, OtlpTracesReceiver)
    assert agent.request_records.capacity == 10
    assert receiver._records is agent.request_records  # the receiver fills the buffer the analysis drains
    engine = agent.analyses["correlation"]
    assert isinstance(engine, CorrelationEngine) and engine._records is agent.request_records


def test_the_gpu_collector_feeds_fetch_stall_and_a_stand_in_replaces_it() -> None:
    agent = build_agent(load_config(BASE, components(), environ={}))
    nvml = agent.collectors["nvml"]
    assert isinstance(nvml, NvmlCollector)
    engine = agent.analyses["correlation"]
    assert isinstance(engine, CorrelationEngine) and engine._stall._gpus is nvml

    class DeviceSlot:
        def gpus(self) -> dict[str, str]:
            return {"0": "slot"}

        def recent_samples(self, gpu: str) -> list[tuple[float, float, float]]:
            return []

    slot = DeviceSlot()
    engine = build_agent(load_config(BASE, components(), environ={}), gpu_intervals=slot).analyses["correlation"]
    assert isinstance(engine, CorrelationEngine) and engine._stall._gpus is slot


def test_the_jsonl_sink_is_built_only_when_enabled_and_receives_attributions(tmp_path: object) -> None:
    agent = build_agent(load_config(BASE, components(), environ={}))
    assert not [s for s in agent.sinks if isinstance(s, JsonlSink)]
    path = f"{tmp_path}/requests.jsonl"
    agent = build_agent(load_config(BASE + f"[exporters.jsonl]\nenabled = true\npath = '{path}'\n", components(),
                                    environ={}))
    (sink,) = [s for s in agent.sinks if isinstance(s, JsonlSink)]
    engine = agent.analyses["correlation"]
    assert isinstance(engine, CorrelationEngine) and sink in engine._requests._sinks


def test_disabled_stages_are_not_built() -> None:
    text = BASE + ("[collectors.nvml]\nenabled = false\n[analyses.correlation]\nenabled = false\n"
                   "[analyses.whatif]\nenabled = false\n[analyses.value]\nenabled = false\n")
    agent = build_agent(load_config(text, components(), environ={}))
    assert "nvml" not in agent.collectors and not agent.analyses
    assert {job.name for job in agent.scheduler.jobs} == set(agent.collectors)


def test_the_whatif_analysis_is_idle_without_the_kv_event_collector() -> None:
    """With nothing to replay it must not wake the agent every interval (the idle agent's CPU, issue 16)."""
    idle = build_agent(load_config(BASE, components(), environ={}))
    whatif = idle.analyses["whatif"]
    assert isinstance(whatif, WhatIfAnalysis) and whatif.idle
    (job,) = [j for j in idle.scheduler.jobs if j.name == "whatif"]
    assert job.idle
    kv_events = "[collectors.vllm_kv_events]\nenabled = true\nendpoint = 'tcp://127.0.0.1:5557'\nmodel = 'm'\n"
    fed = build_agent(load_config(BASE + kv_events, components(), environ={}))
    whatif = fed.analyses["whatif"]
    assert isinstance(whatif, WhatIfAnalysis) and not whatif.idle
    (job,) = [j for j in fed.scheduler.jobs if j.name == "whatif"]
    assert not job.idle


def test_the_value_analysis_is_idle_when_nothing_it_values_runs() -> None:
    """Without the correlation analysis and without KV events to replay, it has no input: it must run once and
    not wake the agent every interval (it did: 2 context switches a second, ×4 node_exporter's CPU per 15 s
    scrape interval in bench_scrape)."""
    def value_job_idle(config: str) -> bool:
        agent = build_agent(load_config(config, components(), environ={}))
        (job,) = [j for j in agent.scheduler.jobs if j.name == "value"]
        assert job.idle == agent.analyses["value"].idle  # type: ignore[attr-defined]
        return job.idle

    correlation_off = "[analyses.correlation]\nenabled = false\n"
    kv_events = "[collectors.vllm_kv_events]\nenabled = true\nendpoint = 'tcp://127.0.0.1:5557'\nmodel = 'm'\n"
    assert value_job_idle(BASE + correlation_off)
    assert not value_job_idle(BASE)  # the correlation analysis' saved seconds per tier
    assert not value_job_idle(BASE + correlation_off + kv_events)  # the what-if's predictions
    assert value_job_idle(BASE + correlation_off + kv_events + "[analyses.whatif]\nenabled = false\n")


def test_the_kv_access_log_is_made_only_when_a_collector_writes_it_and_an_analysis_reads_it() -> None:
    kv_events = "[collectors.vllm_kv_events]\nenabled = true\nendpoint = 'tcp://127.0.0.1:5557'\nmodel = 'm'\n"
    both = build_agent(load_config(BASE + kv_events + "[analyses.whatif]\nqueue_blocks = 123\n", components(),
                                   environ={}))
    log = both.streams.get(KV_ACCESS)
    assert log is not None and log.queue_limit == 123  # sized by its reader's option
    assert both.analyses["whatif"]._access is log  # type: ignore[attr-defined]
    reader_off = build_agent(load_config(BASE + kv_events + "[analyses.whatif]\nenabled = false\n", components(),
                                         environ={}))
    assert reader_off.streams.get(KV_ACCESS) is None  # no access sampling for nobody
    writer_off = build_agent(load_config(BASE, components(), environ={}))
    assert writer_off.streams.get(KV_ACCESS) is None


def test_streams_are_connected_from_the_specs_alone() -> None:
    """A collector and an analysis the wiring has never heard of, joined by a stream only their specs name."""
    made: list[RecordBuffer] = []
    seen: dict[str, object] = {}

    def make(size: int) -> RecordBuffer:
        made.append(RecordBuffer(size))
        return made[-1]

    extra = Stream("test_stream", "a buffer between two test stages", make, default_size=7)

    class Source:  # a collector and an analysis in one: collect() and run()
        def collect(self) -> list[Reading]:
            return []

        def run(self) -> list[Reading]:
            return []

    def source(_options: object, context: CollectorContext) -> Source:
        seen["source"] = context.streams.get(extra)
        return Source()

    def sink(_options: object, inputs: AnalysisInputs) -> Source:
        seen["sink"] = inputs.streams.get(extra)
        return Source()

    @dataclass
    class Size:
        size: int = 42

    parts = components()
    collectors = {**parts.collectors, "source": CollectorSpec("source", "test", Size, source, (),
                                                              streams=StreamUse(writes=(extra,)))}
    analyses = {**parts.analyses, "sink": AnalysisSpec("sink", "test", Size, sink, (),
                                                       streams=StreamUse(reads={extra: lambda o: o.size}))}
    with_extra = Components(collectors, analyses, parts.sinks)
    build_agent(load_config(BASE, with_extra, environ={}), with_extra)
    assert len(made) == 1 and made[0].capacity == 42
    assert seen == {"source": made[0], "sink": made[0]}


def test_the_wiring_special_cases_no_stage() -> None:
    """No isinstance and no stage named in the wiring: what connects stages is in their specs."""
    tree = ast.parse(Path(wiring_module.__file__).read_text())
    calls = [n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    assert "isinstance" not in calls
    parts = components()
    names = {spec.name for spec in (*parts.collectors.values(), *parts.analyses.values(), *parts.sinks.values())}
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert names & strings == set()
