"""Regenerate tests/fixtures/host/golden.prom from the host collectors over tests/fixtures/host/gpu-node.

Run from the repository root: `.venv/bin/python scripts/regen_golden.py`, then review `git diff`.
It runs exactly what tests/test_golden_host.py runs (one cycle, real HTTP GET, same masking).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests package is not installed

from tests.test_golden_host import GOLDEN, mask, scrape_fixture_agent


def main() -> int:
    text = mask(scrape_fixture_agent())
    old = GOLDEN.read_text() if GOLDEN.exists() else None
    GOLDEN.write_text(text)
    lines = text.count("\n")
    print(f"{GOLDEN}: {'unchanged' if old == text else 'written'} ({lines} lines)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
