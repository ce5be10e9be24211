"""Disk collector: diskstats parsing, what counts (sysfs), NVMe multipath, resets and io_ticks wraps."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from kvscope.agent.config.settings import ConfigError, load_config
from kvscope.agent.core.catalogue import AGENT_METRICS, Catalogue
from kvscope.agent.core.pipeline import Components
from kvscope.agent.core.readings import Sample
from kvscope.agent.core.store import Store
from kvscope.collectors.host import disk
from kvscope.collectors.host.disk import (
    IO_TIME_MODULUS_S,
    TICKS_MODULUS_MS,
    DiskCollector,
    DiskCounters,
    DiskOptions,
    MemberSum,
    parse_diskstats,
    select_disks,
    ticks_wrapped,
)
from testkit.paths import FIXTURES

HOST = FIXTURES / "host"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def tree(tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    shutil.copytree(HOST / name, root)
    return root


def collector(root: Path, clock: Clock | None = None, **options: list[str]) -> DiskCollector:
    return DiskCollector(DiskOptions(**options), str(root / "proc"), str(root / "sys"), clock or Clock())


def by_device(readings: list[Sample], metric: str) -> dict[str, float]:
    return {r.labels[0]: r.value for r in readings if r.name == metric}


def samples(c: DiskCollector) -> list[Sample]:
    out = c.collect()
    assert all(isinstance(r, Sample) for r in out)
    return [r for r in out if isinstance(r, Sample)]


def new_store() -> Store:
    return Store(Catalogue([*AGENT_METRICS, *disk.METRICS]))


def write_line(root: Path, name: str, fields: list[int]) -> None:
    """Replace one device's diskstats line, keeping the others."""
    path = root / "proc" / "diskstats"
    lines = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if parts[2] == name:
            line = f"{parts[0]:>4} {parts[1]:>7} {name} " + " ".join(map(str, fields))
        lines.append(line)
    path.write_text("\n".join(lines) + "\n")


# -- parsing -------------------------------------------------------------------------------------


def test_parse_real_vm_diskstats() -> None:
    stats, bad = parse_diskstats((HOST / "real-vm" / "proc" / "diskstats").read_text())
    assert bad == 0
    assert list(stats) == [*(f"loop{i}" for i in range(8)), "vda", "zram0"]
    # vda line: 44696 11189 3602698 17376 10680 23111 2077104 7150 0 10312 27388 ...
    assert stats["vda"] == DiskCounters(reads=44696, read_sectors=3602698, writes=10680,
                                        write_sectors=2077104, io_ticks_ms=10312)
    assert stats["zram0"] == DiskCounters(0, 0, 0, 0, 0)


def test_parse_every_kernel_line_length_and_count_malformed_lines() -> None:
    text = (
        "   8       0 sda 1 2 3 4 5 6 7 8 9 10 11\n"  # 14 fields (< 4.18)
        "   8      16 sdb 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15\n"  # 18 fields (4.18-5.4)
        "   8      32 sdc 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17\n"  # 20 fields (>= 5.5)
        "   3       1 hda1 21 22 23 24\n"  # 7 fields: partition line of kernels before 2.6.25
        "   8      48 sdd 1 2 3\n"  # truncated
        "   8      64 sde 1 2 x 4 5 6 7 8 9 10 11\n"  # not a number
        "\n"
    )
    stats, bad = parse_diskstats(text)
    assert bad == 2
    for name in ("sda", "sdb", "sdc"):
        assert stats[name] == DiskCounters(reads=1, read_sectors=3, writes=5, write_sectors=7, io_ticks_ms=10)
    assert stats["hda1"] == DiskCounters(reads=21, read_sectors=22, writes=23, write_sectors=24, io_ticks_ms=0)


# -- what counts ---------------------------------------------------------------------------------


def test_real_vm_reports_vda_only_in_bytes_and_seconds() -> None:
    out = samples(collector(HOST / "real-vm"))
    assert by_device(out, "kvscope_disk_read_bytes_total") == {"vda": 3602698 * 512}
    assert by_device(out, "kvscope_disk_written_bytes_total") == {"vda": 2077104 * 512}
    assert by_device(out, "kvscope_disk_reads_completed_total") == {"vda": 44696}
    assert by_device(out, "kvscope_disk_writes_completed_total") == {"vda": 10680}
    assert by_device(out, "kvscope_disk_io_time_seconds_total") == {"vda": 10.312}
    assert by_device(out, "kvscope_host_input_errors_total") == {"disk": 0}


def test_new_kernel_multipath_uses_the_head_only_and_never_partitions() -> None:
    out = samples(collector(HOST / "gpu-node"))
    reads = by_device(out, "kvscope_disk_read_bytes_total")
    # loop0 and dm-0 excluded by default, partitions and the hidden path disks never reported
    assert sorted(reads) == ["nvme0n1", "nvme1n1", "nvme2n1"]
    # the head's own counters, not head + paths (which would be twice the traffic)
    assert reads["nvme1n1"] == 4670809344 * 512
    assert by_device(out, "kvscope_disk_reads_completed_total")["nvme1n1"] == 9123456
    # the disk's own line, not disk + partitions
    assert reads["nvme0n1"] == 21873592 * 512


def test_old_kernel_multipath_sums_the_paths_of_a_zero_head() -> None:
    out = samples(collector(HOST / "nvme-mpath-old"))
    reads = by_device(out, "kvscope_disk_read_bytes_total")
    assert sorted(reads) == ["nvme0n1", "nvme1n1"]
    assert reads["nvme0n1"] == (1540146688 + 1533825024) * 512
    assert by_device(out, "kvscope_disk_writes_completed_total")["nvme0n1"] == 805511 + 804877
    assert by_device(out, "kvscope_disk_io_time_seconds_total")["nvme0n1"] == (1633410 + 1630022) / 1000
    assert reads["nvme1n1"] == 9123840 * 512


def test_kernels_without_the_hidden_attribute_are_told_by_the_path_disk_name(tmp_path: Path) -> None:
    root = tree(tmp_path, "nvme-mpath-old")
    for hidden in (root / "sys" / "block").glob("*/hidden"):
        hidden.unlink()
    out = samples(collector(root))
    assert sorted(by_device(out, "kvscope_disk_read_bytes_total")) == ["nvme0n1", "nvme1n1"]
    assert by_device(out, "kvscope_host_input_errors_total") == {"disk": 0}


def test_select_reports_paths_under_their_head_even_if_the_head_line_is_missing() -> None:
    one = DiskCounters(1, 2, 3, 4, 5)
    stats = {"nvme3c7n1": one, "nvme3c8n1": one}
    chosen = select_disks(stats, stats.keys(), {"nvme3c7n1": True, "nvme3c8n1": True}, lambda _: True)
    assert chosen == [("nvme3n1", ("nvme3c7n1", "nvme3c8n1"))]


def test_include_and_exclude_patterns_glob_and_regex() -> None:
    root = HOST / "gpu-node"
    only = by_device(samples(collector(root, include=["re:nvme[02]n1"])), "kvscope_disk_reads_completed_total")
    assert sorted(only) == ["nvme0n1", "nvme2n1"]
    # dm devices come back once they are no longer excluded; exclude wins over include
    with_dm = by_device(samples(collector(root, exclude=["loop*"])), "kvscope_disk_reads_completed_total")
    assert sorted(with_dm) == ["dm-0", "nvme0n1", "nvme1n1", "nvme2n1"]
    none = by_device(samples(collector(root, include=["nvme*"], exclude=["nvme*"])),
                     "kvscope_disk_reads_completed_total")
    assert none == {}


def test_bad_pattern_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"collectors\.disk: exclude: 're:\(' is not a regular expression"):
        load_config("[collectors.disk]\nexclude = ['re:(']\n", Components({"disk": disk.SPEC}, {}), environ={})


# -- cycles through the store --------------------------------------------------------------------


def test_vanished_disk_leaves_the_others_reporting(tmp_path: Path) -> None:
    root = tree(tmp_path, "gpu-node")
    store, clock = new_store(), Clock()
    c = collector(root, clock)
    store.ingest("disk", c.collect(), clock.now)
    shutil.rmtree(root / "sys" / "block" / "nvme2n1")  # hot-removed: its diskstats line may linger
    clock.now += 1
    store.ingest("disk", c.collect(), clock.now)
    assert sorted(k[0] for k in store.values("kvscope_disk_read_bytes_total")) == ["nvme0n1", "nvme1n1"]


def test_unreadable_hidden_file_is_counted_logged_once_and_the_rest_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tree(tmp_path, "gpu-node")
    hidden = root / "sys" / "block" / "nvme1c1n1" / "hidden"
    hidden.unlink()
    hidden.mkdir()  # reading it now fails with IsADirectoryError, even as root
    c = collector(root)
    with caplog.at_level(logging.WARNING, "kvscope.collectors.disk"):
        first = samples(c)
        second = samples(c)
    # the path disk is still recognised by its name: no double counting, head still reported
    assert sorted(by_device(first, "kvscope_disk_read_bytes_total")) == ["nvme0n1", "nvme1n1", "nvme2n1"]
    assert by_device(first, "kvscope_host_input_errors_total") == {"disk": 1}
    assert by_device(second, "kvscope_host_input_errors_total") == {"disk": 1}  # flag cached, not re-read
    assert len([r for r in caplog.records if "hidden" in r.getMessage()]) == 1


def test_malformed_diskstats_lines_are_counted_and_skipped(tmp_path: Path) -> None:
    root = tree(tmp_path, "gpu-node")
    path = root / "proc" / "diskstats"
    path.write_text(path.read_text() + " 259       9 nvme9n1 1 2\n")
    out = samples(collector(root))
    assert by_device(out, "kvscope_host_input_errors_total") == {"disk": 1}
    assert "nvme0n1" in by_device(out, "kvscope_disk_read_bytes_total")


def test_unreadable_diskstats_fails_the_run(tmp_path: Path) -> None:
    root = tree(tmp_path, "gpu-node")
    (root / "proc" / "diskstats").unlink()
    with pytest.raises(FileNotFoundError):
        collector(root).collect()


def test_device_reset_keeps_the_store_total_monotonic(tmp_path: Path) -> None:
    root = tree(tmp_path, "gpu-node")
    store, clock = new_store(), Clock()
    c = collector(root, clock)
    store.ingest("disk", c.collect(), clock.now)
    # nvme2n1 re-created (reset): every counter restarts near zero, io_ticks included
    write_line(root, "nvme2n1", [10, 0, 80, 5, 20, 0, 160, 9, 0, 7, 14, 0, 0, 0, 0, 0, 0])
    clock.now += 1
    store.ingest("disk", c.collect(), clock.now)
    labels = ("nvme2n1",)
    assert store.value("kvscope_disk_reads_completed_total", labels) == 612345 + 10
    assert store.value("kvscope_disk_read_bytes_total", labels) == (313520640 + 80) * 512
    # 7 ms of busy time after the reset, not ~49.7 days of a pretended 32-bit wrap
    assert store.value("kvscope_disk_io_time_seconds_total", labels) == pytest.approx(701.234 + 0.007, abs=1e-9)


def test_io_ticks_wrap_is_unwrapped_with_the_modulus_in_seconds(tmp_path: Path) -> None:
    root = tree(tmp_path, "gpu-node")
    store, clock = new_store(), Clock()
    c = collector(root, clock)
    before = TICKS_MODULUS_MS - 400  # 400 ms below the top of the 32-bit range
    write_line(root, "nvme2n1", [612345, 2, 313520640, 281234, 1223456, 3, 626409472, 612345, 0, before, 893579])
    store.ingest("disk", c.collect(), clock.now)
    write_line(root, "nvme2n1", [612345, 2, 313520640, 281234, 1223456, 3, 626409472, 612345, 0, 500, 893579])
    clock.now += 1.0
    wrapped = [r for r in samples(c) if r.name == "kvscope_disk_io_time_seconds_total" and r.labels == ("nvme2n1",)]
    assert wrapped[0].wrap_modulus == IO_TIME_MODULUS_S == 4294967.296
    store.ingest("disk", wrapped, clock.now)
    # 400 ms up to the wrap and 500 ms after it
    assert store.value("kvscope_disk_io_time_seconds_total", ("nvme2n1",)) == pytest.approx(before / 1000 + 0.9,
                                                                                              abs=1e-6)


def test_ticks_wrapped_only_when_the_implied_busy_time_fits_the_elapsed_time() -> None:
    top = TICKS_MODULUS_MS
    assert ticks_wrapped(top - 400, 500, elapsed_s=1.0)
    assert ticks_wrapped(top - 400, 500, elapsed_s=0.0)  # 900 ms: within the jiffy/lock slack
    assert not ticks_wrapped(top - 1400, 500, elapsed_s=0.0)
    assert not ticks_wrapped(top - 400_000, 500, elapsed_s=1.0)  # 400 s busy in 1 s: a reset
    assert not ticks_wrapped(5000, 7, elapsed_s=10.0)
    assert not ticks_wrapped(5000, 5000, elapsed_s=10.0)
    assert ticks_wrapped(top - 1500, 1000, elapsed_s=1.0, disks=2)  # two paths busy at once


def test_failover_of_a_path_keeps_the_summed_head_monotonic(tmp_path: Path) -> None:
    root = tree(tmp_path, "nvme-mpath-old")
    store, clock = new_store(), Clock()
    c = collector(root, clock)
    store.ingest("disk", c.collect(), clock.now)
    labels = ("nvme0n1",)
    first = store.value("kvscope_disk_reads_completed_total", labels)
    assert first == 3011223 + 2998877
    # controller 1 is lost: its path disk goes away; path 0 completes 100 more reads
    shutil.rmtree(root / "sys" / "block" / "nvme0c1n1")
    write_line(root, "nvme0c0n1", [3011323, 402, 1540146688, 1201733, 805511, 99, 412311552, 433120, 0, 1633510,
                                   1634853, 0, 0, 0, 0])
    clock.now += 1
    store.ingest("disk", c.collect(), clock.now)
    assert store.value("kvscope_disk_reads_completed_total", labels) == first + 100
    assert store.value("kvscope_disk_io_time_seconds_total", labels) == pytest.approx(
        (1633410 + 1630022 + 100) / 1000, abs=1e-9)
    assert store.value("kvscope_source_resets_total", ("disk",)) is None  # nothing looked like a reset


def test_member_sum_handles_a_restarted_and_a_wrapped_path() -> None:
    s = MemberSum()
    a, b = DiskCounters(100, 800, 50, 400, 4000), DiskCounters(10, 80, 5, 40, TICKS_MODULUS_MS - 100)
    assert s.update({"a": a, "b": b}, now=0.0) == DiskCounters(110, 880, 55, 440, 4000 + TICKS_MODULUS_MS - 100)
    # a restarts from zero (re-created path), b's io_ticks wraps 300 ms later
    total = s.update({"a": DiskCounters(1, 8, 0, 0, 20), "b": DiskCounters(12, 96, 5, 40, 200)}, now=1.0)
    assert total == DiskCounters(100 + 1 + 12, 800 + 8 + 96, 50 + 5, 400 + 40, 4000 + 20 + TICKS_MODULUS_MS + 200)
