"""The Helm chart (deploy/helm/kvscope), rendered and linted by Helm's own engine (Helm v4 as a library,
helm-python-sdk, offline: `make tools` installs it), every object validated against Kubernetes' schemas
(kubernetes-validate, strict) or the prometheus-operator CRDs (vendored, tests/fixtures/schemas), every
pod spec held to the Pod Security level the docs claim (testkit.pod_security, from the published standard),
and the wiring: sidecar against deploy/kubernetes, monitors against the pods, rules through promtool.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kvscope.agent.app.wiring import components
from kvscope.agent.config.settings import load_config
from testkit.crd_schema import crd_validator
from testkit.environment import require_tool
from testkit.helm_chart import CHART, by_kind, helm, render
from testkit.paths import ROOT
from testkit.pod_security import pod_specs, violations

KUBERNETES_VERSION = "1.33"
EXAMPLE = {"example": {"enabled": True}}
G4 = {"siteFacts": {"tierFetchCapacityBytesPerSecond": {"G4": 315e9}}}


def test_helm_lint_strict_passes_and_fails_a_broken_chart(tmp_path: Path) -> None:
    report = helm().lint(str(CHART), strict=True, kube_version="v1.33.0")
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == []
    broken = tmp_path / "kvscope"
    shutil.copytree(CHART, broken)
    template = broken / "templates" / "sidecar.yaml"
    template.write_text(template.read_text().replace("{{- end }}", "", 1))
    assert helm().lint(str(broken), strict=True)["errors"] or any(
        m["severity"] >= 3 for m in helm().lint(str(broken), strict=True)["messages"])


CRD_KINDS = {"PodMonitor": "podmonitors", "ServiceMonitor": "servicemonitors", "PrometheusRule": "prometheusrules"}


@pytest.mark.parametrize("values", [{}, {**EXAMPLE, **G4}], ids=["defaults", "example-and-site-facts"])
def test_every_object_is_valid_against_its_schema(values: dict[str, Any]) -> None:
    resources = render(values)
    kinds = {r["kind"] for r in resources}
    assert {"DaemonSet", "ConfigMap", "Service", "PodMonitor", "ServiceMonitor", "PrometheusRule"} <= kinds
    for resource in resources:
        if resource["kind"] in CRD_KINDS:
            errors = [e.message for e in crd_validator(CRD_KINDS[resource["kind"]]).iter_errors(resource)]
            assert errors == [], resource["metadata"]["name"]
        else:
            kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


def test_the_schema_checks_reject_a_misspelt_field() -> None:
    resources = render()
    (daemonset,) = by_kind(resources, "DaemonSet")
    daemonset["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, KUBERNETES_VERSION, strict=True)
    (monitor,) = by_kind(resources, "ServiceMonitor")
    monitor["spec"]["endpoint"] = monitor["spec"].pop("endpoints")
    assert not crd_validator("servicemonitors").is_valid(monitor)


def _pods(resources: list[dict[str, Any]]) -> dict[str, tuple[dict[str, Any], dict[str, str]]]:
    return {r["metadata"]["name"]: spec for r in resources for spec in pod_specs(r)}


def test_pod_security_levels_are_the_documented_ones() -> None:
    """docs/deploy.md: the sidecar and the example inference pod restricted; the node agent privileged,
    for its read-only hostPath mounts alone (no host namespace, no privilege, no capability)."""
    pods = _pods(render(EXAMPLE))
    pod = yaml.safe_load((ROOT / "deploy/kubernetes/inference-pod.yaml").read_text())
    pods["inference-pod.yaml"] = pod_specs(pod)[0]
    assert set(pods) == {"kvscope-node", "kvscope-example", "inference-pod.yaml"}
    for name in ("kvscope-example", "inference-pod.yaml"):
        assert violations(*_args(pods[name], "restricted")) == [], name
    node_spec, annotations = pods["kvscope-node"]
    assert violations(node_spec, "baseline", annotations) == [
        "hostPath volume host-proc", "hostPath volume host-sys", "hostPath volume pod-resources"]
    assert all(m.get("readOnly") for c in node_spec["containers"] for m in c["volumeMounts"]
               if m["name"].startswith(("host-", "pod-resources")))
    documented = (ROOT / "docs" / "deploy.md").read_text()
    assert "restricted" in documented and "privileged" in documented


def _args(pod: tuple[dict[str, Any], dict[str, str]], level: str) -> tuple[dict[str, Any], str, dict[str, str]]:
    return pod[0], level, pod[1]


def test_the_charts_sidecar_is_the_documented_one() -> None:
    """The example's sidecar is deploy/kubernetes/inference-pod.yaml's, but for the image (a value), and the
    chart's sidecar config is deploy/kubernetes/configmap.yaml's (the sidecar's documented config)."""
    resources = render(EXAMPLE)
    (deployment,) = by_kind(resources, "Deployment")
    (chart_sidecar,) = deployment["spec"]["template"]["spec"]["initContainers"]
    pod = yaml.safe_load((ROOT / "deploy/kubernetes/inference-pod.yaml").read_text())
    (documented,) = pod["spec"]["initContainers"]
    assert chart_sidecar["image"] == "kvscope:0.1.0" and documented["image"] == "kvscope:0.1.0"
    assert chart_sidecar == documented
    config = {r["metadata"]["name"]: r for r in by_kind(resources, "ConfigMap")}["kvscope-sidecar"]
    configmap = yaml.safe_load((ROOT / "deploy/kubernetes/configmap.yaml").read_text())
    assert config["data"]["kvscope.toml"] == configmap["data"]["kvscope.toml"]
    # an operator's own config, where values.yaml documents it, replaces the default one
    own = '[collectors.vllm]\nenabled = true\nurl = "http://127.0.0.1:8000/metrics"\n'
    mine = render({"sidecar": {"configMap": {"config": own}}})
    config = {r["metadata"]["name"]: r for r in by_kind(mine, "ConfigMap")}["kvscope-sidecar"]
    assert config["data"]["kvscope.toml"].strip() == own.strip()
    image = render({"image": {"repository": "registry.example/kvscope", "digest": "sha256:" + "a" * 64}})
    (daemonset,) = by_kind(image, "DaemonSet")
    image_name = daemonset["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image_name == "registry.example/kvscope@sha256:" + "a" * 64


def test_the_node_agent_config_loads_and_reads_the_host() -> None:
    resources = render()
    configmaps = {r["metadata"]["name"]: r for r in by_kind(resources, "ConfigMap")}
    config_text = configmaps["kvscope-node"]["data"]["kvscope.toml"]
    config = load_config(config_text, components(), environ={}, origin="node-agent.toml")
    enabled = {name for name, (settings, _) in config.collectors.items() if settings.enabled}
    assert {"disk", "network", "rdma", "nfs", "lustre", "nvml"} <= enabled
    assert not enabled & {"vllm", "vllm_kv_events", "otlp_traces", "engine_discovery"}
    assert config.collectors["nvml"][1].pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    (daemonset,) = by_kind(resources, "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts[config.agent.proc_root]]["hostPath"]["path"] == "/proc"
    assert volumes[mounts[config.agent.sys_root]]["hostPath"]["path"] == "/sys"
    socket = Path(config.collectors["nvml"][1].pod_resources_socket)
    assert volumes[mounts[str(socket.parent)]]["hostPath"]["path"] == str(socket.parent)
    port = int(config.exporters["prometheus"].listen.rsplit(":", 1)[1])
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"metrics": port}
    assert not pod.get("hostNetwork") and not pod.get("hostPID")  # PID 1's files give the host's view
    assert config.collectors["network"][1].path == "1/net/dev"


def test_monitors_select_the_pods_and_carry_the_prometheus_selector_labels() -> None:
    resources = render({**EXAMPLE, "monitoring": {"labels": {"release": "prom"}}})
    monitored = by_kind(resources, "PodMonitor") + by_kind(resources, "ServiceMonitor") \
        + by_kind(resources, "PrometheusRule")
    assert len(monitored) == 3 and all(r["metadata"]["labels"]["release"] == "prom" for r in monitored)
    defaults = render()
    assert all(r["metadata"]["labels"]["release"] == "kube-prometheus-stack" for r in defaults
               if r["kind"] in CRD_KINDS)
    (pod_monitor,) = by_kind(resources, "PodMonitor")
    (deployment,) = by_kind(resources, "Deployment")
    template = deployment["spec"]["template"]
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    ports = {p["name"] for c in template["spec"]["initContainers"] for p in c["ports"]}
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] in ports
    (service_monitor,) = by_kind(resources, "ServiceMonitor")
    node_service = next(s for s in by_kind(resources, "Service") if s["metadata"]["name"] == "kvscope-node")
    assert service_monitor["spec"]["selector"]["matchLabels"].items() <= node_service["metadata"]["labels"].items()
    (daemonset,) = by_kind(resources, "DaemonSet")
    assert node_service["spec"]["selector"].items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()
    assert service_monitor["spec"]["endpoints"][0]["honorLabels"] is True  # kvscope_gpu_pod_info's pod stays


def _site_rules(resources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (rule,) = by_kind(resources, "PrometheusRule")
    return [r for g in rule["spec"]["groups"] if g["name"] == "kvscope.site" for r in g["rules"]]


def test_site_facts_come_from_values_with_no_default_capacity(tmp_path: Path) -> None:
    assert _site_rules(render()) == []
    extra = {"record": "kvscope:tier_cost_per_hour", "expr": "vector(12)", "labels": {"tier": "G4"}}
    resources = render({"siteFacts": {"tierFetchCapacityBytesPerSecond": {"G4": 315e9, "G3": 2.5e10},
                                      "extraRules": [extra]}})
    rules = _site_rules(resources)
    assert [(r["labels"]["tier"], r["expr"]) for r in rules[:2]] == [("G3", "vector(2.5e+10)"),
                                                                     ("G4", "vector(3.15e+11)")]
    assert rules[2] == extra
    (rule,) = by_kind(resources, "PrometheusRule")
    local = tmp_path / "rules.yml"
    local.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    promtool = require_tool("promtool")
    proc = subprocess.run([promtool, "check", "rules", str(local)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shipped = {g["name"] for f in (CHART / "files" / "rules").glob("*.yml")
               for g in yaml.safe_load(f.read_text())["groups"]}
    assert {g["name"] for g in rule["spec"]["groups"]} == shipped | {"kvscope.site"}


def test_dashboards_are_configmaps_for_grafanas_sidecar() -> None:
    maps = [r for r in by_kind(render(), "ConfigMap") if r["metadata"]["labels"].get("grafana_dashboard") == "1"]
    boards = {p.name: p.read_text() for p in (ROOT / "dashboards" / "grafana").glob("*.json")}
    assert {name: text for m in maps for name, text in m["data"].items()} == {
        name: text.rstrip("\n") for name, text in boards.items()}
    assert all(len(m["metadata"]["name"]) <= 63 for m in maps)
    assert not [r for r in by_kind(render({"dashboards": {"enabled": False}}), "ConfigMap")
                if "grafana_dashboard" in r["metadata"]["labels"]]


def test_the_tools_target_installs_the_pinned_engine() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    makefile = (ROOT / "Makefile").read_text()
    (pin,) = [line.split('"')[1] for line in pyproject.splitlines() if line.startswith("chart = [")]
    assert pin.startswith("helm-python-sdk==") and pin in makefile
    assert os.environ.get("KVSCOPE_REQUIRE_TOOLS") != "1" or helm() is not None


def _runbook_urls(resources: list[dict[str, Any]]) -> dict[str, str]:
    (rule,) = by_kind(resources, "PrometheusRule")
    return {r["alert"]: r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"]
            if "alert" in r}


def test_alerts_link_absolute_runbook_urls_from_a_value() -> None:
    """Every alert's runbook_url is monitoring.runbookBaseUrl + the anchor of its section in docs/runbooks.md
    (the rule files keep the repository path); an empty base refuses to render, naming the value."""
    shipped = {r["alert"]: r["annotations"]["runbook_url"] for f in (CHART / "files" / "rules").glob("*.yml")
               for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"] if "alert" in r}
    default = yaml.safe_load((CHART / "values.yaml").read_text())["monitoring"]["runbookBaseUrl"]
    assert default.startswith("https://") and default.endswith("docs/runbooks.md")
    for base in (default, "https://wiki.example.com/sre/kvscope-runbooks"):
        urls = _runbook_urls(render({"monitoring": {"runbookBaseUrl": base}}))
        assert urls.keys() == shipped.keys() and len(urls) >= 8
        for alert, url in urls.items():
            assert url == f"{base}#{alert.lower()}", alert
            assert shipped[alert] == f"docs/runbooks.md#{alert.lower()}", alert
    with pytest.raises(Exception, match=r"monitoring\.runbookBaseUrl"):
        render({"monitoring": {"runbookBaseUrl": ""}})


def test_prices_from_values_become_the_sidecars_value_section_and_none_by_default() -> None:
    def sidecar_config(values: dict[str, Any] | None = None) -> str:
        resources = render(values)
        return str({r["metadata"]["name"]: r for r in by_kind(resources, "ConfigMap")}["kvscope-sidecar"]
                   ["data"]["kvscope.toml"])

    assert "[analyses.value]" not in sidecar_config()  # no price is guessed
    text = sidecar_config({"sidecar": {"value": {"gpusPerEngine": 8, "currency": "USD", "gpuHour": 2.5,
                                                 "tierGibMonth": {"G4": 0.05, "G3": 0.02},
                                                 "transferGb": {"G4->G2": 0.01}}}})
    config = load_config(text, components(), environ={}, origin="chart")
    _, options = config.analyses["value"]
    assert (options.gpus_per_engine, options.currency, options.gpu_hour) == (8.0, "USD", 2.5)
    assert options.tier_gib_month == {"G3": 0.02, "G4": 0.05} and options.transfer_gb == {"G4->G2": 0.01}
