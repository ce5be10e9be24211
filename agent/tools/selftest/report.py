"""The selftest's verdict as a table for people and as JSON for the issue notes and CI."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvscope.agent.tools.selftest.checks import Check

HEADER = ("scenario/run", "quantity", "truth", "measured", "error", "tolerance", "verdict")


def _num(x: float) -> str:
    if math.isnan(x):
        return "—"
    if math.isinf(x):
        return "inf"
    if x == int(x) and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:.6g}"


def table(rows: Sequence[tuple[str, Check]]) -> str:
    """rows: (scenario, check). Plain text, aligned, one line per check."""
    cells = [HEADER] + [(f"{scenario}/{c.run}", c.quantity, _num(c.truth), _num(c.measured), _num(c.error),
                         c.tolerance, "ok" if c.passed else "MISS") for scenario, c in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(HEADER))]
    right = {2, 3, 4}
    lines = []
    for n, r in enumerate(cells):
        lines.append("  ".join(v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths,
                                                                                                        strict=True)))
                     .rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def summary(rows: Sequence[tuple[str, Check]]) -> str:
    misses = [c for _, c in rows if not c.passed]
    if not misses:
        return f"selftest: all {len(rows)} checks passed\n"
    return f"selftest: {len(misses)} of {len(rows)} checks MISSED\n"


def as_json(rows: Sequence[tuple[str, Check]], meta: dict[str, Any]) -> dict[str, Any]:
    return {**meta, "passed": all(c.passed for _, c in rows),
            "checks": [{"scenario": s, **c.as_dict()} for s, c in rows]}


def write_json(path: Path, rows: Sequence[tuple[str, Check]], meta: dict[str, Any]) -> None:
    path.write_text(json.dumps(as_json(rows, meta), indent=1) + "\n", encoding="utf-8")
