"""The Kubernetes example: the pod, ConfigMap and Service against Kubernetes' own schemas (the
kubernetes-validate package, strict: unknown fields fail), the PodMonitor and PrometheusRule against the
prometheus-operator's CRD schemas (vendored), and the wiring between them: what the sidecar mounts and
reads, the ports the monitor and the service name, the endpoints vLLM and kvscope agree on.
"""

from __future__ import annotations

import json
import re
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kvscope.agent.app.wiring import components
from kvscope.agent.config.settings import load_config
from kvscope.agent.tools.reference.geometry import preset
from kvscope.exporters.prometheus.server import SPEC as PROMETHEUS
from testkit.crd_schema import crd_validator
from testkit.paths import ROOT

K8S = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.33"


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((K8S / name).read_text())
    return data


def _containers() -> dict[str, dict[str, Any]]:
    spec = _load("inference-pod.yaml")["spec"]
    return {c["name"]: c for c in spec.get("initContainers", []) + spec["containers"]}


def _agent_config() -> Any:
    text = _load("configmap.yaml")["data"]["kvscope.toml"]
    return load_config(text, components(), environ={}, origin="configmap.yaml")


@pytest.mark.parametrize("name", ["inference-pod.yaml", "configmap.yaml", "service.yaml"])
def test_valid_against_the_kubernetes_schema(name: str) -> None:
    kubernetes_validate.validate(_load(name), KUBERNETES_VERSION, strict=True)


def test_the_kubernetes_check_rejects_an_unknown_field() -> None:
    pod = _load("inference-pod.yaml")
    pod["spec"]["initContainers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize(("name", "schema"), [("podmonitor.yaml", "podmonitors"),
                                              ("prometheusrule.yaml", "prometheusrules")])
def test_valid_against_the_operator_crd(name: str, schema: str) -> None:
    validator = crd_validator(schema)
    resource = _load(name)
    assert resource["apiVersion"] == "monitoring.coreos.com/v1"
    assert [e.message for e in validator.iter_errors(resource)] == []
    broken = json.loads(json.dumps(resource))
    key = "groups" if schema == "prometheusrules" else "podMetricsEndpoints"
    broken["spec"][key.rstrip("s")] = broken["spec"].pop(key)  # a typo in a field name
    assert not validator.is_valid(broken)


def test_the_sidecar_is_native_needs_nothing_of_the_host_and_never_gates_readiness() -> None:
    pod = _load("inference-pod.yaml")["spec"]
    (sidecar,) = pod["initContainers"]
    assert sidecar["name"] == "kvscope" and sidecar["restartPolicy"] == "Always"  # a native sidecar
    assert "readinessProbe" not in sidecar  # a native sidecar's readiness counts towards the pod's
    port = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    for probe in ("startupProbe", "livenessProbe"):
        assert sidecar[probe]["httpGet"]["path"] == "/health", probe
        assert port[sidecar[probe]["httpGet"]["port"]] == 9474
    assert not any("hostPath" in v for v in pod["volumes"])
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in sidecar["volumeMounts"]}
    assert volumes[mounts["/etc/kvscope"]["name"]]["configMap"]["name"] == _load("configmap.yaml")["metadata"]["name"]
    assert all(m["name"] in volumes for c in _containers().values() for m in c.get("volumeMounts", []))
    assert "env" not in sidecar  # no NVIDIA_VISIBLE_DEVICES: the GPUs are the node agent's
    assert _containers()["vllm"]["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_the_sidecar_reads_no_host_source() -> None:
    config = _agent_config()
    host = {"disk", "network", "rdma", "nfs", "lustre", "gpfs", "nvml"}
    assert {name for name in host if config.collectors[name][0].enabled} == set()
    with_env = load_config(_load("configmap.yaml")["data"]["kvscope.toml"], components(),
                           environ={"KVSCOPE_AGENT__PROC_ROOT": "/proc", "KVSCOPE_AGENT__SYS_ROOT": "/sys"},
                           origin="configmap.yaml")  # e2e/conftest.py sets them
    assert with_env.agent.proc_root == "/proc"


def test_vllm_and_kvscope_agree_on_every_endpoint() -> None:
    config = _agent_config()
    enabled = {name for name, (settings, _) in config.collectors.items() if settings.enabled}
    assert {"vllm", "vllm_kv_events", "otlp_traces"} <= enabled
    vllm = _containers()["vllm"]
    args = " ".join(vllm["args"])
    port = re.search(r"--port=(\d+)", args).group(1)  # type: ignore[union-attr]
    assert config.collectors["vllm"][1].urls == [f"http://localhost:{port}/metrics"]
    assert {p["containerPort"] for p in vllm["ports"]} == {int(port)}
    model = re.search(r"--model=(\S+)", args).group(1)  # type: ignore[union-attr]
    assert events_model(config) == model
    assert config.collectors["vllm_kv_events"][1].kv_bytes_per_token == preset("gpt-oss-120b").bytes_per_token
    kv = json.loads(re.search(r"--kv-events-config=(\{.*?\})(?: --|$)", args).group(1))  # type: ignore[union-attr]
    assert kv["enable_kv_cache_events"] is True
    events = config.collectors["vllm_kv_events"][1]
    assert events.endpoint.rsplit(":", 1)[1] == kv["endpoint"].rsplit(":", 1)[1]
    assert events.replay_endpoint.rsplit(":", 1)[1] == kv["replay_endpoint"].rsplit(":", 1)[1]
    otlp = config.collectors["otlp_traces"][1].listen.rsplit(":", 1)[1]
    assert f"--otlp-traces-endpoint=http://localhost:{otlp}/v1/traces" in args
    assert {"name": "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "value": "http/protobuf"} in vllm["env"]


def events_model(config: Any) -> str:
    model: str = config.collectors["vllm_kv_events"][1].model
    assert config.collectors["otlp_traces"][1].model == model
    return model


def test_the_monitor_and_the_service_reach_the_metrics_port() -> None:
    pod = _load("inference-pod.yaml")
    labels = pod["metadata"]["labels"]
    listen_port = int(_agent_config().exporter(PROMETHEUS).listen.rsplit(":", 1)[1])
    ports = {p["name"]: p["containerPort"] for c in _containers().values() for p in c.get("ports", [])}
    assert ports["kvscope-metrics"] == listen_port
    monitor = _load("podmonitor.yaml")["spec"]
    assert monitor["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = monitor["podMetricsEndpoints"]
    assert endpoint["port"] == "kvscope-metrics" and endpoint["path"] == "/metrics"
    service = _load("service.yaml")["spec"]
    assert service["selector"].items() <= labels.items()
    assert {p["targetPort"] for p in service["ports"]} <= set(ports)
