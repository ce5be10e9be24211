"""docs/deploy.md's commands, each exercised as far as the tools here allow: every `helm template`, `helm
upgrade --install` and `helm lint` of kvscope's chart runs through Helm's engine with the same --set values;
the `docker build` names build arguments the Dockerfile has and the version the chart ships; the namespace
label is the level the node agent's pod needs; the sidecar snippet is the chart's sidecar and passes the
restricted level. kubectl, docker and a cluster are not here: what they would do is checked, not done.
"""

from __future__ import annotations

import re
import shlex
from itertools import pairwise
from typing import Any

import yaml

import kvscope
from testkit.helm_chart import CHART, by_kind, helm, render
from testkit.paths import ROOT
from testkit.pod_security import violations

DOC = ROOT / "docs" / "deploy.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", DOC.read_text(), re.M | re.S)


def _commands() -> list[list[str]]:
    return [shlex.split(line) for block in _blocks("sh") for line in block.splitlines() if line.strip()]


def _typed(value: str) -> Any:
    """What `helm --set` makes of a value (strvals: integers, booleans and null are typed, the rest strings)."""
    if re.fullmatch(r"-?\d+", value):
        return int(value)
    return {"true": True, "false": False, "null": None}.get(value, value)


def _set_values(args: list[str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for flag, value in pairwise(args):
        if flag == "--set":
            key, _, raw = value.partition("=")
            *path, leaf = key.split(".")
            node = values
            for part in path:
                node = node.setdefault(part, {})
            node[leaf] = _typed(raw)
    return values


def test_every_helm_command_on_the_chart_runs() -> None:
    helm_commands = [c for c in _commands() if c[0] == "helm" and "deploy/helm/kvscope" in c]
    assert {c[1] for c in helm_commands} == {"upgrade", "template", "lint"}
    for command in helm_commands:
        assert (ROOT / "deploy/helm/kvscope").is_dir()
        if command[1] == "lint":
            report = helm().lint(str(CHART), strict="--strict" in command)
            assert report["errors"] == [] and not [m for m in report["messages"] if m["severity"] >= 2]
            continue
        values = _set_values(command)
        resources = render(values)
        (daemonset,) = by_kind(resources, "DaemonSet")
        image = daemonset["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image.startswith(values["image"]["repository"] + ":"), command
        namespace = command[command.index("--namespace") + 1]
        assert namespace == "kvscope"
        if "siteFacts.tierFetchCapacityBytesPerSecond.G4=315e9" in command:
            (rule,) = by_kind(resources, "PrometheusRule")
            site = [r for g in rule["spec"]["groups"] if g["name"] == "kvscope.site" for r in g["rules"]]
            assert site == [{"record": "kvscope:tier_fetch_capacity_bytes_per_second", "expr": "vector(315e9)",
                             "labels": {"tier": "G4"}}]


def test_the_namespace_label_is_the_level_the_node_agent_needs() -> None:
    (label,) = [c for c in _commands() if c[:3] == ["kubectl", "label", "namespace"]]
    level = label[-1].split("=")[1]
    (daemonset,) = by_kind(render(), "DaemonSet")
    spec = daemonset["spec"]["template"]["spec"]
    assert violations(spec, level) == [] and violations(spec, "baseline") != []


def test_the_image_build_matches_the_dockerfile_and_the_chart() -> None:
    (build,) = [c for c in _commands() if c[:2] == ["docker", "build"]]
    dockerfile = (ROOT / "Dockerfile").read_text()
    for flag, value in pairwise(build):
        if flag == "--build-arg":
            assert re.search(rf"^ARG {value.split('=')[0]}\b", dockerfile, re.M), value
    tag = build[build.index("-t") + 1].rsplit(":", 1)[1]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert tag == kvscope.__version__ == chart["appVersion"]
    assert "node" in next(v for f, v in pairwise(build) if v.startswith("KVSCOPE_EXTRAS=")
                          and f == "--build-arg")


def test_the_sidecar_snippet_is_the_charts_sidecar_and_restricted() -> None:
    (snippet,) = [yaml.safe_load(b) for b in _blocks("yaml") if "initContainers" in b]
    (container,) = snippet["initContainers"]
    resources = render({"example": {"enabled": True}})
    (deployment,) = by_kind(resources, "Deployment")
    (chart_sidecar,) = deployment["spec"]["template"]["spec"]["initContainers"]

    def subset(small: Any, big: Any, where: str) -> None:
        if isinstance(small, dict):
            for key, value in small.items():
                assert key in big, f"{where}.{key} is not in the chart's sidecar"
                subset(value, big[key], f"{where}.{key}")
        else:
            assert small == big, where

    subset({k: v for k, v in container.items() if k != "image"}, chart_sidecar, "sidecar")
    configmaps = {r["metadata"]["name"] for r in by_kind(resources, "ConfigMap")}
    assert {v["configMap"]["name"] for v in snippet["volumes"] if "configMap" in v} <= configmaps
    pod = {"securityContext": {}, "initContainers": [container], "containers": [], "volumes": snippet["volumes"]}
    assert violations(pod, "restricted") == []
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert "`release: kube-prometheus-stack`" in DOC.read_text()
    assert defaults["monitoring"]["labels"] == {"release": "kube-prometheus-stack"}
    assert defaults["dashboards"]["labels"] == {"grafana_dashboard": "1"}
