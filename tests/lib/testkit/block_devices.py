"""A block device of the test's own, for tests that load a disk and read its counters."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class LoopUnavailable(Exception):
    """This machine cannot make a loop device (not root, tools missing, loop devices not allowed here)."""


def can_make_loop_devices() -> bool:
    return (os.geteuid() == 0 and Path("/dev/loop-control").exists()
            and all(shutil.which(tool) for tool in ("losetup", "mkfs.ext4", "mount", "umount")))


@contextmanager
def loop_filesystem(directory: Path, size: int = 2 << 30) -> Iterator[tuple[Path, str]]:
    """(mount point, device name) of a fresh ext4 on a loop device backed by a sparse file in `directory`,
    with direct I/O to the backing file where its file system allows it. Needs root. No other process
    uses the device, so its counters are the test's alone."""
    if not can_make_loop_devices():
        raise LoopUnavailable("making a loop device needs root, /dev/loop-control, losetup, mkfs.ext4 and mount")
    image, mount_point = directory / "disk.img", directory / "mnt"
    with open(image, "wb") as fh:
        fh.truncate(size)
    try:
        try:
            device = _losetup(image, "--direct-io=on")
        except subprocess.CalledProcessError:
            device = _losetup(image)  # a backing file system without O_DIRECT (tmpfs): buffered
    except subprocess.CalledProcessError as exc:
        image.unlink(missing_ok=True)
        raise LoopUnavailable(f"losetup failed: {exc.stderr.strip()}") from None
    try:
        try:
            subprocess.run(["mkfs.ext4", "-q", "-F", device], check=True, capture_output=True, text=True)
            mount_point.mkdir()
            subprocess.run(["mount", "-o", "noatime", device, str(mount_point)], check=True, capture_output=True,
                           text=True)
        except subprocess.CalledProcessError as exc:
            raise LoopUnavailable(f"{exc.cmd[0]} failed: {exc.stderr.strip()}") from None
        try:
            yield mount_point, Path(device).name
        finally:
            subprocess.run(["umount", str(mount_point)], capture_output=True)
    finally:
        subprocess.run(["losetup", "-d", device], capture_output=True)
        image.unlink(missing_ok=True)


def _losetup(image: Path, *options: str) -> str:
    out = subprocess.run(["losetup", "--find", "--show", *options, str(image)], check=True, capture_output=True,
                         text=True)
    return out.stdout.strip()
