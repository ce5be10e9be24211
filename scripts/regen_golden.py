"""Regenerate tests/fixtures/host/golden.prom from the host collectors over tests/fixtures/host/gpu-node.

Run from the repository root: `.venv/bin/python scripts/regen_golden.py`, then review `git diff`.
It runs exactly what tests/collectors/host/test_golden.py runs (one cycle, real HTTP GET, same masking).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "lib"))  # testkit, as pytest's pythonpath puts it
_spec = importlib.util.spec_from_file_location("host_golden", ROOT / "tests/collectors/host/test_golden.py")
assert _spec is not None and _spec.loader is not None
_golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_golden)
GOLDEN, mask, scrape_fixture_agent = _golden.GOLDEN, _golden.mask, _golden.scrape_fixture_agent


def main() -> int:
    text = mask(scrape_fixture_agent())
    old = GOLDEN.read_text() if GOLDEN.exists() else None
    GOLDEN.write_text(text)
    lines = text.count("\n")
    print(f"{GOLDEN}: {'unchanged' if old == text else 'written'} ({lines} lines)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
