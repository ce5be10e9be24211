"""kvscope's Helm chart (deploy/helm/kvscope) rendered by Helm's own engine: Helm v4 as a library
(helm-python-sdk, offline; `make tools` installs it), for the chart's tests and docs/deploy.md's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from testkit.environment import missing_environment
from testkit.paths import ROOT

CHART = ROOT / "deploy" / "helm" / "kvscope"


def helm() -> Any:
    try:
        import helm_python
    except ImportError:
        missing_environment("Helm's engine is not installed: `make tools` installs helm-python-sdk")
    return helm_python


def render(values: dict[str, Any] | None = None, chart: Path = CHART) -> list[dict[str, Any]]:
    """Every object the chart renders (release kvscope in namespace monitoring) with `values`."""
    manifests = helm().Chart.load(str(chart)).render(values=values or {}, name="kvscope", namespace="monitoring")
    return [doc for path, text in sorted(manifests.items()) if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]


def by_kind(resources: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in resources if r["kind"] == kind]
