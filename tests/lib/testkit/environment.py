"""Tools and environments a test needs, and what happens when one is missing."""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest


def require_tool(name: str) -> str:
    """Path of an external tool; `make test` sets KVSCOPE_REQUIRE_TOOLS=1 so a missing one fails."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("KVSCOPE_REQUIRE_TOOLS") == "1":
            pytest.fail(f"{name} is required (make test installs it from Debian's packages)")
        pytest.skip(f"{name} not installed")
    return path


def missing_environment(reason: str) -> NoReturn:
    """A test that cannot run on this machine: skipped, except under KVSCOPE_REQUIRE_TOOLS=1 (make test sets
    it), where a skip would hide that the check never ran, so it fails."""
    if os.environ.get("KVSCOPE_REQUIRE_TOOLS") == "1":
        pytest.fail(f"{reason} (KVSCOPE_REQUIRE_TOOLS=1: a check that cannot run fails)")
    pytest.skip(reason)
