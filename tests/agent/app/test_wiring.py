"""The wiring builds each shared object once, from its own option, and hands the same object to every user."""

from __future__ import annotations

from kvscope.agent.analyses.correlation.analysis import CorrelationEngine
from kvscope.agent.analyses.whatif.analysis import WhatIfAnalysis
from kvscope.agent.app.wiring import build_agent, components
from kvscope.agent.config.settings import load_config
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
                   "[analyses.whatif]\nenabled = false\n")
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
