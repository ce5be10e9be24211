"""`kvscope selftest` on a machine whose temporary directory is not on a block device (tmpfs, overlay):
the noisy-neighbour scenario cannot run there, and the command says so in one line before running
anything, instead of running the other scenarios and ending in a traceback (issue 11 #13)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvscope.collectors.host.inputs import block_device_of
from testkit.environment import missing_environment
from testkit.paths import ROOT


@pytest.fixture
def tmpfs_dir() -> Iterator[Path]:
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK) and block_device_of(shm) is None):
        missing_environment("no writable tmpfs at /dev/shm to stand for a temp dir that is not on a block device")
    with tempfile.TemporaryDirectory(dir=shm, prefix="kvscope-test-") as directory:
        yield Path(directory)


@pytest.mark.parametrize("where", ["TMPDIR", "--workdir"])
def test_selftest_all_refuses_in_one_line_when_g4_cannot_be_on_a_block_device(tmpfs_dir: Path, where: str) -> None:
    args, env = ["selftest", "--scenario", "all"], dict(os.environ)
    if where == "TMPDIR":
        env["TMPDIR"] = str(tmpfs_dir)
    else:
        args += ["--workdir", str(tmpfs_dir / "work")]
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "kvscope.agent.app.cli", *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"kvscope: selftest: noisy-neighbour needs its G4 directory on a local block device, "
                           f"and {tmpfs_dir}")
    assert "--workdir" in line
    assert time.monotonic() - start < 30  # said before the other scenarios ran (they take ~35 s)
