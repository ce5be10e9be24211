"""`make dashboards`: writes the generated Grafana JSON and the PrometheusRule into the checkout."""

from __future__ import annotations

import sys
from pathlib import Path

from kvscope.dashboards.build import render

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    for relative, text in render().items():
        path = ROOT / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        old = path.read_text() if path.exists() else None
        if old != text:
            path.write_text(text)
            print(f"wrote {relative}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
