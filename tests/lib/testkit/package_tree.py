"""The package as the wheel has it: pyproject.toml's package-dir mapping, and each file under its one name.

The layering and packaging tests, the editable-install check in conftest and scripts/typecheck.py all read
the tree through these two functions, so there is one answer to "which files are kvscope, by what name".
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from testkit.paths import ROOT


def package_dirs(root: Path = ROOT) -> dict[str, str]:
    """Import package -> folder of the tree (`kvscope.agent` -> `agent`), as pyproject.toml maps them."""
    project = tomllib.loads((root / "pyproject.toml").read_text())
    mapping: dict[str, str] = project["tool"]["setuptools"]["package-dir"]
    return mapping


def package_files(root: Path = ROOT) -> dict[str, Path]:
    """Every .py of the mapped folders, by the path it has in the wheel (`kvscope/agent/core/store.py`)."""
    out = {}
    for package, folder in package_dirs(root).items():
        for path in (root / folder).rglob("*.py"):
            if "__pycache__" not in path.parts:
                out["/".join([*package.split("."), *path.relative_to(root / folder).parts])] = path
    return out


def module_name(wheel_path: str) -> str:
    """`kvscope/agent/core/store.py` -> `kvscope.agent.core.store`; a package's `__init__.py` -> its name."""
    return wheel_path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
