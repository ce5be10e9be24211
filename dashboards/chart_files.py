"""The Helm chart's copies of generated and shared files (Helm reads nothing outside the chart's folder).

`chart_files(generated)` takes what `kvscope.dashboards.build.render()` generated and returns the chart's
copies: each dashboard's JSON, the rule files except the site's (deploy/helm/kvscope/values.yaml's
siteFacts make that group), and the sidecar's configuration from deploy/kubernetes/configmap.yaml, the
sidecar's documented config. tests/dashboards/test_build.py fails when a committed copy is stale.
"""

from __future__ import annotations

from pathlib import Path

import yaml

CHART = "deploy/helm/kvscope"
SIDECAR_CONFIGMAP = "deploy/kubernetes/configmap.yaml"
SITE_GROUP = "kvscope.site"


def chart_files(generated: dict[str, str], rules_dir: Path, root: Path) -> dict[str, str]:
    out = {f"{CHART}/files/dashboards/{Path(path).name}": text
           for path, text in generated.items() if path.startswith("dashboards/grafana/")}
    for rules in sorted(rules_dir.glob("*.yml")):
        groups = yaml.safe_load(rules.read_text())["groups"]
        if all(group["name"] != SITE_GROUP for group in groups):
            out[f"{CHART}/files/rules/{rules.name}"] = rules.read_text()
    configmap = yaml.safe_load((root / SIDECAR_CONFIGMAP).read_text())
    out[f"{CHART}/files/sidecar.toml"] = configmap["data"]["kvscope.toml"]
    return out
