"""What `pip install .` puts into site-packages: one import name, `kvscope`, and nothing else.

The wheel is built from this checkout exactly as pip builds it for a newcomer (`pip wheel .`, with the
build backend from the dev extra instead of a download), then read as a zip.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(out), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = out.glob("kvscope-*.whl")
    return zipfile.ZipFile(path)


def test_the_only_top_level_import_name_is_kvscope(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    top = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top == {"kvscope"}
    info = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
    assert wheel.read(info).decode().split() == ["kvscope"]


def test_the_four_folders_are_its_subpackages(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for package in ("agent", "collectors", "exporters", "dashboards"):
        assert f"kvscope/{package}/__init__.py" in names
    # every module of the checkout is in the wheel under kvscope/, and no test, bench or script is
    for folder in ("agent", "collectors", "exporters", "dashboards"):
        for path in (ROOT / folder).rglob("*.py"):
            assert f"kvscope/{path.relative_to(ROOT).as_posix()}" in names
    assert not [n for n in names if n.startswith(("kvscope/tests/", "kvscope/bench/", "kvscope/scripts/"))]


def test_the_console_command_points_into_the_namespace(wheel: zipfile.ZipFile) -> None:
    entry = next(n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt"))
    assert "kvscope = kvscope.agent.cli:main" in wheel.read(entry).decode()
