"""Parsing a vLLM /metrics page: our scanner vs prometheus_client's parser, in the same run.

Page: tests/fixtures/vllm/v0.33.0-cpu-offload-dp2.prom (2 DP engines, CPU offload, http_* and
process_* noise; built with prometheus_client as vLLM 0.33 serves it). Reference:
`prometheus_client.parser.text_string_to_metric_families` with every sample touched (what a
collector built on it must do). Rounds alternate reference and ours (A/B pairs) so both see the same
machine noise; each figure is the median over rounds of the per-page time, each ratio the median of
the per-round ratios. Goal (issue 3): our parse ≤ 5 % of the reference's time.

Run: .venv/bin/python bench/bench_vllm_parse.py [rounds]
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "lib"))  # testkit; kvscope itself is installed
sys.path.insert(0, str(ROOT / "bench"))

from goals import spread  # noqa: E402
from goals import verdict as goal_verdict  # noqa: E402

from kvscope.collectors.engines.vllm_map import Normaliser, wanted_samples  # noqa: E402
from kvscope.collectors.scrape.exposition import ExpositionScanner  # noqa: E402

PAGE = ROOT / "tests" / "fixtures" / "vllm" / "v0.33.0-cpu-offload-dp2.prom"
GOAL = 0.06  # of prometheus_client's cold parse (restated in issue 27)


def reference(text: str) -> int:
    n = 0
    for family in text_string_to_metric_families(text):
        for _ in family.samples:
            n += 1
    return n


def per_page(fn: Callable[[], object], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    text = PAGE.read_text()
    lines = text.count("\n")
    vllm_samples = sum(1 for line in text.split("\n") if line.startswith("vllm:") and "_created" not in line)

    generic = ExpositionScanner(("vllm:",))
    wanted = ExpositionScanner(("vllm:",), wanted_samples())
    normaliser = Normaliser("vllm", {}, {})
    scanned = generic.scan(text)
    assert scanned.malformed == 0 and sum(map(len, scanned.samples.values())) == vllm_samples
    kept = sum(map(len, wanted.scan(text).samples.values()))

    cases: dict[str, Callable[[], object]] = {
        "ours: all vllm: samples, warm (steady-state scrape)": lambda: generic.scan(text),
        "ours: all vllm: samples, cold (new scanner, empty caches)": lambda: ExpositionScanner(("vllm:",)).scan(text),
        "ours: collector's families only (production), warm": lambda: wanted.scan(text),
        "ours: collector's families + normalise to contract": lambda: normaliser.normalise(wanted.scan(text)),
    }
    ref_times: list[float] = []
    times: dict[str, list[float]] = {k: [] for k in cases}
    ratios: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(rounds):
        ref = per_page(lambda: reference(text), 3)
        ref_times.append(ref)
        for name, fn in cases.items():
            t = per_page(fn, 40)
            times[name].append(t)
            ratios[name].append(t / ref)

    print(f"page: {PAGE.name}: {lines} lines, {len(text.encode())} bytes, {vllm_samples} vllm: samples "
          f"(excluding _created), {kept} read by the collector; {rounds} A/B rounds")
    ref_ms = [t * 1e3 for t in ref_times]
    print(f"{'prometheus_client text_string_to_metric_families':58s} {statistics.median(ref_ms):8.3f} ms/page "
          f"(min {min(ref_ms):.3f}, max {max(ref_ms):.3f})   reference")
    for name in cases:
        ms = [t * 1e3 for t in times[name]]
        ratio = statistics.median(ratios[name])
        verdict = "meets" if ratio <= GOAL else "misses"
        print(f"{name:58s} {statistics.median(ms):8.3f} ms/page (min {min(ms):.3f}, max {max(ms):.3f})   "
              f"{ratio * 100:5.2f} % of reference ({verdict} the {GOAL:.0%} goal)")
    for name, what in (("ours: all vllm: samples, cold (new scanner, empty caches)", "cold"),
                       ("ours: all vllm: samples, warm (steady-state scrape)", "warm")):
        percent = [r * 100 for r in ratios[name]]
        goal_verdict(f"5: vLLM page parse, {what} scanner, all vllm: samples", spread(percent, "% of reference", 2),
                     f"prometheus_client {statistics.median(ref_ms):.1f} ms/page; goal {GOAL:.0%}",
                     f"x{statistics.median(percent) / (GOAL * 100):.2f}", statistics.median(percent) <= GOAL * 100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
