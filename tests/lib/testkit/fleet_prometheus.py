"""A real Prometheus over a backfilled fleet: blocks made by `promtool tsdb create-blocks-from openmetrics`
from testkit/fleet_history.py, the shipped recording and alert rules, and the dashboards' panel queries
asked over its HTTP API. Shared by bench/bench_fleet.py (1,000 pods) and its small test in `make test`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kvscope.dashboards.build import DASHBOARDS
from testkit import fleet_history as fh
from testkit.http import free_port
from testkit.paths import ROOT
from testkit.prometheus import Prometheus, get, process
from testkit.promql_names import DEFAULT_STEP, substitute

RULES = ROOT / "dashboards" / "rules"
BLOCK_SECONDS = 2 * 3600  # promtool's default block length; one OpenMetrics file per block keeps the disk small
RULE_EVAL_INTERVAL = "15s"  # the rule groups' interval where they set none (Prometheus' evaluation_interval)
# the site rule the chart's values set for the seeds' G4 (8-node IBM Storage Scale, 315 GB/s)
SITE_RULE = {"record": "kvscope:tier_fetch_capacity_bytes_per_second", "expr": "vector(315e9)",
             "labels": {"tier": "G4"}}


@dataclass(frozen=True, slots=True)
class Backfill:
    samples: int
    blocks: int
    bytes_on_disk: int
    generate_seconds: float
    promtool_seconds: float
    max_time: int  # the last sample's instant, seconds


def existing(data: Path, generate_seconds: float = 0.0, promtool_seconds: float = 0.0) -> Backfill:
    """What the blocks in `data` hold, from their meta.json files and their size."""
    metas = [json.loads(p.read_text()) for p in data.glob("*/meta.json")]
    size = sum(f.stat().st_size for f in data.rglob("*") if f.is_file())
    return Backfill(sum(m["stats"]["numSamples"] for m in metas), len(metas), size, generate_seconds,
                    promtool_seconds, max(m["maxTime"] for m in metas) // 1000)


def backfill(fleet: fh.Fleet, pods: int, timestamps: list[int], data: Path, scratch: Path) -> Backfill:
    """Writes the fleet's samples at `timestamps` into TSDB blocks in `data`, one 2 h window at a time."""
    data.mkdir(parents=True, exist_ok=True)
    samples, generating, converting = 0, 0.0, 0.0
    first = timestamps[0]
    windows: dict[int, list[int]] = {}
    for t in timestamps:
        windows.setdefault(t // BLOCK_SECONDS, []).append(t)
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed (make tools)"
    for window in sorted(windows):
        text = scratch / f"window-{window}.om"
        began = time.perf_counter()
        samples += fh.write_file(text, fleet, pods, windows[window], first)
        generating += time.perf_counter() - began
        began = time.perf_counter()
        subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(text), str(data)],
                       check=True, capture_output=True, timeout=3600)
        converting += time.perf_counter() - began
        text.unlink()
    filled = existing(data, generating, converting)
    assert filled.samples == samples, "promtool stored other than what was written"
    return filled


def rules(tmp: Path, site: bool = True, group_interval: str | None = None) -> Path:
    """dashboards/rules as shipped, the site file with the seeds' G4 bandwidth (or as shipped, empty); with
    `group_interval`, the groups that set their own interval (kvscope.ttft: 1 m) evaluate at that one instead."""
    out = tmp / "rules"
    out.mkdir(exist_ok=True)
    for path in RULES.glob("*.yml"):
        data = yaml.safe_load(path.read_text())
        for group in data["groups"]:
            if site and group["name"] == "kvscope.site":
                group["rules"] = [SITE_RULE]
            if group_interval and "interval" in group:
                group["interval"] = group_interval
        (out / path.name).write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def recording_levels(rules_dir: Path) -> list[dict[str, Any]]:
    """The recording rules of `rules_dir` as rule-file documents, one per level, groups and intervals kept: a
    rule of level n reads raw series and rules of levels below n only. promtool backfills a rule from what the
    Prometheus it asks holds already, so a rule built on another one needs that one's blocks loaded first."""
    groups = [g for path in sorted(rules_dir.glob("*.yml")) for g in yaml.safe_load(path.read_text())["groups"]]
    recording = [(g, r) for g in groups for r in g["rules"] if "record" in r]
    names = {r["record"] for _, r in recording}
    reads = {id(r): {n for n in names if re.search(rf"(?<![\w:]){re.escape(n)}(?![\w:])", str(r["expr"]))}
             for _, r in recording}
    level: dict[str, int] = dict.fromkeys(names, 0)
    for _ in range(len(names)):  # longest chain of rules reading rules
        for _, rule in recording:
            level[rule["record"]] = max(level[rule["record"]], *(level[n] + 1 for n in reads[id(rule)]), 0)
    docs: list[dict[str, Any]] = [{"groups": []} for _ in range(max(level.values(), default=-1) + 1)]
    for group in groups:
        for n, doc in enumerate(docs):
            mine = [r for r in group["rules"] if "record" in r and level[r["record"]] == n]
            if mine:
                doc["groups"].append({k: v for k, v in group.items() if k != "rules"} | {"rules": mine})
    return docs


def backfill_rules(data: Path, tmp: Path, start: int, end: int) -> float:
    """The recording rules' results from `start` (or up to a group interval before it: backfill_start) to `end`
    (Unix seconds), written as blocks into `data` with
    `promtool tsdb create-blocks-from rules`, level by level (recording_levels), each level from a
    Prometheus serving `data` as the levels before left it (no rules of its own). So a panel that reads a
    recorded series over its whole range reads as much of it as it would in production, not the minutes since
    this Prometheus started. Returns the seconds it took."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed (make tools)"
    began = time.perf_counter()
    work = tmp / "rule-backfill"
    work.mkdir()
    # one path for every level: a group's evaluation instants are offset by a hash of its name and file, so
    # each level's rules then run at the instants the level below recorded, as one group's rules do
    rule_file = work / "rules.yml"
    levels = recording_levels(rules(tmp))
    longest = max(duration_seconds(g.get("interval", RULE_EVAL_INTERVAL)) for doc in levels for g in doc["groups"])
    start = backfill_start(start, longest)
    for doc in levels:
        rule_file.write_text(yaml.safe_dump(doc, sort_keys=False))
        with serving(data, work, with_rules=False) as (prometheus, _):
            subprocess.run([promtool, "tsdb", "create-blocks-from", "rules", f"--start={start}", f"--end={end}",
                            f"--url={prometheus.url}", f"--output-dir={work / 'blocks'}",
                            f"--eval-interval={RULE_EVAL_INTERVAL}", str(rule_file)],
                           check=True, capture_output=True, timeout=3600)
        for block in (work / "blocks").iterdir():
            shutil.move(block, data / block.name)
    shutil.rmtree(work)
    return time.perf_counter() - began


@contextmanager
def serving(data: Path, tmp: Path, evaluation_interval: str = "15s", extra_args: tuple[str, ...] = (),
            group_interval: str | None = None, with_rules: bool = True) -> Iterator[tuple[Prometheus, int]]:
    """Prometheus 2.x on `data` with the rules (`group_interval`: see rules(); none with `with_rules` false),
    nothing to scrape; yields it and its pid."""
    # the backfilled blocks run past now, which would make the head refuse every sample before their end
    # ("out of bounds"): the rules' results at now go through the out-of-order window instead
    config: dict[str, Any] = {"global": {"scrape_interval": "15s", "evaluation_interval": evaluation_interval},
                              "storage": {"tsdb": {"out_of_order_time_window": "3h"}}}
    if with_rules:
        config["rule_files"] = [str(rules(tmp, group_interval=group_interval) / "*.yml")]
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed (make tools)"
    args = [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={data}",
            "--storage.tsdb.retention.time=3650d", f"--web.listen-address=127.0.0.1:{port}",
            "--query.max-samples=200000000", *extra_args]
    with process(args, tmp / "prometheus.log", f"http://127.0.0.1:{port}/-/ready") as proc:
        yield Prometheus(f"http://127.0.0.1:{port}"), proc.pid


def rule_groups(prometheus: Prometheus) -> dict[str, dict[str, Any]]:
    """Every rule group by name: its interval, last evaluation (RFC 3339) and evaluation time (seconds)."""
    answer = get(f"{prometheus.url}/api/v1/rules")
    return {g["name"]: g for g in answer["data"]["groups"]}


def evaluations(prometheus: Prometheus, rounds: int, timeout: float) -> dict[str, list[float]]:
    """Each group's evaluation time over its next `rounds` evaluations (Prometheus' own figure, the one
    prometheus_rule_group_last_duration_seconds exports)."""
    seen: dict[str, dict[str, float]] = {}
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for name, group in rule_groups(prometheus).items():
            if group.get("lastEvaluation", "").startswith("0001"):
                continue
            seen.setdefault(name, {})[group["lastEvaluation"]] = float(group["evaluationTime"])
        if seen and all(len(v) > rounds for v in seen.values()):
            break
        time.sleep(1.0)
    # the first evaluation after start reads cold blocks and is left out
    return {name: [times[k] for k in sorted(times)][1:] for name, times in seen.items()}


@dataclass(frozen=True, slots=True)
class PanelQuery:
    dashboard: str
    panel: str
    expr: str  # as Prometheus receives it (macros and variables substituted)
    instant: bool
    step: int = DEFAULT_STEP  # seconds between points: the panel's min interval where it sets a longer one


def backfill_start(start: int, longest_interval: int) -> int:
    """`start`, or earlier where promtool 2.42 would record nothing. It evaluates a group at the group's own
    instants (offset by a hash of its name and file) block by block (blocks of BLOCK_SECONDS, aligned to
    multiples of it), and a group with no instant between
    --start and the next block boundary gets nothing at all, in no block, with no error: seen when the
    20-pod test's 15 minutes began 21 s before an even hour, for 1-minute groups whose instants fell in the
    first 39 s of a minute (8 of 12 rule-file paths), so once in a while in CI. Starting at least the longest
    group interval before that boundary gives every group an instant in the first block."""
    boundary = (start // BLOCK_SECONDS + 1) * BLOCK_SECONDS
    return min(start, boundary - longest_interval)


def duration_seconds(text: str) -> int:
    """A Prometheus/Grafana duration of one unit ("15s", "1m", "2h") in seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    return int(text[:-1]) * units[text[-1]]


def panel_queries() -> list[PanelQuery]:
    """Every panel query of the shipped dashboards as Grafana sends it at a 1 h range: at a 15 s step (the
    range over a panel's default width), or at the panel's min interval where that is longer."""
    out = []
    for path in DASHBOARDS:
        board = json.loads((ROOT / path).read_text())
        for panel in board["panels"]:
            step = max(DEFAULT_STEP, duration_seconds(panel["interval"])) if panel.get("interval") else DEFAULT_STEP
            for target in panel.get("targets", []):
                out.append(PanelQuery(board["title"], panel["title"], substitute(target["expr"], step=step),
                                      bool(target.get("instant")), step))
    return out


def ask(prometheus: Prometheus, query: PanelQuery, at: float, range_seconds: int = 3600) -> tuple[float, int]:
    """One panel query as Grafana sends it at the dashboards' default range (1 h); seconds taken and series."""
    if query.instant:
        url = f"{prometheus.url}/api/v1/query?" + urllib.parse.urlencode({"query": query.expr, "time": at})
    else:
        url = f"{prometheus.url}/api/v1/query_range?" + urllib.parse.urlencode(
            {"query": query.expr, "start": at - range_seconds, "end": at, "step": query.step})
    began = time.perf_counter()
    answer = get(url, timeout=120)
    took = time.perf_counter() - began
    assert answer["status"] == "success", (query, answer)
    return took, len(answer["data"]["result"])


def own_metric(prometheus: Prometheus, name: str) -> float:
    """A sample of Prometheus' own /metrics (it does not scrape itself here)."""
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(f"{prometheus.url}/metrics",
                                                                           timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"Prometheus exports no {name}")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def history_timestamps(end: int, hours: float, interval: int, fine_hours: float, coarse_interval: int) -> list[int]:
    """Sample instants of `hours` ending at `end`: every `interval` s over the last `fine_hours`, every
    `coarse_interval` s before (the part no dashboard query or rule reads)."""
    start, fine_start = end - int(hours * 3600), end - int(fine_hours * 3600)
    fine_start -= (fine_start - start) % interval
    return [*range(start, fine_start, coarse_interval), *range(fine_start, end + 1, interval)]
