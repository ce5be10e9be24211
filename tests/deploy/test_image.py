"""The image builds reproducibly: an exact base release (or digest) in every stage, every dependency pinned
by deploy/docker/constraints.txt within pyproject.toml's ranges, and the constraints reach the build."""

from __future__ import annotations

import re
import tomllib

from packaging.requirements import Requirement

from testkit.paths import ROOT

DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _pins() -> dict[str, str]:
    lines = (ROOT / "deploy/docker/constraints.txt").read_text().splitlines()
    pins = dict(line.split("==") for line in lines if line and not line.startswith("#"))
    return {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in pins.items()}


def test_every_stage_starts_from_an_exact_release() -> None:
    bases = re.findall(r"^FROM (\S+)", DOCKERFILE, re.M)
    assert len(bases) == 2 and len(set(bases)) == 1
    assert all(re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", b) for b in bases), bases


def test_every_runtime_dependency_is_pinned_within_its_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    image_set = project["dependencies"] + extras["web"] + extras["node"] + extras["reference"]
    requirements = [Requirement(r) for r in image_set]
    pins = _pins()
    for requirement in requirements:
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        assert name in pins, f"{name} is not pinned in deploy/docker/constraints.txt"
        assert requirement.specifier.contains(pins[name]), (name, pins[name], str(requirement.specifier))


def test_the_build_installs_under_the_constraints() -> None:
    assert "COPY deploy/docker/constraints.txt /constraints.txt" in DOCKERFILE
    assert "PIP_CONSTRAINT=/constraints.txt pip install" in DOCKERFILE
    assert "!deploy/docker/constraints.txt" in (ROOT / ".dockerignore").read_text().split()
    assert re.search(r"^ARG SOURCE_DATE_EPOCH=0$", DOCKERFILE, re.M)
