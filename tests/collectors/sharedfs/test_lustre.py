"""Lustre collector: llite stats parsing, both file trees, lctl, mount-point labels, garbage."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest

from kvscope.agent.app.wiring import components
from kvscope.agent.config.settings import ConfigError, load_config
from kvscope.agent.core.catalogue import AGENT_METRICS, Catalogue
from kvscope.agent.core.readings import Reading, Sample
from kvscope.agent.core.store import Store
from kvscope.collectors.sharedfs.lustre import (
    METRICS,
    LustreCollector,
    LustreOptions,
    fsname_of,
    lustre_source_is,
    parse_llite_stats,
    split_lctl_output,
)
from testkit.paths import FIXTURES

SHAREDFS = FIXTURES / "sharedfs"
NODE = SHAREDFS / "node"
OLD = NODE / "proc" / "fs" / "lustre" / "llite" / "lustre-ffff8f0a12345000" / "stats"
NEW = NODE / "sys" / "kernel" / "debug" / "lustre" / "llite" / "scratch-ffff9c1b2e6a8800" / "stats"
LCTL_OUTPUT = SHAREDFS / "lustre" / "lctl_get_param_llite_stats.txt"


def values(out: list[Reading], metric: str) -> dict[tuple[str, ...], float]:
    return {r.labels: r.value for r in out if isinstance(r, Sample) and r.name == metric}


def collect(root: Path, **options: object) -> list[Reading]:
    c = LustreCollector(LustreOptions(**options), str(root / "proc"), str(root / "sys"))  # type: ignore[arg-type]
    return c.collect()


def test_parse_sum_field_of_old_and_new_layouts() -> None:
    old = parse_llite_stats(OLD.read_text())
    assert (old.read_bytes, old.write_bytes, old.malformed, old.recognised) == (85899345920, 21474836480, [], True)
    new = parse_llite_stats(NEW.read_text())  # with sumsq after the sum, and start/elapsed time lines
    assert (new.read_bytes, new.write_bytes) == (1 << 40, 1 << 39)


def test_absent_byte_lines_read_as_zero() -> None:
    stats = parse_llite_stats("snapshot_time 1.5 secs.nsecs\nopen 2 samples [usecs] 5 9 14 106\n")
    assert (stats.read_bytes, stats.write_bytes, stats.recognised) == (0, 0, True)


@pytest.mark.parametrize("line", [
    "read_bytes 5 samples [bytes] 1 2",  # no sum
    "read_bytes 5 calls [bytes] 1 2 3",
    "read_bytes 5 samples [bytes] 1 2 -3",
    "read_bytes 5 samples [bytes] 1 2 3.5",
    "read_bytes 5 samples [bytes] 1 2 \u00b2",
])
def test_unreadable_byte_line_is_none_not_zero(line: str) -> None:
    stats = parse_llite_stats(f"snapshot_time 1.5 secs.nsecs\n{line}\nwrite_bytes 1 samples [bytes] 7 7 7\n")
    assert stats.read_bytes is None
    assert stats.write_bytes == 7
    assert stats.malformed == ["read_bytes"]


@pytest.mark.parametrize("text", ["", "garbage\n", "\x00\x01\x02", "read_bytes\n"])
def test_text_that_is_not_llite_stats_is_not_recognised(text: str) -> None:
    assert not parse_llite_stats(text).recognised


def test_instance_names_and_mount_sources() -> None:
    assert fsname_of("scratch-ffff9c1b2e6a8800") == "scratch"
    assert fsname_of("my-fs-ffff9c1b2e6a8800") == "my-fs"
    assert fsname_of("odd") == "odd"
    match = lustre_source_is("scratch")
    assert match("10.1.0.20@o2ib:/scratch") and match("a@tcp:b@tcp:/scratch/models")
    assert not match("10.1.0.20@o2ib:/scratch2") and not match("scratch") and not match("x:/lustre")


def test_both_trees_with_mount_points_resolved() -> None:
    out = collect(NODE)
    assert values(out, "kvscope_fs_read_bytes_total") == {
        ("/lustre", "lustre"): 85899345920,
        ("/scratch", "lustre"): 1 << 40,  # the whole-filesystem mount wins over the /models bind mount
        ("home-ffff9c1b30c41000", "lustre"): 0,  # not in this namespace's mount table
    }
    assert values(out, "kvscope_fs_written_bytes_total")[("/scratch", "lustre")] == 1 << 39
    assert values(out, "kvscope_fs_mount_info") == {
        ("/lustre", "lustre", "lustre-ffff8f0a12345000", ""): 1.0,
        ("/scratch", "lustre", "scratch-ffff9c1b2e6a8800", ""): 1.0,
        ("home-ffff9c1b30c41000", "lustre", "home-ffff9c1b30c41000", ""): 1.0,
    }
    assert values(out, "kvscope_host_input_errors_total") == {("lustre",): 0}
    catalogue = Catalogue(METRICS)
    assert all(len(catalogue[r.name].labels) == len(r.labels) for r in out)


def test_instance_labels_on_request_and_when_a_filesystem_is_mounted_twice(tmp_path: Path) -> None:
    out = collect(NODE, mount_label="instance")
    assert set(values(out, "kvscope_fs_read_bytes_total")) == {
        ("lustre-ffff8f0a12345000", "lustre"), ("scratch-ffff9c1b2e6a8800", "lustre"),
        ("home-ffff9c1b30c41000", "lustre")}
    root = tmp_path / "n"
    shutil.copytree(NODE, root)
    second = root / "sys" / "kernel" / "debug" / "lustre" / "llite" / "scratch-ffff9c1b44440000"
    second.mkdir()
    shutil.copy(NEW, second / "stats")
    labels = set(values(collect(root), "kvscope_fs_read_bytes_total"))
    assert ("/scratch", "lustre") not in labels
    assert {("scratch-ffff9c1b2e6a8800", "lustre"), ("scratch-ffff9c1b44440000", "lustre")} <= labels


def test_no_lustre_is_no_data(tmp_path: Path) -> None:
    out = collect(tmp_path)
    assert [(r.name, r.value) for r in out if isinstance(r, Sample)] == [("kvscope_host_input_errors_total", 0)]


def test_malformed_line_drops_only_that_counter_and_garbage_file_is_skipped(tmp_path: Path) -> None:
    root = tmp_path / "n"
    shutil.copytree(NODE, root)
    new_copy = root / NEW.relative_to(NODE)
    new_copy.write_text(NEW.read_text().replace("549755813888", "5497558x3888"))
    (root / OLD.relative_to(NODE)).write_text("\x00\x00 not a stats file\n")
    out = collect(root)
    assert values(out, "kvscope_fs_read_bytes_total") == {
        ("/scratch", "lustre"): 1 << 40, ("home-ffff9c1b30c41000", "lustre"): 0}
    assert ("/scratch", "lustre") not in values(out, "kvscope_fs_written_bytes_total")
    assert values(out, "kvscope_host_input_errors_total") == {("lustre",): 2}


def test_a_counter_that_goes_back_keeps_the_store_monotonic(tmp_path: Path) -> None:
    """`lctl set_param llite.*.stats=clear` or a remount zeroes the sums: the store counts a reset."""
    stats = tmp_path / "proc" / "fs" / "lustre" / "llite" / "kv-ffff000011112222" / "stats"
    stats.parent.mkdir(parents=True)
    store = Store(Catalogue([*AGENT_METRICS, *METRICS]))
    c = LustreCollector(LustreOptions(), str(tmp_path / "proc"), str(tmp_path / "sys"))
    seen = []
    for t, total in enumerate((4096, 65536, 0, 8192)):
        lines = ["snapshot_time 1.0 secs.nsecs"]
        if total:
            lines.append(f"read_bytes 3 samples [bytes] 1 4096 {total}")
        stats.write_text("\n".join(lines) + "\n")
        assert store.ingest("lustre", c.collect(), float(t)).rejected == 0
        seen.append(store.value("kvscope_fs_read_bytes_total", ("kv-ffff000011112222", "lustre")))
    assert seen == [4096, 65536, 65536, 73728]
    assert store.value("kvscope_source_resets_total", ("lustre",)) == 1


def test_split_lctl_output() -> None:
    parts = split_lctl_output(LCTL_OUTPUT.read_text())
    assert list(parts) == ["lustre-ffff8f0a12345000", "scratch-ffff9c1b2e6a8800"]
    assert parse_llite_stats(parts["scratch-ffff9c1b2e6a8800"]).read_bytes == 1 << 40
    one_line = split_lctl_output("llite.a-ffff01.stats=snapshot_time 1.0 secs.nsecs\nnoise\n")
    assert one_line == {"a-ffff01": "snapshot_time 1.0 secs.nsecs\nnoise"}
    assert split_lctl_output("error: get_param: param_path 'llite/*/stats': No such file or directory\n") == {}


def fake_lctl(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "lctl"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_lctl_is_run_with_get_param_and_its_output_used(tmp_path: Path) -> None:
    lctl = fake_lctl(tmp_path, f'[ "$*" = "get_param llite.*.stats" ] || exit 3\ncat "{LCTL_OUTPUT}"\n')
    out = collect(NODE, lctl=str(lctl))
    assert values(out, "kvscope_fs_read_bytes_total") == {
        ("/lustre", "lustre"): 85899345920, ("/scratch", "lustre"): 1 << 40}


def test_failing_lctl_is_a_collector_error(tmp_path: Path) -> None:
    lctl = fake_lctl(tmp_path, 'echo "error: get_param: permission denied" >&2\nexit 13\n')
    with pytest.raises(RuntimeError, match="exited with status 13: error: get_param: permission denied"):
        collect(NODE, lctl=str(lctl))


def test_config_checks_lctl_and_glob_placeholders(tmp_path: Path) -> None:
    specs = components()
    assert specs.collectors["lustre"].enabled_by_default
    with pytest.raises(ConfigError, match=r"collectors\.lustre: lctl: /nonexistent/lctl does not exist"):
        load_config('[collectors.lustre]\nlctl = "/nonexistent/lctl"\n', specs, {})
    with pytest.raises(ConfigError, match=r"stats_globs: '\{root\}/x'"):
        load_config('[collectors.lustre]\nstats_globs = ["{root}/x"]\n', specs, {})
    lctl = fake_lctl(tmp_path, "exit 0\n")
    config = load_config(f'[collectors.lustre]\nlctl = "{lctl}"\nmount_label = "instance"\n', specs, {})
    assert config.collectors["lustre"][1].lctl == str(lctl)
