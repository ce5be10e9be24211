"""Every golden exposition of the engine adapters (Dynamo, SGLang, LMCache fixtures) is valid Prometheus text,
by promtool's own check."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from testkit.engine_pages import FIXTURES
from testkit.environment import require_tool

GOLDENS = sorted(p for folder in ("dynamo", "sglang", "lmcache") for p in (FIXTURES / folder).glob("expected-*.txt"))


def test_there_are_goldens() -> None:
    assert len(GOLDENS) >= 5


@pytest.mark.parametrize("golden", GOLDENS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_golden_passes_promtool(golden: Path) -> None:
    promtool = require_tool("promtool")
    done = subprocess.run([promtool, "check", "metrics"], input=golden.read_bytes(), capture_output=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
