"""NFS collector: mountstats parsing, client vs wire bytes, garbage, remounts through the store."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kvscope.agent.app.wiring import components
from kvscope.agent.config.settings import ConfigError, load_config
from kvscope.agent.core.catalogue import AGENT_METRICS, Catalogue
from kvscope.agent.core.readings import Reading, Sample
from kvscope.agent.core.store import Store
from kvscope.collectors.sharedfs.nfs import METRICS, NfsCollector, NfsOptions, parse_mountstats
from testkit.paths import FIXTURES

NODE = FIXTURES / "sharedfs" / "node"
MOUNTSTATS = NODE / "proc" / "self" / "mountstats"
GiB = 1 << 30


def samples(out: list[Reading]) -> list[Sample]:
    return [r for r in out if isinstance(r, Sample)]


def values(out: list[Reading], metric: str) -> dict[tuple[str, ...], float]:
    return {r.labels: r.value for r in samples(out) if r.name == metric}


def collect(proc_root: Path, **options: object) -> list[Reading]:
    return NfsCollector(NfsOptions(**options), str(proc_root)).collect()  # type: ignore[arg-type]


def test_parse_keeps_only_nfs_mounts_with_their_eight_byte_counters() -> None:
    parsed = parse_mountstats(MOUNTSTATS.read_text())
    assert [(m.mount_point, m.fstype, m.device, m.transport) for m in parsed.mounts] == [
        ("/mnt/data", "nfs", "10.0.0.5:/export/data", "tcp"),
        ("/mnt/kv", "nfs4", "10.2.0.9:/kvpool", "rdma"),
        ("/mnt/team a", "nfs4", "nas01:/home/team a", "tcp"),
    ]
    assert parsed.mounts[1].bytes == (2 * GiB, GiB // 2, 8 * GiB, 4 * GiB, 10 * GiB, 4831838208, 524288, 131072)
    assert parsed.malformed == ["/mnt/broken"]


def test_client_bytes_are_normal_plus_direct_and_wire_bytes_are_server_fields() -> None:
    out = collect(NODE / "proc")
    assert values(out, "kvscope_fs_read_bytes_total") == {
        ("/mnt/data", "nfs"): 5 * GiB, ("/mnt/kv", "nfs4"): 10 * GiB, ("/mnt/team a", "nfs4"): 4096}
    assert values(out, "kvscope_fs_written_bytes_total") == {
        ("/mnt/data", "nfs"): GiB, ("/mnt/kv", "nfs4"): GiB // 2 + 4 * GiB, ("/mnt/team a", "nfs4"): 8192}
    # buffered reads served partly from the page cache: less on the wire than the application read
    assert values(out, "kvscope_fs_server_read_bytes_total") == {
        ("/mnt/data", "nfs"): 4831838208, ("/mnt/kv", "nfs4"): 10 * GiB, ("/mnt/team a", "nfs4"): 4096}
    assert values(out, "kvscope_fs_server_written_bytes_total")[("/mnt/kv", "nfs4")] == 4831838208
    assert values(out, "kvscope_fs_mount_info") == {
        ("/mnt/data", "nfs", "10.0.0.5:/export/data", "tcp"): 1.0,
        ("/mnt/kv", "nfs4", "10.2.0.9:/kvpool", "rdma"): 1.0,
        ("/mnt/team a", "nfs4", "nas01:/home/team a", "tcp"): 1.0,
    }
    assert values(out, "kvscope_host_input_errors_total") == {("nfs",): 1}  # /mnt/broken


def test_every_reading_is_catalogued() -> None:
    catalogue = Catalogue(METRICS)
    for r in samples(collect(NODE / "proc")):
        spec = catalogue[r.name]
        assert len(spec.labels) == len(r.labels)


def test_malformed_bytes_line_is_counted_every_cycle_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    c = NfsCollector(NfsOptions(), str(NODE / "proc"))
    with caplog.at_level(logging.WARNING, "kvscope.collectors.nfs"):
        c.collect()
        out = c.collect()
    assert values(out, "kvscope_host_input_errors_total") == {("nfs",): 2}
    assert len(caplog.records) == 1
    assert "/mnt/broken" in caplog.records[0].getMessage()
    assert ("/mnt/broken", "nfs") not in values(out, "kvscope_fs_read_bytes_total")


@pytest.mark.parametrize("bytes_line", [
    "", "1 2 3 4 5 6 7", "1 2 3 4 5 6 7 x", "1 2 3 4 -5 6 7 8", "0x10 0 0 0 0 0 0 0", "\x00\x01 garbage",
])
def test_unusable_bytes_lines_are_malformed(bytes_line: str) -> None:
    text = f"device s:/e mounted on /m with fstype nfs statvers=1.1\n\tbytes:\t{bytes_line}\n"
    parsed = parse_mountstats(text)
    assert parsed.mounts == []
    assert parsed.malformed == ["/m"]


def test_extra_trailing_fields_are_tolerated_and_a_block_without_bytes_is_malformed() -> None:
    text = ("device s:/e mounted on /a with fstype nfs4 statvers=1.1\n\tbytes:\t1 2 3 4 5 6 7 8 9 10\n"
            "device s:/f mounted on /b with fstype nfs statvers=1.1\n\tage:\t3\n")
    parsed = parse_mountstats(text)
    assert [(m.mount_point, m.bytes) for m in parsed.mounts] == [("/a", (1, 2, 3, 4, 5, 6, 7, 8))]
    assert parsed.malformed == ["/b"]


@pytest.mark.parametrize(("text", "malformed"), [
    ("", []),
    ("\n\n", []),
    ("device", []),
    ("device foo", []),
    ("no device mounted on /x with fstype nfs statvers=1.1", ["/x"]),  # statistics block without bytes:
    ("bytes: 1 2 3 4 5 6 7 8", []),  # outside any mount block
    ("device a mounted on\tb with fstype nfs statvers=1.1\nbytes: 1", []),  # not the kernel's header shape
    ("\ufffd\ufffd device \ufffd mounted on / with fstype nfs4 statvers=1.1\n", []),
    ("device s:/e mounted on /m with fstype nfs\n\tbytes:\t1 2 3 4 5 6 7 8\n", []),  # no statvers: no stats
])
def test_garbage_never_raises(text: str, malformed: list[str]) -> None:
    parsed = parse_mountstats(text)
    assert parsed.mounts == []
    assert parsed.malformed == malformed


def test_a_mount_over_another_on_the_same_directory_wins(tmp_path: Path) -> None:
    block = "device s:/{e} mounted on /m with fstype nfs statvers=1.1\n\tbytes:\t{n} 0 0 0 {n} 0 0 0\n"
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "mountstats").write_text(block.format(e="lower", n=500) + block.format(e="upper", n=70))
    out = collect(tmp_path)
    assert values(out, "kvscope_fs_read_bytes_total") == {("/m", "nfs"): 70}
    assert values(out, "kvscope_fs_server_read_bytes_total") == {("/m", "nfs"): 70}
    assert values(out, "kvscope_fs_mount_info") == {("/m", "nfs", "s:/upper", ""): 1.0}


def test_no_mountstats_is_no_data_and_unreadable_is_counted(tmp_path: Path) -> None:
    out = collect(tmp_path)
    assert [(r.name, r.value) for r in samples(out)] == [("kvscope_host_input_errors_total", 0)]
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "mountstats").mkdir()  # unreadable: IsADirectoryError even as root
    assert values(collect(tmp_path), "kvscope_host_input_errors_total") == {("nfs",): 1}


def test_filters_and_server_bytes_switch() -> None:
    out = collect(NODE / "proc", exclude=["/mnt/team*"], server_bytes=False)
    assert set(values(out, "kvscope_fs_read_bytes_total")) == {("/mnt/data", "nfs"), ("/mnt/kv", "nfs4")}
    assert not any(r.name.startswith("kvscope_fs_server_") for r in samples(out))
    out = collect(NODE / "proc", include=["re:/mnt/k.*"])
    assert set(values(out, "kvscope_fs_read_bytes_total")) == {("/mnt/kv", "nfs4")}


def test_absolute_mountstats_path_ignores_the_proc_root(tmp_path: Path) -> None:
    out = collect(tmp_path, mountstats=str(MOUNTSTATS))
    assert len(values(out, "kvscope_fs_read_bytes_total")) == 3


def test_remount_counters_going_back_keep_the_store_monotonic(tmp_path: Path) -> None:
    """A remount starts the kernel's counters at zero: the store counts a reset and keeps adding."""
    store = Store(Catalogue([*AGENT_METRICS, *METRICS]))
    (tmp_path / "self").mkdir()
    path = tmp_path / "self" / "mountstats"
    c = NfsCollector(NfsOptions(), str(tmp_path))
    exported = []
    for t, n in enumerate((1000, 5000, 300, 900)):  # 300: remounted between the 2nd and 3rd cycle
        path.write_text(f"device s:/e mounted on /m with fstype nfs4 statvers=1.1\n"
                        f"\tbytes:\t{n} {n} 0 0 {n} {n} 0 0 \n")
        result = store.ingest("nfs", c.collect(), float(t))
        assert result.rejected == 0
        exported.append(store.value("kvscope_fs_read_bytes_total", ("/m", "nfs4")))
    assert exported == [1000, 5000, 5300, 5900]
    assert store.value("kvscope_fs_server_written_bytes_total", ("/m", "nfs4")) == 5900
    assert store.value("kvscope_source_resets_total", ("nfs",)) == 4  # 4 counters went back once each


def test_registered_enabled_by_default_and_configurable() -> None:
    specs = components()
    assert specs.collectors["nfs"].enabled_by_default
    config = load_config('[collectors.nfs]\nmountstats = "1/mountstats"\nexclude = ["/home/*"]\n', specs, {})
    settings, options = config.collectors["nfs"]
    assert settings.enabled and options.mountstats == "1/mountstats" and options.exclude == ["/home/*"]
    with pytest.raises(ConfigError, match=r"collectors\.nfs: include: 're:\(' is not a regular expression"):
        load_config('[collectors.nfs]\ninclude = ["re:("]\n', specs, {})
