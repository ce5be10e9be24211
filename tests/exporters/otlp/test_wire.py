"""OTLP export over the wire, through the whole agent: vLLM-shaped spans in, attribution traces and the
store's metrics out, to receivers that decode with opentelemetry-proto (HTTP and gRPC); and a collector
that is down or slow, timed against /metrics.

No OpenTelemetry Collector with an OTLP receiver can be had from our package registries (see
shared/facts/dashboards.md), so there is no test through a real Collector.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvscope.agent.analyses.correlation.analysis import CorrelationEngine
from kvscope.agent.app.wiring import Agent, build_agent, components
from kvscope.agent.config.settings import load_config
from kvscope.collectors.requests.otlp_traces import PROTOBUF, Labels, OtlpTracesReceiver, decode_export
from kvscope.exporters.otlp.metrics import OtlpMetricsSink
from kvscope.exporters.otlp.spans import ROOT, STOP_GRACE, OtlpTracesSink
from testkit.http import free_port
from testkit.otlp_receiver import GrpcReceiver, HttpReceiver, Samples, prometheus_samples, wait_for
from testkit.paths import FIXTURES

FIXTURE = (FIXTURES / "correlation" / "otlp" / "llm_request.binpb").read_bytes()
ENGINE_SPANS = {r.request_id: r for r in decode_export(FIXTURE, PROTOBUF, Labels()).records}



@pytest.mark.parametrize(("keys", "built"), [("", set()), ("metrics = true", {OtlpMetricsSink}),
                                             ("traces = true", {OtlpTracesSink}),
                                             ("metrics = true\ntraces = true", {OtlpMetricsSink, OtlpTracesSink})])
def test_each_exporter_is_built_only_when_enabled(keys: str, built: set[type]) -> None:
    text = f"[exporters.prometheus]\nenabled = false\n[exporters.otlp]\n{keys}\n"
    agent = build_agent(load_config(text, components(), environ={}), environ={})
    otlp = [s for s in agent.sinks if isinstance(s, OtlpMetricsSink | OtlpTracesSink)]
    assert {type(s) for s in otlp} == built and len(otlp) == len(built)
    engine = agent.analyses["correlation"]
    assert isinstance(engine, CorrelationEngine)
    assert [s for s in engine._requests._sinks if isinstance(s, OtlpTracesSink)] == \
        [s for s in otlp if isinstance(s, OtlpTracesSink)]  # the analysis feeds the very sink the agent stops


def config(endpoint: str, tmp_path: Path, extra: str = "", interval: float = 0.2) -> str:
    return f"""
[exporters.prometheus]
listen = '127.0.0.1:0'
[exporters.jsonl]
enabled = true
path = '{tmp_path}/requests.jsonl'
[exporters.otlp]
metrics = true
traces = true
endpoint = '{endpoint}'
interval = {interval}
{extra}
[collectors.otlp_traces]
enabled = true
listen = '127.0.0.1:0'
model = 'openai/gpt-oss-120b'
[collectors.nvml]
enabled = false
[analyses.correlation]
interval = 0.2
"""


@pytest.fixture
def http_receiver() -> Iterator[HttpReceiver]:
    receiver = HttpReceiver()
    yield receiver
    receiver.close()


@pytest.fixture
def grpc_receiver() -> Iterator[GrpcReceiver]:
    receiver = GrpcReceiver()
    yield receiver
    receiver.close()


@pytest.fixture
def agents() -> Iterator[list[Agent]]:  # request it after a receiver: the agents stop first
    started: list[Agent] = []
    yield started
    for agent in started:
        agent.stop()


def start(text: str, agents: list[Agent]) -> Agent:
    agent = build_agent(load_config(text, components(), environ={}), environ={})
    agent.start()
    agents.append(agent)
    return agent


def post_spans(agent: Agent) -> None:
    receiver = agent.collectors["otlp_traces"]
    assert isinstance(receiver, OtlpTracesReceiver)
    wait_for(lambda: receiver._server is not None)  # the scheduler starts it on its own thread
    host, port = receiver.address
    request = urllib.request.Request(f"http://{host}:{port}/v1/traces", data=FIXTURE, method="POST",
                                     headers={"Content-Type": PROTOBUF})
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


def scrape(agent: Agent) -> tuple[Samples, float]:
    assert agent.server is not None
    started = time.monotonic()
    text = urllib.request.urlopen(f"http://127.0.0.1:{agent.server.port}/metrics", timeout=10).read().decode()
    took = time.monotonic() - started
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {k: (repr(float(v)) if k == "le" and v != "+Inf" else v) for k, v in sample.labels.items()}
            out[(sample.name, tuple(sorted(labels.items())))] = sample.value
    return out, took


def value(samples: Samples, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


@pytest.mark.integration
def test_a_run_exports_the_metrics_page_and_one_linked_trace_per_request(
        tmp_path: Path, http_receiver: HttpReceiver, agents: list[Agent]) -> None:
    received = http_receiver.received
    agent = start(config(http_receiver.url, tmp_path, interval=3600), agents)
    post_spans(agent)
    roots = wait_for(lambda: (r := [s for s in received.spans() if s.name == ROOT]) and len(r) == 3 and r)
    lines = {line["request_id"]: line
             for line in map(json.loads, (tmp_path / "requests.jsonl").read_text().splitlines())}
    spans = received.spans()
    for root in roots:
        attrs = {kv.key: kv.value for kv in root.attributes}
        request = attrs["kvscope.request.id"].string_value
        engine = ENGINE_SPANS[request]
        assert (root.trace_id, root.parent_span_id) == (engine.trace_id, engine.span_id)  # inside vLLM's trace
        assert root.end_time_unix_nano - root.start_time_unix_nano == round(engine.ttft * 1e9)
        components = lines[request]["components"]
        assert components  # the JSONL sink saw the same attribution
        for name, part in components.items():
            assert attrs[f"kvscope.ttft.{name}.seconds"].double_value == pytest.approx(part["seconds"], abs=1e-9)
            assert attrs[f"kvscope.ttft.{name}.method"].string_value == part["method"]
        children = {s.name: s for s in spans if s.parent_span_id == root.span_id}
        assert set(children) == {f"kvscope.{name}" for name in components}
        for name, part in components.items():
            child = children[f"kvscope.{name}"]
            assert (child.end_time_unix_nano - child.start_time_unix_nano) / 1e9 == pytest.approx(
                part["seconds"], abs=2e-9)
    resource = {kv.key: kv.value.string_value for kv in received.traces[0].resource_spans[0].resource.attributes}
    assert resource["service.name"] == "kvscope"

    # the same numbers as /metrics: freeze the store, scrape, then export once
    agent.scheduler.stop()
    page, _ = scrape(agent)
    (sink,) = [s for s in agent.sinks if isinstance(s, OtlpMetricsSink)]
    assert sink.export()
    assert prometheus_samples(received.last_metrics()) == page
    assert value(page, "kvscope_requests_attributed_total", source="otlp") == 3


@pytest.mark.integration
def test_export_runs_on_its_interval_over_grpc(tmp_path: Path, grpc_receiver: GrpcReceiver,
                                               agents: list[Agent]) -> None:
    received = grpc_receiver.received
    agent = start(config(grpc_receiver.url, tmp_path, "protocol = 'grpc'"), agents)
    post_spans(agent)
    wait_for(lambda: len([s for s in received.spans() if s.name == ROOT]) == 3)
    wait_for(lambda: len(received.metrics) >= 3
             and value(prometheus_samples(received.last_metrics()), "kvscope_requests_attributed_total") == 3)
    (root, *_) = [s for s in received.spans() if s.name == ROOT]
    assert root.parent_span_id in {r.span_id for r in ENGINE_SPANS.values()}


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["dead", "slow"])
def test_a_collector_that_is_down_or_slow_never_stalls_the_agent(kind: str, tmp_path: Path,
                                                                  http_receiver: HttpReceiver,
                                                                  agents: list[Agent]) -> None:
    http_receiver.received.hold = threading.Event()  # slow: takes the body, answers only at teardown
    endpoint = http_receiver.url if kind == "slow" else f"http://127.0.0.1:{free_port()}"
    agent = start(config(endpoint, tmp_path, "timeout = 1.0\nqueue_size = 4\nbatch_size = 2"), agents)
    latencies = []
    for i in range(40):
        if i % 4 == 0:
            post_spans(agent)  # 30 requests in all, far more than the queue of 4 holds
        latencies.append(scrape(agent)[1])
        time.sleep(0.05)
    page = wait_for(lambda: (p := scrape(agent)[0]) and value(p, "kvscope_requests_attributed_total") == 30 and p)
    print(f"\n/metrics with a {kind} OTLP endpoint: median {statistics.median(latencies) * 1e3:.1f} ms, "
          f"max {max(latencies) * 1e3:.1f} ms over {len(latencies)} scrapes")
    assert statistics.median(latencies) < 0.1 and max(latencies) < 1.0, latencies
    assert value(page, "kvscope_analysis_up", analysis="correlation") == 1
    assert value(page, "kvscope_otlp_exporter_traces_total", result="dropped") >= 1
    assert value(page, "kvscope_otlp_exporter_traces_total", result="exported") == 0
    wait_for(lambda: value(scrape(agent)[0], "kvscope_otlp_exporter_exports_total", signal="metrics",
                           result="failed") >= 1)
    stopping = time.monotonic()
    agents.remove(agent)
    agent.stop()
    assert time.monotonic() - stopping < 2 * STOP_GRACE + 1.5
