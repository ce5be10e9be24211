"""collectors.host_inputs.block_device_of: which whole disk holds a directory (G3/G4 for the selftest and the
noise scenario), resolved through /sys/dev/block as the kernel lays it out."""

from __future__ import annotations

import os
from pathlib import Path

from kvscope.collectors.host.inputs import block_device_of


def test_block_device_of_resolves_a_partition_to_its_disk(tmp_path: Path) -> None:
    dev = os.stat(tmp_path).st_dev
    sys_root = tmp_path / "sys"
    part = sys_root / "devices" / "virtual" / "block" / "nvme0n1" / "nvme0n1p2"
    part.mkdir(parents=True)
    (part / "partition").write_text("2\n")
    (sys_root / "block").mkdir()
    for disk in ("nvme0n1", "nvme0n1p2"):  # /sys/block lists whole disks only; the second stands for one
        (sys_root / "block" / disk).mkdir()
    (sys_root / "dev" / "block").mkdir(parents=True)
    (sys_root / "dev" / "block" / f"{os.major(dev)}:{os.minor(dev)}").symlink_to(part)
    assert block_device_of(tmp_path, str(sys_root)) == "nvme0n1"
    part.joinpath("partition").unlink()  # a whole disk is its own name
    assert block_device_of(tmp_path, str(sys_root)) == "nvme0n1p2"


def test_block_device_of_without_a_block_device(tmp_path: Path) -> None:
    assert block_device_of(tmp_path, str(tmp_path / "empty-sys")) is None


def test_block_device_of_a_partition_is_its_disk(tmp_path: Path) -> None:
    dev = os.stat(tmp_path).st_dev
    sys_root = tmp_path / "sys"
    part = sys_root / "devices" / "virtual" / "block" / "vdz" / "vdz1"
    part.mkdir(parents=True)
    (part / "partition").write_text("1\n")
    (sys_root / "block").mkdir()
    (sys_root / "block" / "vdz").symlink_to(part.parent)
    (sys_root / "dev" / "block").mkdir(parents=True)
    (sys_root / "dev" / "block" / f"{os.major(dev)}:{os.minor(dev)}").symlink_to(part)
    assert block_device_of(tmp_path, str(sys_root)) == "vdz"
    assert block_device_of(tmp_path, str(tmp_path / "nosys")) is None
