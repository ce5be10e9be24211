"""1,000 kvscope pods sharing one G4 in a real Prometheus: rule evaluation time, panel query latency, TSDB cost.

What it does (`make bench`, or `python bench/bench_fleet.py --pods 1000`):

1. Captures the agent's real exposition as the chart deploys it (testkit/fleet_history.py): the seeds' pod
   (Dynamo KVBM + vLLM worker + frontend, G4 on the shared file system; the sidecar's default analyses,
   what-if on) and the node agent of an 8-GPU node, each read twice to get every counter's rate.
2. Writes `--hours` of history for `--pods` pods (8 per node, one node agent each), pod, node and instance
   varied, counters advancing at the captured rates times a per-pod factor, as OpenMetrics, and backfills it
   with `promtool tsdb create-blocks-from openmetrics`, one 2 h block at a time. The history ends
   `--ahead` minutes after the bench starts, so the rules and the panels read data at the instant they run:
   samples every `--interval` s over the last `--fine-hours`, every 5 min before (no rule or panel reads it).
3. Starts Debian's Prometheus on those blocks with the shipped recording and alert rules (the site rule with
   the seeds' G4 bandwidth), evaluated every 15 s as deploy/prometheus/prometheus.yml does (kvscope.ttft
   once a minute, as it says). Before that the recording rules' results over the last 70 min are backfilled
   with `promtool tsdb create-blocks-from rules` (a rule reading another rule's results after it), so the
   panels that read recorded series read a whole hour of them, as in production. It measures each rule
   group's evaluation time (Prometheus' own, from /api/v1/rules: what
   prometheus_rule_group_last_duration_seconds exports) against its interval; then every dashboard panel's
   query at the dashboards' default range (1 h, step 15 s, or the panel's min interval where it sets a
   longer one, as Grafana asks it), `--repeat` times each, for its p50 and p95; then the TSDB's resident
   memory per pod (over an empty Prometheus with the same rules) and bytes per sample on disk.

Goals (bench/goals.py verdicts): every rule group evaluates in under 10 % of its interval; every panel
query's p95 under 1 s.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "lib"))  # testkit; kvscope itself is installed
sys.path.insert(0, str(ROOT / "bench"))

from goals import verdict  # noqa: E402
from machine import state  # noqa: E402

from testkit import fleet_history as fh  # noqa: E402
from testkit import fleet_prometheus as fp  # noqa: E402

EVAL_SHARE_GOAL = 0.10
PANEL_P95_GOAL = 1.0
RULES_BACKFILL_SECONDS = 3600 + 600  # a panel's default range, and the rule measurements before the panels


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure_rules(prometheus: fp.Prometheus, rounds: int) -> bool:
    groups = fp.rule_groups(prometheus)
    longest = max(float(g["interval"]) for g in groups.values())  # kvscope.ttft: once a minute
    times = fp.evaluations(prometheus, rounds, timeout=(rounds + 2) * longest * 1.5 + 60)
    met = True
    print(f"rule groups, the median of their evaluations after the first (at least {rounds} each):")
    for name, values in sorted(times.items()):
        interval = float(groups[name]["interval"])
        median, worst = statistics.median(values), max(values)
        print(f"  {name:<22} median {median * 1000:8.1f} ms, max {worst * 1000:8.1f} ms of {len(values)}, "
              f"{len(groups[name]['rules'])} rules, every {interval:g} s")
        met &= verdict(f"fleet rule group {name} evaluation < 10 % of its interval",
                       f"{median * 1000:.0f} ms (max {worst * 1000:.0f})",
                       f"{EVAL_SHARE_GOAL * interval * 1000:.0f} ms",
                       f"{median / interval:.1%} of {interval:g} s", median < EVAL_SHARE_GOAL * interval)
    return met


def measure_panels(prometheus: fp.Prometheus, repeat: int) -> bool:
    queries = fp.panel_queries()
    took: dict[int, list[float]] = {i: [] for i in range(len(queries))}
    rows: dict[int, int] = {}
    at = time.time()
    for _ in range(repeat):  # round-robin, so no query gets a warmer cache than another
        for i, query in enumerate(queries):
            seconds, rows[i] = fp.ask(prometheus, query, at)
            took[i].append(seconds)
    slowest = sorted(range(len(queries)), key=lambda i: percentile(took[i], 0.95), reverse=True)
    print(f"{len(queries)} panel queries, {repeat} times each at the default range (1 h, step 15 s or the panel's "
          "min interval); slowest first:")
    for i in slowest:
        q = queries[i]
        print(f"  p50 {statistics.median(took[i]) * 1000:7.1f} ms  p95 {percentile(took[i], 0.95) * 1000:7.1f} ms "
              f"{rows[i]:5d} series  step {q.step:2d} s  {q.dashboard} / {q.panel}: {q.expr[:100]}")
    met = True
    for board in sorted({q.dashboard for q in queries}):
        mine = [i for i in range(len(queries)) if queries[i].dashboard == board]
        worst = max(mine, key=lambda i: percentile(took[i], 0.95))
        p95 = percentile(took[worst], 0.95)
        met &= verdict(f"fleet panel queries p95 < 1 s: {board}",
                       f"slowest p95 {p95 * 1000:.0f} ms ({queries[worst].panel})", f"{PANEL_P95_GOAL * 1000:.0f} ms",
                       f"{p95 / PANEL_P95_GOAL:.2f}x", p95 < PANEL_P95_GOAL)
    return met


def empty_rss(tmp: Path) -> int:
    """An empty Prometheus with the same rules: the memory every Prometheus has before it holds a pod."""
    (tmp / "empty").mkdir()
    with fp.serving(tmp / "empty" / "data", tmp / "empty") as (prometheus, pid):
        fp.evaluations(prometheus, 2, timeout=90)
        return fp.rss_bytes(pid)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--hours", type=float, default=6.0)
    parser.add_argument("--interval", type=int, default=30, help="seconds between samples, recent history")
    parser.add_argument("--fine-hours", type=float, default=1.75)
    parser.add_argument("--ahead", type=float, default=45.0, help="minutes the history runs past the start")
    parser.add_argument("--rounds", type=int, default=5, help="rule evaluations measured per group")
    parser.add_argument("--repeat", type=int, default=10, help="times each panel query is asked")
    parser.add_argument("--scratch", default="", help="folder for the blocks (default: a temporary one)")
    parser.add_argument("--blocks", default="", help="measure on the blocks of an earlier run (copied) instead of "
                        "making new ones; they must still run 8 min past now")
    parser.add_argument("--save-blocks", default="", help="copy the blocks made to this folder, for --blocks")
    args = parser.parse_args()
    print(f"bench_fleet: {args.pods} pods, {args.hours:g} h of history, {state()}", flush=True)

    began = time.perf_counter()
    fleet = fh.capture()
    print(f"captured: {len(fleet.pod)} series per pod (sidecar), {len(fleet.node)} per node agent; "
          f"{fleet.series_per_pod():.0f} per pod with its share of the node agent "
          f"({time.perf_counter() - began:.0f} s)", flush=True)
    end = int(time.time() + args.ahead * 60)
    timestamps = fp.history_timestamps(end, args.hours + args.ahead / 60, args.interval, args.fine_hours, 300)
    with tempfile.TemporaryDirectory(dir=args.scratch or None, prefix="kvscope-fleet-") as scratch:
        tmp = Path(scratch)
        if args.blocks:
            shutil.copytree(args.blocks, tmp / "data")
            filled = fp.existing(tmp / "data")
            end = filled.max_time
        else:
            filled = fp.backfill(fleet, args.pods, timestamps, tmp / "data", tmp)
            if args.save_blocks:
                shutil.copytree(tmp / "data", args.save_blocks)
        print(f"backfilled {filled.samples:,} samples in {filled.blocks} blocks, "
              f"{filled.bytes_on_disk / 2**20:.0f} MiB "
              f"(generated in {filled.generate_seconds:.0f} s, promtool {filled.promtool_seconds:.0f} s)", flush=True)
        baseline = empty_rss(tmp)
        now = int(time.time())
        took = fp.backfill_rules(tmp / "data", tmp, now - RULES_BACKFILL_SECONDS, now)
        print(f"recording rules' results backfilled over the last {RULES_BACKFILL_SECONDS // 60} min with promtool "
              f"({took:.0f} s), so panels reading a recorded series read a whole hour of it", flush=True)
        with fp.serving(tmp / "data", tmp) as (prometheus, pid):
            if time.time() > end - 8 * 60:
                print(f"the history ends in {(end - time.time()) / 60:.0f} min, too soon to measure: raise --ahead")
                return 1
            rules_met = measure_rules(prometheus, args.rounds)
            panels_met = measure_panels(prometheus, args.repeat)
            rss = fp.rss_bytes(pid)
            head_series = fp.own_metric(prometheus, "prometheus_tsdb_head_series")
        per_pod = (rss - baseline) / args.pods
        print(f"TSDB: Prometheus resident {rss / 2**20:.0f} MiB after the queries, {baseline / 2**20:.0f} MiB empty "
              f"with the same rules: {per_pod / 2**10:.0f} KiB per pod ({fleet.series_per_pod():.0f} series); "
              f"on disk {filled.bytes_on_disk / filled.samples:.2f} bytes per sample, "
              f"{filled.bytes_on_disk / args.pods / 2**20:.2f} MiB per pod for {args.hours:g} h; "
              f"head series (rule results) {head_series:.0f}")
    print(f"bench_fleet: {time.perf_counter() - began:.0f} s in all")
    return 0 if rules_met and panels_met else 1


if __name__ == "__main__":
    sys.exit(main())
