"""End to end: a real Prometheus (Debian's) with the shipped configuration and rules scrapes kvscope while
the reference pipeline serves load, and every dashboard query and every recording rule returns data;
alerts fire from what the pipeline does and reach a real Alertmanager.

What runs, all on 127.0.0.1:
- the reference engine (in-process: its device slot stands in for the GPU's busy/idle samples, as in the
  self-test), driven over its OpenAI endpoint by the compose demo's load generator (deploy/compose/load.py);
- the pod's agent, built from the compose demo's kvscope.toml with the addresses overridden through
  KVSCOPE_* variables, plus a correlation path for G4 (the disk under the test's temporary folder);
- a second agent for the hardware this machine lacks: host collectors on the captured and constructed
  /proc and /sys trees of tests/fixtures (NVMe, NICs, RDMA ports, NFS and Lustre mounts) and the NVML
  collector on a recorded H200 (tests/fixtures/nvml); and the engines that need a GPU (SGLang with a
  storage backend its table does not know, LMCache's multiprocess server, a Dynamo frontend with its KV
  router), as their fixture pages served over HTTP, growing with every scrape (testkit/growing_pages.py);
- Prometheus with deploy/prometheus/prometheus.yml, changed only where a test must: loopback targets, 1 s
  scrape and evaluation intervals, and a copy of dashboards/rules whose alerts hold for 1 s instead of
  minutes (promtool's unit tests check the real `for`) and whose site file gives G4 the read bandwidth of
  this laptop-scale pipeline (100 kB/s; the shipped site file sets none);
- Alertmanager with deploy/alertmanager/alertmanager.yml.

The queries run while the load runs: gauges the correlation engine exports per window (path signals,
bandwidth drop) exist only while KV moves. Scenario alerts: the fleet's G4 reads exceed the configured
bandwidth (KVScopeSharedTierNearCapacity), then the engine stops answering (KVScopeEngineDown); both must
be silent before.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvscope.agent.app.wiring import Agent, build_agent, components
from kvscope.agent.config.settings import load_config
from kvscope.agent.core.pipeline import Components
from kvscope.agent.tools.reference.device import DeviceSamples
from kvscope.agent.tools.reference.engine import Engine
from kvscope.agent.tools.reference.openai_server import ReferenceServer
from kvscope.agent.tools.reference.tracing import RequestTracer
from kvscope.agent.tools.selftest.plans import SharedPromptsPlan
from kvscope.collectors.gpu.nvml import NvmlCollector
from kvscope.collectors.host.inputs import block_device_of
from kvscope.dashboards.build import DASHBOARDS
from testkit.environment import require_tool
from testkit.growing_pages import growing_server
from testkit.http import free_port
from testkit.nvml_replay import NvmlReplay
from testkit.paths import FIXTURES, ROOT
from testkit.prometheus import Prometheus, get, process, wait
from testkit.promql_names import substitute

RULES = ROOT / "dashboards" / "rules"
PATH_SIGNALS = ("kvscope_tier_path_utilisation_ratio", "kvscope_tier_path_non_kv_share_ratio",
                "kvscope_tier_fetch_bandwidth_drop_ratio", "kvscope_tier_noisy_neighbour", "kvscope_tier_saturated")
pytestmark = pytest.mark.integration


def _problem(result: list[dict[str, Any]]) -> str | None:
    """None when the result has data and no NaN; else what is wrong."""
    if not result:
        return "no data"
    nan = [r["metric"] for r in result if math.isnan(float(r["value"][1]))]
    return f"NaN in {len(nan)} of {len(result)} series, e.g. {nan[0]}" if nan else None


def _host_tree(tmp: Path) -> Path:
    """The hardware this machine lacks, as kernel trees: gpu-node's disks, NICs and RDMA ports, and the
    shared-FS node's NFS and Lustre mounts, merged into one proc/sys root."""
    root = tmp / "host"
    shutil.copytree(FIXTURES / "host" / "gpu-node", root, symlinks=True)
    shutil.copytree(FIXTURES / "sharedfs" / "node", root, symlinks=True, dirs_exist_ok=True)
    return root


ENGINE_PAGES = {  # path → (collector, fixture page): what the GPU engines would serve
    "/sglang": ("sglang", "sglang/hicache-nixl-current-tp1.prom"),
    "/lmcache": ("lmcache", "lmcache/mp-server-two-tenants-fs.prom"),
    "/dynamo": ("dynamo", "dynamo/frontend-router-kv-hit-rate.prom"),
}


def _engine_pages() -> dict[str, str]:
    pages = {path: (FIXTURES / name).read_text() for path, (_, name) in ENGINE_PAGES.items()}
    # a backend SGLang names that kvscope's table does not know: its warning's counter has data
    pages["/sglang"] = pages["/sglang"].replace("HiCacheNixl", "AcmeKV").replace('"nixl"', '"acme"')
    return pages


def _hardware_agent(tmp: Path, engines: str) -> Agent:
    root = _host_tree(tmp)
    extra = {"lmcache": "tenants_top_n = 10\n"}  # the served share by tenant panel's LMCache query
    sections = "".join(f'[collectors.{collector}]\nenabled = true\nurls = ["{engines}{path}"]\n'
                       f'{extra.get(collector, "")}' for path, (collector, _) in ENGINE_PAGES.items())
    text = f"""\
[agent]
interval = 0.5
proc_root = {json.dumps(str(root / "proc"))}
sys_root = {json.dumps(str(root / "sys"))}
log_level = "warning"
[exporters.prometheus]
listen = "127.0.0.1:0"
[collectors.nvml]
utilization = "rates"
pcie = "throughput"
pcie_poll_seconds = 0
[analyses.correlation]
enabled = false
{sections}"""
    recording = json.loads((FIXTURES / "nvml" / "h200_real_fallback.json").read_text())
    recording.setdefault("defaults", {})["nvmlShutdown"] = {"result": None}  # the agent stops before the end
    parts = components()
    nvml = dataclasses.replace(parts.collectors["nvml"], factory=lambda options, ctx: NvmlCollector(
        NvmlReplay(recording), options, ctx.clock, ctx.wall_clock, ctx.proc_root))
    parts = Components({**parts.collectors, "nvml": nvml}, parts.analyses, parts.sinks)
    return build_agent(load_config(text, parts, environ={}, origin="hardware"), parts)


def _pod_agent(engine: Engine, server: ReferenceServer, device: str | None) -> Agent:
    """The compose demo's agent configuration, pointed at this engine through the environment."""
    pub = engine.publisher
    assert pub is not None and pub.replay_endpoint is not None
    environ = {
        "KVSCOPE_AGENT__INTERVAL": "0.25",
        "KVSCOPE_AGENT__LOG_LEVEL": "warning",
        "KVSCOPE_EXPORTERS__PROMETHEUS__LISTEN": "127.0.0.1:0",
        "KVSCOPE_COLLECTORS__VLLM__URLS": f"{server.url}/metrics",
        "KVSCOPE_COLLECTORS__VLLM_KV_EVENTS__ENDPOINT": pub.endpoint,
        "KVSCOPE_COLLECTORS__VLLM_KV_EVENTS__REPLAY_ENDPOINT": pub.replay_endpoint,
        "KVSCOPE_COLLECTORS__VLLM_KV_EVENTS__TENANTS_TOP_N": "10",  # the served share by tenant panel
        "KVSCOPE_COLLECTORS__OTLP_TRACES__LISTEN": "127.0.0.1:0",
        "KVSCOPE_COLLECTORS__NVML__ENABLED": "false",  # the engine's device slot is the GPU here
        "KVSCOPE_ANALYSES__CORRELATION__STALL_SETTLE_SECONDS": "0.5",
        # a site's prices (the shipped configuration has none: without them the price panels are empty)
        "KVSCOPE_ANALYSES__VALUE__GPU_HOUR": "2.0",
        "KVSCOPE_ANALYSES__VALUE__TIER_GIB_MONTH": "{ G1 = 10.0, G2 = 1.0, G3 = 0.1, G4 = 0.05 }",
    }
    if device is not None:  # G4's path: the disk its block files are on
        environ["KVSCOPE_COLLECTORS__DISK__INCLUDE"] = device
        environ["KVSCOPE_ANALYSES__CORRELATION__PATHS"] = (
            f"{{ G4 = ['kvscope_disk_read_bytes_total{{device=\"{device}\"}}', "
            f"'kvscope_disk_written_bytes_total{{device=\"{device}\"}}'] }}")
    shipped = ROOT / "deploy" / "compose" / "kvscope.toml"
    config = load_config(shipped.read_text(), components(), environ=environ, origin=str(shipped))
    device_slot = DeviceSamples(lambda: list(engine.device_intervals), engine.wall_at(engine.clock()), time.time)
    return build_agent(config, gpu_intervals=device_slot)


def _otlp_port(agent: Agent) -> int:
    wait("the OTLP receiver", lambda: (agent.store.value("kvscope_collector_runs_total", ("otlp_traces",)) or 0) >= 1,
          10, 0.01)
    return int(agent.collectors["otlp_traces"].address[1])  # type: ignore[attr-defined]


def _rules(tmp: Path) -> Path:
    """dashboards/rules as shipped, except: alerts hold for 1 s, and the site file (shipped empty) gives G4
    this pipeline's read bandwidth."""
    out = tmp / "rules"
    out.mkdir()
    for path in RULES.glob("*.yml"):
        data = yaml.safe_load(path.read_text())
        for group in data["groups"]:
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = "1s"
            if group["name"] == "kvscope.site":
                group["rules"] = [{"record": "kvscope:tier_fetch_capacity_bytes_per_second", "expr": "vector(1e5)",
                                   "labels": {"tier": "G4"}}]
        (out / path.name).write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def _prometheus_config(tmp: Path, port: int, alertmanager: str, targets: list[str]) -> Path:
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(_rules(tmp) / "*.yml")]
    config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = [alertmanager]
    for job in config["scrape_configs"]:
        job["static_configs"][0]["targets"] = targets if job["job_name"] == "kvscope" else [f"127.0.0.1:{port}"]
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def _panel_queries() -> list[tuple[str, str, str]]:
    out = []
    for path in DASHBOARDS:
        board = json.loads((ROOT / path).read_text())
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                out.append((board["title"], panel["title"], target["expr"]))
    return out


def _recording_rules() -> list[str]:
    names = {r["record"] for p in RULES.glob("*.yml") for g in yaml.safe_load(p.read_text())["groups"]
             for r in g["rules"] if "record" in r}
    return sorted(names)


def test_every_panel_and_rule_has_data_and_alerts_fire(tmp_path: Path) -> None:
    prometheus_bin, alertmanager_bin = require_tool("prometheus"), require_tool("prometheus-alertmanager")
    started = time.monotonic()
    with ExitStack() as stack:
        data_dir = tmp_path / "engine"
        engine = Engine(SharedPromptsPlan().base(data_dir))
        server = ReferenceServer(engine)
        engine.start()
        stack.callback(engine.stop)
        server.start()
        server_up = True

        def stop_server() -> None:
            if server_up:
                server.stop()

        stack.callback(stop_server)
        device = block_device_of(data_dir)
        engine_pages = stack.enter_context(growing_server(_engine_pages()))
        pod, hardware = _pod_agent(engine, server, device), _hardware_agent(tmp_path, engine_pages.url(""))
        for agent in (pod, hardware):
            agent.start()
            stack.callback(agent.stop)
        engine.tracer = tracer = RequestTracer(f"http://127.0.0.1:{_otlp_port(pod)}")
        stack.callback(tracer.provider.shutdown)
        assert pod.server is not None and hardware.server is not None
        targets = [f"127.0.0.1:{pod.server.port}", f"127.0.0.1:{hardware.server.port}"]

        am_port, prom_port = free_port(), free_port()
        am_url, prom_url = f"http://127.0.0.1:{am_port}", f"http://127.0.0.1:{prom_port}"
        stack.enter_context(process(
            [alertmanager_bin, f"--config.file={ROOT / 'deploy/alertmanager/alertmanager.yml'}",
             f"--storage.path={tmp_path / 'am'}", f"--web.listen-address=127.0.0.1:{am_port}",
             "--cluster.listen-address="], tmp_path / "alertmanager.log", f"{am_url}/-/ready"))
        config = _prometheus_config(tmp_path, prom_port, f"127.0.0.1:{am_port}", targets)
        stack.enter_context(process(
            [prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"], tmp_path / "prometheus.log", f"{prom_url}/-/ready"))
        prom = Prometheus(prom_url)
        wait("both agents scraped", lambda: len(prom.query('up{job="kvscope"} == 1')) == 2, 30)
        quiet = prom.alerts("firing") | prom.alerts("pending")
        assert not quiet & {"KVScopeSharedTierNearCapacity", "KVScopeEngineDown"}, quiet

        load = stack.enter_context(process(
            [sys.executable, str(ROOT / "deploy/compose/load.py"), f"--url={server.url}", "--prompts=8",
             "--prompt-tokens=2048", "--concurrency=2", "--requests=0"], tmp_path / "load.log", f"{server.url}/health"))
        rules, panels = _recording_rules(), _panel_queries()

        def problems() -> dict[str, str]:
            out = {}
            for name in rules:
                problem = _problem(prom.query(name))
                if problem:
                    out[f"recording rule {name}"] = problem
            for board, panel, expr in panels:
                if device is None and any(name in expr for name in PATH_SIGNALS):
                    continue  # no block device under the temporary folder: no G4 path to watch
                problem = _problem(prom.query(substitute(expr)))
                if problem:
                    out[f"{board} / {panel}: {expr}"] = problem
            return out

        # the first windows fill in over the first seconds of load (cost model fit, per-request records)
        try:
            wait("every panel query and recording rule", lambda: not problems(), 90, 1.0)
        except AssertionError:
            raise AssertionError("\n".join(f"{k}: {v}" for k, v in problems().items())) from None
        ready_after = time.monotonic() - started

        wait("KVScopeSharedTierNearCapacity firing", lambda: "KVScopeSharedTierNearCapacity" in prom.alerts(), 30)
        load.terminate()
        server.stop()
        server_up = False
        wait("KVScopeEngineDown firing", lambda: "KVScopeEngineDown" in prom.alerts(), 30)

        def received() -> set[str]:
            return {a["labels"]["alertname"] for a in get(f"{am_url}/api/v2/alerts")}

        wait("both alerts in Alertmanager",
              lambda: {"KVScopeSharedTierNearCapacity", "KVScopeEngineDown"} <= received(), 30)
    print(f"\nrecording rules ready after {ready_after:.1f} s; whole run {time.monotonic() - started:.1f} s; "
          f"{len(panels)} panel queries, {len(rules)} recording rules; G4 path on {device}")
