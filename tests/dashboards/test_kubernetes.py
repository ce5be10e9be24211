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
from jsonschema import Draft7Validator

from kvscope.agent.app.wiring import components
from kvscope.agent.config.settings import load_config
from kvscope.agent.tools.reference.geometry import preset
from kvscope.exporters.prometheus.server import SPEC as PROMETHEUS
from testkit.paths import ROOT

K8S = ROOT / "deploy" / "kubernetes"
CRDS = ROOT / "tests" / "fixtures" / "schemas" / "prometheus-operator"
KUBERNETES_VERSION = "1.33"


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((K8S / name).read_text())
    return data


def _containers() -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in _load("inference-pod.yaml")["spec"]["containers"]}


def _agent_config() -> Any:
    text = _load("configmap.yaml")["data"]["kvscope.toml"]
    return load_config(text, components(), environ={}, origin="configmap.yaml")


@pytest.mark.parametrize("name", ["inference-pod.yaml", "configmap.yaml", "service.yaml"])
def test_valid_against_the_kubernetes_schema(name: str) -> None:
    kubernetes_validate.validate(_load(name), KUBERNETES_VERSION, strict=True)


def test_the_kubernetes_check_rejects_an_unknown_field() -> None:
    pod = _load("inference-pod.yaml")
    pod["spec"]["containers"][1]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)


def _strict(schema: Any) -> Any:
    """The CRD schema as `kubectl apply --validate=strict` applies it: unknown fields are errors (the API
    server would otherwise prune them silently), except where the CRD preserves unknown fields."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out \
                and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    return [_strict(v) for v in schema] if isinstance(schema, list) else schema


@pytest.mark.parametrize(("name", "schema"), [("podmonitor.yaml", "podmonitors"),
                                              ("prometheusrule.yaml", "prometheusrules")])
def test_valid_against_the_operator_crd(name: str, schema: str) -> None:
    validator = Draft7Validator(_strict(json.loads((CRDS / f"{schema}.v1.schema.json").read_text())))
    resource = _load(name)
    assert resource["apiVersion"] == "monitoring.coreos.com/v1"
    assert [e.message for e in validator.iter_errors(resource)] == []
    broken = json.loads(json.dumps(resource))
    key = "groups" if schema == "prometheusrules" else "podMetricsEndpoints"
    broken["spec"][key.rstrip("s")] = broken["spec"].pop(key)  # a typo in a field name
    assert not validator.is_valid(broken)


def test_the_sidecar_reads_the_host_read_only_and_runs_unprivileged() -> None:
    pod = _load("inference-pod.yaml")
    sidecar = _containers()["kvscope"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["mountPath"]: m for m in sidecar["volumeMounts"]}
    agent = _agent_config().agent
    for root, host in ((agent.proc_root, "/proc"), (agent.sys_root, "/sys")):
        assert mounts[root]["readOnly"] is True
        assert volumes[mounts[root]["name"]]["hostPath"]["path"] == host
    assert volumes[mounts["/etc/kvscope"]["name"]]["configMap"]["name"] == _load("configmap.yaml")["metadata"]["name"]
    assert all(m["name"] in volumes for m in sidecar["volumeMounts"])
    security = sidecar["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["runAsNonRoot"] is True
    assert security["allowPrivilegeEscalation"] is False and security["capabilities"]["drop"] == ["ALL"]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in sidecar["env"]
    assert "nvidia.com/gpu" not in sidecar.get("resources", {}).get("limits", {})  # sees the GPU, takes none


def test_vllm_and_kvscope_agree_on_every_endpoint() -> None:
    config = _agent_config()
    enabled = {name for name, (settings, _) in config.collectors.items() if settings.enabled}
    assert {"vllm", "vllm_kv_events", "otlp_traces", "nvml", "disk", "network"} <= enabled
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
    assert ports["metrics"] == listen_port
    monitor = _load("podmonitor.yaml")["spec"]
    assert monitor["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = monitor["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    service = _load("service.yaml")["spec"]
    assert service["selector"].items() <= labels.items()
    assert {p["targetPort"] for p in service["ports"]} <= set(ports)
