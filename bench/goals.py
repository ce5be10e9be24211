"""Verdicts of the benchmarks, gathered for `make bench`'s closing table (bench/summary.py).

A bench calls `verdict(...)` for each goal it judges: the line is printed where the figure is measured,
and, when `make bench` set KVSCOPE_BENCH_RESULTS, appended to that file as one JSON object, so the last
lines of `make bench` are one table of every goal, its figure, its reference, the ratio and MET or MISSED.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

RESULTS_ENV = "KVSCOPE_BENCH_RESULTS"


def verdict(goal: str, figure: str, reference: str, ratio: str, met: bool) -> bool:
    """Prints and records one goal's verdict; returns `met`."""
    bench = Path(sys.argv[0]).name
    print(f"GOAL {goal}: {figure} vs {reference} ({ratio}) -> {'MET' if met else 'MISSED'}", flush=True)
    path = os.environ.get(RESULTS_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"bench": bench, "goal": goal, "figure": figure, "reference": reference,
                                 "ratio": ratio, "met": met}) + "\n")
    return met


def spread(values: list[float], unit: str = "", digits: int = 3) -> str:
    """`median (min-max) unit` of several rounds."""
    return (f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"
            + (f" {unit}" if unit else ""))
