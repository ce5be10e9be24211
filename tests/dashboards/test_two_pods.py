"""Every dashboard query against a real Prometheus (Debian's) scraping two pods that share one G4: the
shares a panel draws stay within 0-100 % (stacked ones in total), and the shared tier's capacity is
counted once, not once per pod.

The pods are two small expositions on 127.0.0.1 whose counters grow at fixed rates from the moment the
test starts (value = rate x seconds since then, read at each scrape), so every ratio is known from the
rates below. Pod a runs two data-parallel ranks, pod b one; each rank looks up 1,000 prompt tokens a
second and is served 60 % from cache (30 % G1, 30 % G4), so one stacked series per pod and rank would
draw 180 %. Every rank reports the one G4 they all share, at its full size. Prometheus scrapes both
every second with `cluster` and `namespace` target labels, evaluates the shipped recording rules and the
site example (G4 at 315 GB/s), and each panel's expression is queried with Grafana's variables set to
that cluster and the pods' namespaces.

The pods run in namespaces of their own on node n1, whose node agent reads two GPUs, one given to each
pod (kvscope_gpu_pod_info, as the kubelet says), and a disk; the node agent of n2 reads a GPU no pod was
given and a disk of its own. Both are scraped as the chart's ServiceMonitor does: their own namespace,
`instance` and `node` the node's name, the exposition's labels kept (honor_labels). The GPU panels show
each GPU under its owner and the namespace and pod variables select by owner; the device panels show the
nodes the selected pods run on.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvscope.dashboards.build import DASHBOARDS
from testkit.environment import require_tool
from testkit.http import free_port
from testkit.paths import ROOT
from testkit.prometheus import Prometheus, process, wait
from testkit.promql_names import substitute

pytestmark = pytest.mark.integration

RULES = ROOT / "dashboards" / "rules"
LOOKUPS = 1000.0  # prompt tokens a second, per rank
HITS = {"G1": 300.0, "G4": 300.0}  # served tokens a second, per rank
TTFT = {"queue": 0.2, "fetch": 0.3, "prefill": 0.5}  # attributed seconds per second of TTFT, per rank
G4_FETCH = 2e9  # bytes a second each rank reads from G4
CAPACITY_BYTES = {"G1": 40e9, "G2": 200e9}  # per rank: each rank has its own
CAPACITY_TOKENS = {"G1": 300_000.0, "G2": 1_500_000.0}
SHARED_BYTES, SHARED_TOKENS = 1e15, 7.5e9  # the one G4, as every rank reports it
PODS = {"a": ("0", "1"), "b": ("0",)}
NAMESPACES = {"a": "team-a", "b": "team-b"}
SCOPE = {"cluster": "c1", "namespace": "team-a|team-b"}
# node -> gpu -> (idle share, the pod it was given or None); every GPU receives GPU_RECEIVE bytes a second
GPUS: dict[str, dict[str, tuple[float, str | None]]] = {"n1": {"0": (0.25, "a"), "1": (0.5, "b")},
                                                        "n2": {"0": (1.0, None)}}
GPU_RECEIVE = 1e9
DISK_READ = 5e8  # bytes a second each node's disk reads


@dataclass(frozen=True, slots=True)
class Pod:
    ranks: tuple[str, ...]
    started: float

    def exposition(self) -> str:
        elapsed = time.monotonic() - self.started
        lines = ['kvscope_build_info{version="test"} 1']
        for rank in self.ranks:
            labels = f'engine="vllm",model="m",dp_rank="{rank}"'
            lines.append(f"kvscope_kv_lookup_tokens_total{{{labels}}} {LOOKUPS * elapsed}")
            lines += [f'kvscope_kv_hit_tokens_total{{{labels},tier="{t}"}} {r * elapsed}' for t, r in HITS.items()]
            lines.append(f"kvscope_ttft_seconds_sum{{{labels}}} {elapsed}")
            lines += [f'kvscope_ttft_attributed_seconds_total{{{labels},component="{c}",method="measured"}} '
                      f"{r * elapsed}" for c, r in TTFT.items()]
            lines.append(f'kvscope_kv_transfer_bytes_total{{{labels},src="G4",dst="G2"}} {G4_FETCH * elapsed}')
            for tier in CAPACITY_BYTES:
                lines.append(f'kvscope_tier_capacity_bytes{{{labels},tier="{tier}"}} {CAPACITY_BYTES[tier]}')
                lines.append(f'kvscope_tier_capacity_tokens{{{labels},tier="{tier}"}} {CAPACITY_TOKENS[tier]}')
                lines.append(f'kvscope_tier_used_bytes{{{labels},tier="{tier}"}} {CAPACITY_BYTES[tier] / 2}')
            lines.append(f'kvscope_tier_capacity_bytes{{{labels},tier="G4"}} {SHARED_BYTES}')
            lines.append(f'kvscope_tier_capacity_tokens{{{labels},tier="G4"}} {SHARED_TOKENS}')
            lines.append(f'kvscope_tier_used_bytes{{{labels},tier="G4"}} {SHARED_BYTES / 10}')
        return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class NodeAgent:
    node: str
    started: float

    def exposition(self) -> str:
        elapsed = time.monotonic() - self.started
        lines = ['kvscope_build_info{version="test"} 1',
                 f'kvscope_disk_read_bytes_total{{device="nvme0n1"}} {DISK_READ * elapsed}']
        for gpu, (idle, owner) in GPUS[self.node].items():
            lines += [f'kvscope_gpu_idle_seconds_total{{gpu="{gpu}"}} {idle * elapsed}',
                      f'kvscope_gpu_busy_seconds_total{{gpu="{gpu}"}} {(1 - idle) * elapsed}',
                      f'kvscope_gpu_pcie_receive_bytes_total{{gpu="{gpu}"}} {GPU_RECEIVE * elapsed}',
                      f'kvscope_gpu_pcie_transmit_bytes_total{{gpu="{gpu}"}} {GPU_RECEIVE * elapsed}']
            if owner is not None:
                lines.append(f'kvscope_gpu_pod_info{{gpu="{gpu}",uuid="GPU-{self.node}-{gpu}",'
                             f'namespace="{NAMESPACES[owner]}",pod="{owner}",container="vllm"}} 1')
        return "\n".join(lines) + "\n"


@contextmanager
def _serve(pod: Pod | NodeAgent) -> Iterator[int]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pod.exposition().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _config(tmp: Path, ports: dict[str, int], nodes: dict[str, int]) -> Path:
    """The chart's monitors, as static targets: a sidecar's instance is its pod's name, a node agent's its
    node's; both carry node; the node agent keeps its exposition's namespace and pod (honor_labels)."""
    cluster = SCOPE["cluster"]
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES / "kvscope.rules.yml"), str(RULES / "examples" / "kvscope-site.rules.yml")],
        "scrape_configs": [
            {"job_name": "kvscope", "static_configs": [
                {"targets": [f"127.0.0.1:{port}"], "labels": {
                    "cluster": cluster, "namespace": NAMESPACES[name], "pod": name, "instance": name, "node": "n1"}}
                for name, port in ports.items()]},
            {"job_name": "kvscope-node", "honor_labels": True, "static_configs": [
                {"targets": [f"127.0.0.1:{port}"], "labels": {
                    "cluster": cluster, "namespace": "kvscope", "pod": f"kvscope-node-{node}", "instance": node,
                    "node": node}}
                for node, port in nodes.items()]}],
    }
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def _panels() -> list[dict[str, Any]]:
    out = []
    for path in sorted(DASHBOARDS):
        board = json.loads((ROOT / path).read_text())
        out += [{**p, "board": board["title"]} for p in board["panels"] if p["type"] != "row"]
    return out


def _values(prom: Prometheus, expr: str, scope: dict[str, str] = SCOPE) -> list[tuple[dict[str, str], float]]:
    return [(r["metric"], float(r["value"][1])) for r in prom.query(substitute(expr, scope))]


def _by_tier(prom: Prometheus, expr: str) -> dict[str, float]:
    return {metric["tier"]: value for metric, value in _values(prom, expr)}


def _percent_problems(prom: Prometheus, panel: dict[str, Any]) -> tuple[list[str], bool]:
    """What is wrong with a percentunit panel's shares (a difference of two shares may go down to -100 %),
    and whether it drew any."""
    stacked = panel["fieldConfig"]["defaults"].get("custom", {}).get("stacking", {}).get("mode") == "normal"
    values = [(m, v) for t in panel["targets"] for m, v in _values(prom, t["expr"])]
    lowest = -1 if any(" - " in t["expr"] for t in panel["targets"]) else 0
    name = f"{panel['board']} / {panel['title']}"
    problems = [f"{name}: {v} for {m}" for m, v in values if math.isnan(v) or not lowest <= v <= 1 + 1e-9]
    total = sum(v for _, v in values)
    if stacked and total > 1 + 1e-3:
        problems.append(f"{name}: stacked to {total:.3f} over {len(values)} series")
    return problems, bool(values)


def test_every_panel_over_two_pods_sharing_one_g4(tmp_path: Path) -> None:
    prometheus_bin = require_tool("prometheus")
    started = time.monotonic()
    with ExitStack() as stack:
        ports = {name: stack.enter_context(_serve(Pod(ranks, started))) for name, ranks in PODS.items()}
        nodes = {node: stack.enter_context(_serve(NodeAgent(node, started))) for node in GPUS}
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        config = _config(tmp_path, ports, nodes)
        stack.enter_context(process(
            [prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"], tmp_path / "prometheus.log", f"{url}/-/ready"))
        prom = Prometheus(url)
        panels = {(p["board"], p["title"]): p for p in _panels()}
        served = panels[("kvscope / KV tiers overview", "Served share per tier")]["targets"][0]["expr"]
        wait("both pods' served share, the fleet's G4 load and every GPU's idle share and PCIe rate",
             lambda: len(_by_tier(prom, served)) == len(HITS)
             and prom.query('tier:kvscope_kv_fetch_utilisation:ratio_rate5m{tier="G4"}')
             and prom.query("model:kvscope_kv_served_share:ratio_rate5m")
             and len(prom.query("kvscope:gpu_idle:ratio_rate5m")) == sum(map(len, GPUS.values()))
             and len(prom.query("kvscope:gpu_pcie_transmit_bytes:rate5m")) == sum(map(len, GPUS.values())), 60)

        problems, drawn = [], []
        for panel in panels.values():
            if panel["fieldConfig"]["defaults"]["unit"] == "percentunit":
                found, any_data = _percent_problems(prom, panel)
                problems += found
                if any_data:
                    drawn.append(panel["title"])
            else:
                for target in panel["targets"]:
                    _values(prom, target["expr"])  # Prometheus answers it (Prometheus.query asserts success)
        assert problems == []
        assert {"Served share per tier", "Conditional hit rate per tier", "Shared tier load",
                "Share of TTFT: frontend / queue / fetch / offload / prefill / other",
                "Served share by model and tier"} <= set(drawn), drawn

        ranks = sum(len(r) for r in PODS.values())
        share = _by_tier(prom, served)
        for tier, rate in HITS.items():
            assert share[tier] == pytest.approx(rate / LOOKUPS, rel=1e-3)
        capacity = panels[("kvscope / KV tiers overview", "Used bytes and capacity per tier")]["targets"][1]["expr"]
        assert _by_tier(prom, capacity) == pytest.approx({**{t: c * ranks for t, c in CAPACITY_BYTES.items()},
                                                          "G4": SHARED_BYTES})
        tokens = panels[("kvscope / KV tiers overview", "Capacity per tier (tokens)")]["targets"][0]["expr"]
        assert _by_tier(prom, tokens) == pytest.approx({**{t: c * ranks for t, c in CAPACITY_TOKENS.items()},
                                                        "G4": SHARED_TOKENS})
        _check_gpus_and_nodes(prom, panels)
    print(f"\n{len(panels)} panels queried over two pods; {time.monotonic() - started:.1f} s")


def _gpus(prom: Prometheus, expr: str, scope: dict[str, str]) -> dict[tuple[str, str], tuple[str, str, float]]:
    """(node, gpu) -> (namespace, pod, value) of each series the expression draws."""
    out = {}
    for metric, value in _values(prom, expr, scope):
        key = (metric["node"], metric["gpu"])
        assert key not in out, f"{key} drawn twice: {expr}"
        out[key] = (metric["namespace"], metric["pod"], value)
    return out


def _check_gpus_and_nodes(prom: Prometheus, panels: dict[tuple[str, str], dict[str, Any]]) -> None:
    """Each GPU panel draws every GPU under the pod it was given, and $namespace and $instance (a pod's name)
    keep only that pod's GPUs; device panels keep the nodes the selected pods run on."""
    board = "kvscope / Hardware path"
    idle = panels[(board, "GPU idle share")]["targets"][0]["expr"]
    pcie = [t["expr"] for t in panels[(board, "Host↔GPU PCIe bytes: to the GPU up, from it down")]["targets"]]
    owned = {("n1", gpu): (NAMESPACES[owner], owner) for gpu, (_, owner) in GPUS["n1"].items() if owner}
    assert len(owned) == 2
    everything = {**SCOPE, "namespace": ".*"}
    for expr in (idle, *pcie):
        drawn = _gpus(prom, expr, SCOPE)
        assert {k: v[:2] for k, v in drawn.items()} == owned, expr
        for pod in PODS:  # the namespace of one pod, then its name, keeps its GPU only
            only = {k: v for k, v in owned.items() if v[1] == pod}
            assert {k: v[:2] for k, v in _gpus(prom, expr, {**SCOPE, "namespace": NAMESPACES[pod]}).items()} == only
            assert {k: v[:2] for k, v in _gpus(prom, expr, {**SCOPE, "instance": pod}).items()} == only
        # all namespaces: the GPU of n2 that no pod was given shows under the node agent that reads it
        assert {k: v[:2] for k, v in _gpus(prom, expr, everything).items()} == {
            **owned, ("n2", "0"): ("kvscope", "kvscope-node-n2")}
    for (node, gpu), (_, _, value) in _gpus(prom, idle, everything).items():
        assert value == pytest.approx(GPUS[node][gpu][0], rel=1e-3), (node, gpu)
    # (a rate's value is not checked: over a window longer than the test it is diluted)
    assert all(value > 0 for _, _, value in _gpus(prom, pcie[0], everything).values())

    disk = panels[(board, "Block devices: read up, written down")]["targets"][0]["expr"]
    for scope, expected in ((SCOPE, {"n1"}), ({**SCOPE, "instance": "b"}, {"n1"}),
                            ({**SCOPE, "namespace": "team-c"}, set()), (everything, {"n1", "n2"})):
        drawn = _values(prom, disk, scope)
        assert {m["instance"] for m, _ in drawn} == expected, scope
        assert all(v > 0 for _, v in drawn), drawn
