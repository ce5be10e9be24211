"""What `pip install .` puts into site-packages, what the sdist carries, and a tree with no links.

The wheel is built from this checkout exactly as pip builds it for a newcomer (`pip wheel .`, with the
build backend from the dev extra instead of a download), then read as a zip. The sdist is built by the
same backend's PEP 517 hook, unpacked, built into a wheel and installed into a new virtual environment
whose only kvscope is that wheel (its dependencies are this environment's, reached through a .pth file,
so the test needs no download); from there `kvscope --version`, one self-test scenario and a slice of
the test suite run out of the unpacked archive.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

from kvscope import __version__
from testkit.package_tree import package_files
from testkit.paths import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PROJECT["tool"]["setuptools"]


def build_wheel(source: Path, out: Path) -> Path:
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(out), str(source)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = out.glob("kvscope-*.whl")
    return path


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    return zipfile.ZipFile(build_wheel(ROOT, tmp_path_factory.mktemp("wheel")))


def test_the_only_top_level_import_name_is_kvscope(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    top = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top == {"kvscope"}
    info = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
    assert wheel.read(info).decode().split() == ["kvscope"]


def test_every_module_of_the_tree_is_in_the_wheel_at_its_one_name(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    expected = package_files()
    assert len(expected) > 150
    assert sorted(set(expected) - names) == []
    assert sorted(n for n in names if n.endswith(".py") and n not in expected) == []
    for package in ("agent", "collectors", "exporters", "dashboards"):
        assert f"kvscope/{package}/__init__.py" in names
    assert {"kvscope/py.typed", "kvscope/dashboards/grafana/kvscope-ttft.json",
            "kvscope/dashboards/rules/kvscope.alerts.yml"} <= names
    assert wheel.read("kvscope/agent/core/store.py") == (ROOT / "agent/core/store.py").read_bytes()


def test_the_package_list_names_every_folder_of_the_tree() -> None:
    """The list in pyproject.toml is explicit (nothing else is installed); a new folder with an
    __init__.py that is not in it would be left out of the wheel without a word."""
    found = {path.rsplit("/", 1)[0].replace("/", ".").removesuffix(".__init__.py")
             for path in package_files() if path.endswith("/__init__.py")}
    assert sorted(found ^ set(SETUPTOOLS["packages"])) == []


def test_the_console_command_points_into_the_namespace(wheel: zipfile.ZipFile) -> None:
    entry = next(n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt"))
    assert "kvscope = kvscope.agent.app.cli:main" in wheel.read(entry).decode()


def test_the_checkout_tracks_no_symlink() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (an unpacked sdist): nothing is tracked")
    listing = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    links = [line.split("\t", 1)[1] for line in listing.splitlines() if line.startswith("120000")]
    assert len(listing.splitlines()) > 400
    assert links == []


# --- the sdist --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def unpacked_sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sdist")
    hook = f"from setuptools import build_meta; print(build_meta.build_sdist({str(out)!r}))"
    proc = subprocess.run([sys.executable, "-c", hook], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    archive = out / proc.stdout.split()[-1]
    with tarfile.open(archive) as tar:
        tar.extractall(out, filter="data")
    (top,) = (p for p in out.iterdir() if p.is_dir())
    return top


def test_the_sdist_carries_what_a_packager_needs(unpacked_sdist: Path) -> None:
    for rel in ("pyproject.toml", "MANIFEST.in", "Makefile", "README.md", "docker-compose.yml", "Dockerfile",
                "package/__init__.py", "tests/conftest.py", "tests/lib/testkit/paths.py",
                "tests/fixtures/vllm", "dashboards/rules/tests/kvscope.alerts.test.yml", "bench/summary.py",
                "scripts/typecheck.py", "docs", "deploy"):
        assert (unpacked_sdist / rel).exists(), rel
    assert sorted(package_files(unpacked_sdist)) == sorted(package_files())
    tests_here = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("*") if p.is_file()
                        and "__pycache__" not in p.parts and ".pytest_cache" not in p.parts)
    tests_there = sorted(p.relative_to(unpacked_sdist).as_posix() for p in (unpacked_sdist / "tests").rglob("*")
                         if p.is_file())
    assert sorted(set(tests_here) - set(tests_there)) == []
    assert not [p for p in unpacked_sdist.rglob("*") if p.is_symlink()]


@pytest.fixture(scope="module")
def sdist_venv(unpacked_sdist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv whose one kvscope is the wheel built from the unpacked sdist."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; "
                                   "print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    # the dependencies: this environment's site directories, after the venv's own (which gets the wheel:
    # --ignore-installed, as the kvscope this environment has is visible through them)
    sites = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (purelib / "_kvscope_test_dependencies.pth").write_text("".join(f"{p}\n" for p in sites))
    built = build_wheel(unpacked_sdist, tmp_path_factory.mktemp("sdist-wheel"))
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                           "--no-deps", "--no-index", "--ignore-installed", str(built)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return venv


def _run(venv: Path, args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(venv / "bin" / args[0]), *args[1:]], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.integration
def test_the_sdist_installs_and_runs(sdist_venv: Path, unpacked_sdist: Path, tmp_path: Path) -> None:
    where = _run(sdist_venv, ["python", "-c", "import kvscope.agent.core.store as s; print(s.__file__)"],
                 tmp_path, 60)
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip().startswith(str(sdist_venv)), where.stdout
    version = _run(sdist_venv, ["kvscope", "--version"], tmp_path, 60)
    assert version.returncode == 0 and version.stdout.strip() == f"kvscope {__version__}", version
    report = tmp_path / "selftest.json"
    selftest = _run(sdist_venv, ["kvscope", "selftest", "--scenario", "shared-prompts", "--json", str(report)],
                    tmp_path, 300)
    assert selftest.returncode == 0, selftest.stdout[-3000:] + selftest.stderr[-3000:]
    assert report.stat().st_size > 0


@pytest.mark.integration
def test_tests_run_from_the_unpacked_sdist(sdist_venv: Path, unpacked_sdist: Path) -> None:
    """A slice of the suite (the layering, the core, a collector family) from the archive, against the
    installed wheel: the tests, their helpers and fixtures are all in the sdist."""
    proc = _run(sdist_venv, ["python", "-m", "pytest", "-p", "no:cacheprovider", "tests/test_layering.py",
                             "tests/agent/core", "tests/collectors/host"], unpacked_sdist, 300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout.splitlines()[-1] and "failed" not in proc.stdout.splitlines()[-1]
