"""`make bench`'s first and last words: what it will run (and download) before it starts, and one table of
every goal's verdict at the end (from the results file the benches append to, bench/goals.py).

Run by the Makefile: `python bench/summary.py --before` first, `python bench/summary.py RESULTS` last. The
second exits 1 when a goal is MISSED or when no bench reported a verdict.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

AIPERF_VENV = Path("/tmp/aiperf-venv")


def before() -> int:
    benches = sorted(p.name for p in (ROOT / "bench").glob("bench_*.py"))
    print(f"make bench: {len(benches)} benchmarks ({', '.join(benches)}), each printing its figures beside its "
          "reference; one table of every goal at the end.")
    if not (AIPERF_VENV / "bin" / "aiperf").exists():
        print(f"NOTE: bench_aiperf.py will download AIPerf and its dependencies (about 1.2 GB) into {AIPERF_VENV} "
              "on its first run.")
    from machine import state
    print(state(), flush=True)
    return 0


def table(path: Path) -> int:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    if not rows:
        print("no bench reported a verdict")
        return 1
    cols = ("goal", "figure", "reference", "ratio", "verdict")
    cells = [(r["goal"], r["figure"], r["reference"], r["ratio"], "MET" if r["met"] else "MISSED") for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = "| " + " | ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)) + " |"
    print("\n" + line)
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    missed = sum(not r["met"] for r in rows)
    from machine import state
    print(f"\n{len(rows) - missed} of {len(rows)} goals MET, {missed} MISSED. {state()}")
    return 1 if missed else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--before"]:
        sys.exit(before())
    sys.exit(table(Path(sys.argv[1])))
