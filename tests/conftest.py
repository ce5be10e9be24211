"""Fixtures every test folder shares (helpers live in tests/lib/testkit)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from testkit.paths import FIXTURES, ROOT


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


def _one_identity_environment() -> None:
    """Nothing the suite starts can import a package folder by its bare name: the repository root (or the
    current directory, under `python -m pytest`) leaves this process's path, and children get
    PYTHONSAFEPATH, so `python -c` and `python -m` started from the root do not put it back. Children
    find the test helpers (`python -m testkit.kv_flood`) on PYTHONPATH, as pytest's `pythonpath` puts
    them here."""
    root = ROOT.resolve()
    sys.path[:] = [p for p in sys.path if p not in ("", ".") and Path(p or ".").resolve() != root]
    os.environ["PYTHONSAFEPATH"] = "1"
    lib = str(ROOT / "tests" / "lib")
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([lib, *[p for p in paths if p != lib]])


_one_identity_environment()
