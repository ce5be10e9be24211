"""Where OTLP export goes: kvscope's keys, then the OTEL_* variables, then defaults; the resource; the
checks `config check` makes before a run."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from kvscope.agent.app import preflight
from kvscope.agent.app.wiring import components
from kvscope.agent.config.binding import ConfigError
from kvscope.agent.config.settings import load_config
from kvscope.exporters.otlp.settings import (
    DEFAULT_INTERVAL,
    SPEC,
    Destination,
    OtlpOptions,
    resolve,
    resource_attributes,
)


def both(**keys: object) -> OtlpOptions:
    return OtlpOptions(metrics=True, traces=True, **keys)  # type: ignore[arg-type]


def dest(section: OtlpOptions, environ: dict[str, str], signal: str = "metrics") -> Destination:
    settings = resolve(section, environ)
    out = settings.metrics if signal == "metrics" else settings.traces
    assert out is not None
    return out


def test_defaults_are_the_otel_ones_with_a_15_s_interval() -> None:
    settings = resolve(both(), {})
    assert settings.metrics == Destination("metrics", "http/protobuf", "http://localhost:4318/v1/metrics", {}, 10.0,
                                           "none", "")
    assert settings.traces is not None and settings.traces.endpoint == "http://localhost:4318/v1/traces"
    assert (settings.interval, settings.queue_size, settings.batch_size) == (DEFAULT_INTERVAL, 2048, 512)
    assert resolve(OtlpOptions(), {}).metrics is None and resolve(OtlpOptions(traces=True), {}).metrics is None


def test_the_standard_variables_apply_per_signal_over_general() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://otel.example:4318/base/",
           "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://tempo:4318/v1/traces",
           "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20abc,x-scope-orgid=team",
           "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "x-scope-orgid=metrics",
           "OTEL_EXPORTER_OTLP_TIMEOUT": "2500", "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
           "OTEL_EXPORTER_OTLP_CERTIFICATE": "/etc/ca.pem", "OTEL_METRIC_EXPORT_INTERVAL": "30000"}
    metrics, traces = dest(both(), env), dest(both(), env, "traces")
    assert metrics.endpoint == "https://otel.example:4318/base/v1/metrics"  # the general one gets the signal path
    assert traces.endpoint == "http://tempo:4318/v1/traces"  # the per-signal one is used as it is
    assert metrics.headers == {"x-scope-orgid": "metrics"}
    assert traces.headers == {"authorization": "Bearer abc", "x-scope-orgid": "team"}
    assert (metrics.timeout, metrics.compression, metrics.certificate) == (2.5, "gzip", "/etc/ca.pem")
    assert resolve(both(), env).interval == 30.0


def test_kvscope_keys_win_over_every_variable() -> None:
    env = {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://env:4318/v1/metrics", "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
           "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_HEADERS": "a=b",
           "OTEL_METRIC_EXPORT_INTERVAL": "1"}
    section = both(endpoint="http://collector:4318", timeout=3.0, protocol="http/protobuf", headers={"c": "d"},
                   interval=5.0)
    metrics = dest(section, env)
    assert (metrics.endpoint, metrics.timeout, metrics.protocol, metrics.headers) == (
        "http://collector:4318/v1/metrics", 3.0, "http/protobuf", {"c": "d"})
    assert resolve(section, env).interval == 5.0
    own = dest(both(endpoint="http://collector:4318", metrics_endpoint="http://m:9/push"), env)
    assert own.endpoint == "http://m:9/push"


def test_grpc_takes_the_endpoint_without_a_path_and_its_own_default_port() -> None:
    assert dest(both(protocol="grpc"), {}).endpoint == "http://localhost:4317"
    grpc = dest(OtlpOptions(traces=True), {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
                                           "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317"}, "traces")
    assert (grpc.protocol, grpc.endpoint, grpc.insecure) == ("grpc", "collector:4317", True)
    assert not dest(both(protocol="grpc", endpoint="https://c:4317"), {}).insecure
    assert dest(both(), {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}).protocol == "http/protobuf"


@pytest.mark.parametrize(("env", "section", "message"), [
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "ten"}, both(), "OTEL_EXPORTER_OTLP_TIMEOUT: expected a positive number"),
    ({"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/json"}, both(), "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL: expected one"),
    ({"OTEL_EXPORTER_OTLP_HEADERS": "novalue"}, both(), "OTEL_EXPORTER_OTLP_HEADERS: expected key=value"),
    ({"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, both(), "OTEL_EXPORTER_OTLP_COMPRESSION: expected one of none, gzip"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, both(), "OTEL_EXPORTER_OTLP_ENDPOINT: an OTLP/HTTP endpoint"),
    ({}, both(endpoint="http://host:port"), "exporters.otlp.endpoint: bad port"),
    ({"OTEL_METRIC_EXPORT_INTERVAL": "0"}, both(), "OTEL_METRIC_EXPORT_INTERVAL: expected a positive"),
])
def test_a_bad_value_names_its_variable_or_key(env: dict[str, str], section: OtlpOptions, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(section, env)


def test_the_section_binds_from_toml_and_kvscope_environment() -> None:
    env = {"KVSCOPE_EXPORTERS__OTLP__TRACES": "true", "KVSCOPE_EXPORTERS__OTLP__HEADERS": '{ "x-key" = "v" }',
           "KVSCOPE_EXPORTERS__OTLP__TIMEOUT": "2"}
    config = load_config("[exporters.otlp]\nmetrics = true\nprotocol = 'grpc'\n", components(), environ=env)
    section = config.exporter(SPEC)
    assert (section.metrics, section.traces, section.protocol, section.headers, section.timeout) == (
        True, True, "grpc", {"x-key": "v"}, 2.0)
    for bad, message in (("protocol = 'http/json'", "exporters.otlp.protocol"),
                         ("queue_size = 0", "exporters.otlp.queue_size: must be >= 1"),
                         ("interval = -1", "exporters.otlp.interval: must be > 0")):
        with pytest.raises(ConfigError, match=message):
            load_config(f"[exporters.otlp]\n{bad}\n", components(), environ={})


def test_resource_pod_identity_from_the_downward_api_and_the_operators_attributes_on_top() -> None:
    env = {"K8S_POD_NAME": "vllm-0", "POD_NAME": "ignored", "POD_NAMESPACE": "inference", "NODE_NAME": "gpu-7"}
    attrs = resource_attributes(env, "1.2.3", hostname=lambda: "host")
    assert attrs == {"service.name": "kvscope", "service.version": "1.2.3", "k8s.pod.name": "vllm-0",
                     "k8s.namespace.name": "inference", "k8s.node.name": "gpu-7", "service.instance.id": "vllm-0"}
    env |= {"OTEL_RESOURCE_ATTRIBUTES": "k8s.pod.name=other,deployment.environment.name=prod%2Ceu",
            "OTEL_SERVICE_NAME": "kv-sidecar"}
    attrs = resource_attributes(env, "1.2.3", hostname=lambda: "host")
    assert attrs["k8s.pod.name"] == "other" and attrs["deployment.environment.name"] == "prod,eu"
    assert attrs["service.name"] == "kv-sidecar"
    assert resource_attributes({}, "1", hostname=lambda: "host")["service.instance.id"] == "host"


def findings(text: str, environ: dict[str, str]) -> preflight.Findings:
    return preflight.check(load_config(text, components(), environ={}), components(), environ)


def test_config_check_resolves_and_warns_before_a_run() -> None:
    on = "[exporters.otlp]\nmetrics = true\ntraces = true\n"
    assert findings(on, {}).problems == []
    assert findings(on, {"OTEL_EXPORTER_OTLP_TIMEOUT": "x"}).problems == [
        "OTEL_EXPORTER_OTLP_TIMEOUT: expected a positive number of milliseconds, got 'x'"]
    loop = findings(on + "[collectors.otlp_traces]\nenabled = true\n", {})
    assert [w for w in loop.warnings if "kvscope's own otlp_traces receiver" in w]
    elsewhere = findings(on + "[collectors.otlp_traces]\nenabled = true\nlisten = '0.0.0.0:14318'\n", {})
    assert not [w for w in elsewhere.warnings if "own otlp_traces receiver" in w]
    assert "correlation analysis is disabled" in " ".join(
        findings(on + "[analyses.correlation]\nenabled = false\n", {}).warnings)
    delta = {"OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "delta"}
    assert "cumulative" in " ".join(findings(on, delta).warnings)
    assert findings(on + "certificate = '/nonexistent/ca.pem'\n", {}).problems == [
        "exporters.otlp.certificate: /nonexistent/ca.pem is not a file (metrics)",
        "exporters.otlp.certificate: /nonexistent/ca.pem is not a file (traces)"]


HIDE = textwrap.dedent("""
    import sys
    for name in sys.argv[1].split(","):
        sys.modules[name] = None  # as if the extra were not installed
    from kvscope.agent.app.cli import main
    sys.exit(main(sys.argv[2:]))
""")


@pytest.mark.parametrize(("hidden", "protocol", "line"), [
    ("opentelemetry.exporter.otlp.proto.http", "http/protobuf",
     "exporters.otlp needs the 'otlp' extra (opentelemetry.exporter.otlp.proto.http not installed): "
     "pip install 'kvscope[otlp]'"),
    ("grpc", "grpc",
     "exporters.otlp needs the 'otlp-grpc' extra (grpc not installed): pip install 'kvscope[otlp-grpc]'"),
])
def test_config_check_names_a_missing_extra_in_one_line(hidden: str, protocol: str, line: str) -> None:
    env = {"KVSCOPE_EXPORTERS__OTLP__METRICS": "true", "KVSCOPE_EXPORTERS__OTLP__PROTOCOL": protocol}
    import os

    proc = subprocess.run([sys.executable, "-c", HIDE, hidden, "config", "check"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **env})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"kvscope: {line}"
