"""Fixtures every test folder shares (helpers live in tests/lib/testkit)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from testkit.package_tree import package_files
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


def _editable_install_is_complete() -> None:
    """Installed in setuptools' strict editable mode (make), kvscope is a tree of links to the checkout's
    files, made at install time: a file added since is not importable until the install is redone. Say
    so, once, instead of an ImportError deep in some test."""
    import kvscope

    installed = Path(kvscope.__file__).parent
    if "__editable__" not in str(installed):
        return  # a wheel, or another install: nothing to compare
    missing = [path.relative_to(ROOT) for wheel_path, path in package_files().items()
               if not installed.parent.joinpath(wheel_path).exists()]
    if missing:
        pytest.exit(f"{len(missing)} file(s) of the checkout are not in the editable install yet "
                    f"({', '.join(map(str, missing[:3]))}...): run `make` (it reinstalls when files are added)",
                    returncode=4)


_editable_install_is_complete()
