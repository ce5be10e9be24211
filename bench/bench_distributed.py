"""kvscope's fleet rules and dashboards on a distributed TSDB fed by remote write, against a single Prometheus on
the same data.

The path (`make bench`, which installs Debian's `victoria-metrics` package when vmalert is missing):

    kvscope pods ──scrape── Prometheus in agent mode ──remote write──┬─► VictoriaMetrics (single-node)
                                                                     │      ▲ vmalert evaluates the shipped
                                                                     │      │ rule files, writes results back
                                                                     └─► Prometheus (remote-write receiver,
                                                                            the same rules): the reference

Three kvscope pods run as the chart deploys them (testkit/cardinality.py: the seeds' KVBM pod, what-if on,
advancing engine pages, KV events, spans), scraped every second by one Prometheus in agent mode (external
label cluster=fleet-a) that remote-writes every sample to both stores, so both hold the same data. After
6 minutes (every rule's 5-minute window full) it asks both, at the same instant, every fleet recording rule's
expression and every dashboard panel query, and compares the answers series by series; and compares the
fleet rules' own results, as vmalert and Prometheus recorded them. VictoriaMetrics' rate() does not
extrapolate to the window's edges as Prometheus' does, so values agree within a tolerance, not to the bit:
the goal is that every series is there in both, with the same labels, within 2 %.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "lib"))  # testkit; kvscope itself is installed
sys.path.insert(0, str(ROOT / "bench"))

from goals import verdict  # noqa: E402

from testkit import cardinality as card  # noqa: E402
from testkit import fleet_history as fh  # noqa: E402
from testkit import fleet_prometheus as fp  # noqa: E402
from testkit.http import free_port  # noqa: E402
from testkit.prometheus import get, process  # noqa: E402

PODS = 3
TOLERANCE = 0.02
RUN_SECONDS = 360
FLEET_GROUP = "kvscope.fleet"


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SystemExit(f"{name} is not installed (make bench installs Debian's victoria-metrics)")
    return path


def agent_config(tmp: Path, targets: list[str], writes: list[str]) -> Path:
    config = {"global": {"scrape_interval": "1s", "external_labels": {"cluster": fh.CLUSTER}},
              "scrape_configs": [{"job_name": "kvscope", "static_configs": [
                  {"targets": [t], "labels": {"namespace": "inference", "pod": f"vllm-{i}", "node": f"node-{i}"}}
                  for i, t in enumerate(targets)]}],
              "remote_write": [{"url": url, "queue_config": {"batch_send_deadline": "1s"}} for url in writes]}
    path = tmp / "agent.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def samples(result: list[dict[str, Any]]) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in result}


def instant(url: str, expr: str, at: float) -> dict[tuple[tuple[str, str], ...], float]:
    answer = get(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": at}), timeout=30)
    assert answer["status"] == "success", (url, expr, answer)
    return samples(answer["data"]["result"])


def differences(reference: dict[Any, float], other: dict[Any, float]) -> tuple[list[str], float]:
    """Problems (series missing on a side, values apart by more than the tolerance) and the largest relative
    difference seen."""
    problems, largest = [], 0.0
    for labels in sorted(set(reference) | set(other), key=str):
        if labels not in other or labels not in reference:
            problems.append(f"{dict(labels)} only in {'Prometheus' if labels in reference else 'VictoriaMetrics'}")
            continue
        a, b = reference[labels], other[labels]
        apart = 0.0 if a == b else abs(a - b) / max(abs(a), abs(b))
        largest = max(largest, apart)
        if apart > TOLERANCE:
            problems.append(f"{dict(labels)}: Prometheus {a:.6g}, VictoriaMetrics {b:.6g}")
    return problems, largest


def fleet_expressions() -> list[tuple[str, str]]:
    groups = yaml.safe_load((fp.RULES / "kvscope.rules.yml").read_text())["groups"]
    return [(r["record"], r["expr"]) for g in groups if g["name"] == FLEET_GROUP for r in g["rules"]]


def alertmanager(stack: contextlib.ExitStack, tmp: Path) -> str:
    """A real Alertmanager for vmalert's alerts (vmalert needs one; nothing is routed anywhere)."""
    (tmp / "am.yml").write_text("route: {receiver: none}\nreceivers: [{name: none}]\n")
    port = free_port()
    stack.enter_context(process(
        [binary("prometheus-alertmanager"), f"--config.file={tmp / 'am.yml'}", f"--storage.path={tmp / 'am'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
        tmp / "alertmanager.log", f"http://127.0.0.1:{port}/-/ready"))
    return f"http://127.0.0.1:{port}"


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="kvscope-distributed-") as scratch, contextlib.ExitStack() as stack:
        tmp = Path(scratch)
        urls = [stack.enter_context(card.running(fh.pod_config()))[1] for _ in range(PODS)]
        targets = [urllib.parse.urlsplit(u).netloc for u in urls]

        vm_port = free_port()
        vm = f"http://127.0.0.1:{vm_port}"
        stack.enter_context(process(
            [binary("victoria-metrics"), f"-storageDataPath={tmp / 'vm'}", f"-httpListenAddr=127.0.0.1:{vm_port}",
             "-retentionPeriod=1d", "-search.latencyOffset=1s"], tmp / "vm.log", f"{vm}/health"))
        # every group every 5 s on both sides (kvscope.ttft's 1 minute too): results recorded a minute apart
        # would differ by what the rates did in between
        single, _ = stack.enter_context(fp.serving(tmp / "prometheus", tmp, evaluation_interval="5s",
                                                   extra_args=("--web.enable-remote-write-receiver",),
                                                   group_interval="5s"))
        vmalert_port = free_port()
        stack.enter_context(process(
            [binary("vmalert"), *(f"-rule={p}" for p in sorted((tmp / "rules").glob("*.yml"))),
             f"-datasource.url={vm}", f"-remoteWrite.url={vm}", f"-notifier.url={alertmanager(stack, tmp)}",
             "-evaluationInterval=5s", f"-httpListenAddr=127.0.0.1:{vmalert_port}"],
            tmp / "vmalert.log", f"http://127.0.0.1:{vmalert_port}/health"))
        agent_port = free_port()
        stack.enter_context(process(
            [binary("prometheus"), "--enable-feature=agent",
             f"--config.file={agent_config(tmp, targets, [f'{vm}/api/v1/write', f'{single.url}/api/v1/write'])}",
             f"--storage.agent.path={tmp / 'agent'}", f"--web.listen-address=127.0.0.1:{agent_port}"],
            tmp / "agent.log", f"http://127.0.0.1:{agent_port}/-/ready"))
        print(f"bench_distributed: {PODS} kvscope pods -> Prometheus agent -> VictoriaMetrics (+ vmalert) and a "
              f"Prometheus receiver; comparing after {RUN_SECONDS} s", flush=True)
        time.sleep(RUN_SECONDS)
        at = time.time() - 10  # both stores have everything up to here (remote write flushes every second)

        met = True
        largest = 0.0
        checked, empty = 0, set()
        for name, expr in fleet_expressions():
            reference = instant(single.url, expr, at)
            problems, apart = differences(reference, instant(vm, expr, at))
            largest, checked = max(largest, apart), checked + len(reference)
            if not reference:
                empty.add(name)
            print(f"  {name}: {len(reference)} series, largest difference {apart:.3%}"
                  + "".join(f"\n    {p}" for p in problems[:5]))
            # the shared tier's figures are what this path is for: they must be there
            met &= not problems and (bool(reference) or not name.startswith("tier:"))
        if empty:
            print(f"  no data on either side (these pods' pages give the correlation no attribution): "
                  f"{', '.join(sorted(empty))}")
        for query in fp.panel_queries():
            problems, apart = differences(instant(single.url, query.expr, at), instant(vm, query.expr, at))
            largest = max(largest, apart)
            if problems:
                print(f"  panel {query.dashboard} / {query.panel}: {query.expr[:100]}"
                      + "".join(f"\n    {p}" for p in problems[:5]))
                met = False
        fleet_results = '{__name__=~"tier:.*|model:.*"}'
        recorded_problems, recorded = differences(instant(single.url, fleet_results, at),
                                                  instant(vm, fleet_results, at))
        print(f"  fleet rules' results as recorded (Prometheus rules vs vmalert, each at its own instants): "
              f"largest difference {recorded:.3%}" + "".join(f"\n    {p}" for p in recorded_problems[:5]))
        return 0 if verdict("fleet figures on VictoriaMetrics (remote write, vmalert) equal one Prometheus'",
                            f"{checked} fleet series ({len(empty)} rules empty on both) + {len(fp.panel_queries())} "
                            "panel queries, largest difference "
                            f"{largest:.2%}", f"same series, within {TOLERANCE:.0%}", f"{largest / TOLERANCE:.2f}x",
                            met and not recorded_problems) else 1


if __name__ == "__main__":
    sys.exit(main())
