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
that cluster and namespace.
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
SCOPE = {"cluster": "c1", "namespace": "inference"}


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


@contextmanager
def _serve(pod: Pod) -> Iterator[int]:
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


def _config(tmp: Path, ports: dict[str, int]) -> Path:
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES / "kvscope.rules.yml"), str(RULES / "examples" / "kvscope-site.rules.yml")],
        "scrape_configs": [{"job_name": "kvscope", "static_configs": [
            {"targets": [f"127.0.0.1:{port}"], "labels": {**SCOPE, "pod": name}} for name, port in ports.items()]}],
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


def _values(prom: Prometheus, expr: str) -> list[tuple[dict[str, str], float]]:
    return [(r["metric"], float(r["value"][1])) for r in prom.query(substitute(expr, SCOPE))]


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
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        stack.enter_context(process(
            [prometheus_bin, f"--config.file={_config(tmp_path, ports)}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"], tmp_path / "prometheus.log", f"{url}/-/ready"))
        prom = Prometheus(url)
        panels = {(p["board"], p["title"]): p for p in _panels()}
        served = panels[("kvscope / KV tiers overview", "Served share per tier")]["targets"][0]["expr"]
        wait("both pods' served share and the fleet's G4 load",
             lambda: len(_by_tier(prom, served)) == len(HITS)
             and prom.query('tier:kvscope_kv_fetch_utilisation:ratio_rate5m{tier="G4"}')
             and prom.query("model:kvscope_kv_served_share:ratio_rate5m"), 60)

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
    print(f"\n{len(panels)} panels queried over two pods; {time.monotonic() - started:.1f} s")
