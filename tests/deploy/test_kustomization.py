"""deploy/kubernetes/kustomization.yaml: a Kustomization listing every plain manifest of the folder, each of
which exists, parses as one object and is valid against its schema (Kubernetes' own, strict, or the
prometheus-operator CRD's). kubectl and kustomize are not here: what `kubectl apply -k` reads is checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from testkit.crd_schema import crd_validator
from testkit.paths import ROOT

K8S = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.33"
CRD_KINDS = {"PodMonitor": "podmonitors", "ServiceMonitor": "servicemonitors", "PrometheusRule": "prometheusrules"}


def _kustomization() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    return data


def problems(folder: Path, kustomization: dict[str, Any]) -> list[str]:
    """What `kubectl apply -k` would trip on, or what the listing leaves out of the folder."""
    found = []
    if (kustomization.get("apiVersion"), kustomization.get("kind")) != (
            "kustomize.config.k8s.io/v1beta1", "Kustomization"):
        found.append("not a kustomize.config.k8s.io/v1beta1 Kustomization")
    listed = kustomization.get("resources", [])
    if len(set(listed)) != len(listed):
        found.append("a resource listed twice")
    unlisted = {p.name for p in folder.glob("*.yaml")} - {"kustomization.yaml"} - set(listed)
    found += [f"{name}: not listed" for name in sorted(unlisted)]
    for name in listed:
        path = folder / name
        if not path.is_file():
            found.append(f"{name}: no such file")
            continue
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
        if len(documents) != 1:
            found.append(f"{name}: {len(documents)} objects")
            continue
        (resource,) = documents
        if resource.get("kind") in CRD_KINDS:
            found += [f"{name}: {e.message}" for e in crd_validator(CRD_KINDS[resource["kind"]]).iter_errors(resource)]
        else:
            try:
                kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)
            except kubernetes_validate.ValidationError as error:
                found.append(f"{name}: {error}")
    return found


def test_the_kustomization_lists_every_manifest_and_each_is_valid() -> None:
    assert problems(K8S, _kustomization()) == []


@pytest.mark.parametrize(("change", "expected"), [
    (lambda k, _: k["resources"].append("daemonset.yaml"), "daemonset.yaml: no such file"),
    (lambda k, _: k["resources"].remove("service.yaml"), "service.yaml: not listed"),
    (lambda k, _: k.update(kind="Kustomisation"), "not a kustomize.config.k8s.io/v1beta1 Kustomization"),
    (lambda _, folder: (folder / "service.yaml").write_text(
        (folder / "service.yaml").read_text().replace("  ports:", "  port:")), "service.yaml: "),
    (lambda _, folder: (folder / "podmonitor.yaml").write_text(
        (folder / "podmonitor.yaml").read_text().replace("podMetricsEndpoints", "podMetricEndpoints")),
     "podmonitor.yaml: "),
])
def test_each_problem_is_caught(tmp_path: Path, change: Any, expected: str) -> None:
    for path in K8S.glob("*.yaml"):
        (tmp_path / path.name).write_text(path.read_text())
    kustomization = _kustomization()
    change(kustomization, tmp_path)
    assert any(p.startswith(expected) for p in problems(tmp_path, kustomization)), problems(tmp_path, kustomization)
