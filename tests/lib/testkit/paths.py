"""Where the tests find the checkout and its fixtures, whichever folder a test file sits in."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures"
