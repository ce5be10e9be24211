"""Absurd numbers in host inputs: each host collector runs on a real fixture tree (or mmpmon stand-in)
with one counter replaced by a value no kernel or client tool prints: 400 digits (float() overflowed),
5,000 digits (past Python's int() limit of 4,300) or a negative number (which parsers took). The line is
skipped and counted; the collection goes on and reports everything else."""

from __future__ import annotations

import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from kvscope.agent.core.readings import Reading, Sample
from kvscope.collectors.host.disk import DiskCollector, DiskOptions
from kvscope.collectors.host.inputs import INPUT_ERRORS_METRIC, parse_u64
from kvscope.collectors.host.network import NetworkCollector, NetworkOptions
from kvscope.collectors.host.rdma import RdmaCollector, RdmaOptions
from kvscope.collectors.sharedfs.gpfs import GpfsCollector, GpfsOptions
from kvscope.collectors.sharedfs.lustre import LustreCollector, LustreOptions
from kvscope.collectors.sharedfs.nfs import NfsCollector, NfsOptions
from testkit.paths import FIXTURES

ABSURD = {"400 digits": "9" * 400, "5000 digits": "7" * 5000, "negative": "-5", "sign": "+5",
          "not ascii": "\u0663\u0663", "underscore": "1_000", "2**64": str(2**64)}


def test_parse_u64_takes_counters_only() -> None:
    assert [parse_u64(t) for t in ("0", "18446744073709551615", "007")] == [0, 2**64 - 1, 7]
    assert all(parse_u64(token) is None for token in (*ABSURD.values(), "", " 1", "1.0", "0x10"))


def _tree(tmp_path: Path, source: Path) -> Path:
    root = tmp_path / "root"
    shutil.copytree(source, root)
    return root


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def _by(out: list[Reading], metric: str) -> dict[tuple[str, ...], float]:
    return {r.labels: r.value for r in out if isinstance(r, Sample) and r.name == metric}


def _errors(out: list[Reading]) -> float:
    (value,) = _by(out, INPUT_ERRORS_METRIC).values()
    return value


def disk(tmp_path: Path, token: str | None) -> tuple[Callable[[], list[Reading]], str, tuple[str, ...]]:
    root = _tree(tmp_path, FIXTURES / "host" / "gpu-node")
    if token is not None:  # nvme0n1's sectors read
        _edit(root / "proc" / "diskstats", "nvme0n1 182734 40213 21873592", f"nvme0n1 182734 40213 {token}")
    c = DiskCollector(DiskOptions(), str(root / "proc"), str(root / "sys"), lambda: 1000.0)
    return c.collect, "kvscope_disk_read_bytes_total", ("nvme0n1",)


def network(tmp_path: Path, token: str | None) -> tuple[Callable[[], list[Reading]], str, tuple[str, ...]]:
    root = _tree(tmp_path, FIXTURES / "host" / "gpu-node")
    if token is not None:
        _edit(root / "proc" / "net" / "dev", "eth0: 48213377012", f"eth0: {token}")
    c = NetworkCollector(NetworkOptions(), str(root / "proc"))
    return c.collect, "kvscope_network_receive_bytes_total", ("eth0",)


def rdma(tmp_path: Path, token: str | None) -> tuple[Callable[[], list[Reading]], str, tuple[str, ...]]:
    root = _tree(tmp_path, FIXTURES / "host" / "gpu-node")
    if token is not None:
        (root / "sys/class/infiniband/mlx5_0/ports/1/counters/port_rcv_data").write_text(token + "\n")
    c = RdmaCollector(RdmaOptions(), str(root / "sys"))
    return c.collect, "kvscope_rdma_receive_bytes_total", ("mlx5_0", "1")


def nfs(tmp_path: Path, token: str | None) -> tuple[Callable[[], list[Reading]], str, tuple[str, ...]]:
    root = _tree(tmp_path, FIXTURES / "sharedfs" / "node")
    if token is not None:
        _edit(root / "proc/self/mountstats", "bytes:\t5368709120 ", f"bytes:\t{token} ")
    c = NfsCollector(NfsOptions(), str(root / "proc"))
    return c.collect, "kvscope_fs_read_bytes_total", ("/mnt/data", "nfs")


def lustre(tmp_path: Path, token: str | None) -> tuple[Callable[[], list[Reading]], str, tuple[str, ...]]:
    root = _tree(tmp_path, FIXTURES / "sharedfs" / "node")
    if token is not None:
        stats = next((root / "proc/fs/lustre/llite").glob("*/stats"))
        _edit(stats, "4096 4194304 85899345920", f"4096 4194304 {token}")
    c = LustreCollector(LustreOptions(), str(root / "proc"), str(root / "sys"))
    return c.collect, "kvscope_fs_read_bytes_total", ("/lustre", "lustre")


def gpfs(tmp_path: Path, token: str | None) -> tuple[Callable[[], list[Reading]], str, tuple[str, ...]]:
    tmp_path.mkdir()
    answer = tmp_path / "fs_io_s.txt"
    shutil.copy(FIXTURES / "sharedfs/gpfs/fs_io_s.txt", answer)
    if token is not None:
        _edit(answer, "_br_ 6291456", f"_br_ {token}")
    mmpmon = tmp_path / "mmpmon"
    mmpmon.write_text(f'#!/bin/sh\ncat "{answer}"\n')
    mmpmon.chmod(mmpmon.stat().st_mode | stat.S_IXUSR)
    c = GpfsCollector(GpfsOptions(mmpmon=str(mmpmon), mount_label="name"), str(tmp_path))
    return c.collect, "kvscope_fs_read_bytes_total", ("fs1", "gpfs")


COLLECTORS = {"disk": disk, "network": network, "rdma": rdma, "nfs": nfs, "lustre": lustre, "gpfs": gpfs}


@pytest.mark.parametrize("absurd", ABSURD)
@pytest.mark.parametrize("name", COLLECTORS)
def test_an_absurd_number_skips_its_line_and_the_rest_is_reported(tmp_path: Path, name: str, absurd: str) -> None:
    setup = COLLECTORS[name]
    collect, metric, labels = setup(tmp_path / "clean", None)
    clean = collect()
    assert labels in _by(clean, metric), f"{name}: the fixture does not report {labels}"
    collect, _, _ = setup(tmp_path / "absurd", ABSURD[absurd])
    out = collect()  # raised OverflowError or ValueError before
    assert labels not in _by(out, metric)
    assert _errors(out) == _errors(clean) + 1
    # everything else is still there, with the same values
    assert {k: v for k, v in _by(clean, metric).items() if k != labels} == _by(out, metric)
