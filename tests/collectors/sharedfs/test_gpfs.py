"""Storage Scale collector: fs_io_s parsing, the mmpmon runner (real scripts), labels, config errors."""

from __future__ import annotations

import logging
import stat
import time
from pathlib import Path

import pytest

from kvscope.agent.app.wiring import components
from kvscope.agent.config.settings import ConfigError, load_config
from kvscope.agent.core.catalogue import AGENT_METRICS, Catalogue
from kvscope.agent.core.readings import Reading, Sample
from kvscope.agent.core.store import Store
from kvscope.collectors.sharedfs.common import ToolError
from kvscope.collectors.sharedfs.gpfs import (
    DEFAULT_MMPMON,
    METRICS,
    GpfsCollector,
    GpfsFs,
    GpfsOptions,
    parse_fs_io_s,
    run_mmpmon,
)
from testkit.paths import FIXTURES

SHAREDFS = FIXTURES / "sharedfs"
GPFS = SHAREDFS / "gpfs"
PROC = SHAREDFS / "node" / "proc"
U64_MAX = (1 << 64) - 1

# A stand-in for mmpmon: insists on `-p -s` and an fs_io_s request on stdin, like the real one is used.
MMPMON = """#!/bin/sh
[ "$#" -eq 2 ] && [ "$1" = "-p" ] && [ "$2" = "-s" ] || {{ echo "bad arguments: $*" >&2; exit 2; }}
read request
[ "$request" = "fs_io_s" ] || {{ echo "bad request: $request" >&2; exit 2; }}
cat "{answer}"
"""


def script(tmp_path: Path, body: str, name: str = "mmpmon") -> Path:
    path = tmp_path / name
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def fake_mmpmon(tmp_path: Path, answer: Path) -> Path:
    return script(tmp_path, MMPMON.format(answer=answer))


def values(out: list[Reading], metric: str) -> dict[tuple[str, ...], float]:
    return {r.labels: r.value for r in out if isinstance(r, Sample) and r.name == metric}


def collector(mmpmon: Path, **options: object) -> GpfsCollector:
    return GpfsCollector(GpfsOptions(mmpmon=str(mmpmon), **options), str(PROC))  # type: ignore[arg-type]


def test_parse_ibm_example_lines() -> None:
    parsed = parse_fs_io_s((GPFS / "fs_io_s.txt").read_text())
    assert parsed.filesystems == [
        GpfsFs("myCluster.xxx.com", "fs1", 6291456, 314572800),
        GpfsFs("myCluster.xxx.com", "fs2", U64_MAX, 0),
        GpfsFs("remote.example.org", "fs3", 1 << 40, 1 << 39),
    ]
    assert (parsed.failed, parsed.malformed, parsed.responses) == ([], [], 3)


def test_parse_error_lines() -> None:
    parsed = parse_fs_io_s((GPFS / "fs_io_s_errors.txt").read_text())
    assert parsed.filesystems == [GpfsFs("node1.localdomain", "gpfs1", 4096, 8192)]
    assert parsed.failed == [("gpfs2", 16)]
    assert len(parsed.malformed) == 2 and "12x4" in parsed.malformed[0]
    assert parsed.responses == 4  # _end_ is not a response line


def test_rc_1_means_no_file_system_mounted() -> None:
    parsed = parse_fs_io_s((GPFS / "fs_io_s_none_mounted.txt").read_text())
    assert (parsed.filesystems, parsed.failed, parsed.malformed, parsed.responses) == ([], [], [], 1)


@pytest.mark.parametrize("line", [
    "_fs_io_s_", "_fs_io_s_ _rc_", "_fs_io_s_ _rc_ x _fs_ a _br_ 1 _bw_ 1", "_fs_io_s_ _rc_ 0 _fs_ a _br_ 1",
    f"_fs_io_s_ _rc_ 0 _fs_ a _br_ {1 << 64} _bw_ 0", "_fs_io_s_ _rc_ 0 _fs_ a _br_ -1 _bw_ 0",
    "_fs_io_s_ _rc_ 0 _br_ 1 _bw_ 2",
])
def test_garbage_lines_are_malformed_never_raise(line: str) -> None:
    parsed = parse_fs_io_s(line + "\n\x00\x01 noise\n")
    assert parsed.filesystems == [] and parsed.failed == []
    assert parsed.malformed == [line]


def test_runner_feeds_the_request_and_returns_the_output(tmp_path: Path) -> None:
    mmpmon = fake_mmpmon(tmp_path, GPFS / "fs_io_s.txt")
    assert run_mmpmon(str(mmpmon), 5.0) == (GPFS / "fs_io_s.txt").read_text()


def process_gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")  # killed, waiting for its (new) parent to reap it


def test_runner_kills_a_hung_mmpmon_and_its_children(tmp_path: Path) -> None:
    # a wrapper script whose child hangs: killing only the script would leave the child running
    pidfile = tmp_path / "child.pid"
    mmpmon = script(tmp_path, f'#!/bin/sh\nsleep 30 &\necho $! > "{pidfile}"\nwait\n')
    began = time.monotonic()
    with pytest.raises(ToolError, match=r"gave no answer within 0\.5 s \(killed\)"):
        run_mmpmon(str(mmpmon), 0.5)
    assert time.monotonic() - began < 10
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while not process_gone(child) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert process_gone(child)


def test_runner_reports_a_non_zero_exit_with_stderr(tmp_path: Path) -> None:
    mmpmon = script(tmp_path, "#!/bin/sh\necho 'mmpmon: You must be root' >&2\nexit 1\n")
    with pytest.raises(ToolError, match="exited with status 1: mmpmon: You must be root"):
        run_mmpmon(str(mmpmon), 5.0)


def test_runner_reports_a_binary_that_vanished(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="cannot run"):
        run_mmpmon(str(tmp_path / "gone"), 5.0)


def test_collect_labels_by_mount_point_where_one_is_visible(tmp_path: Path) -> None:
    out = collector(fake_mmpmon(tmp_path, GPFS / "fs_io_s.txt")).collect()
    assert values(out, "kvscope_fs_read_bytes_total") == {
        ("/gpfs/fs1", "gpfs"): 6291456,  # whole mount beats the /kv bind mount of fs1's /kvcache
        ("fs2", "gpfs"): float(U64_MAX),  # mounted on two directories: ambiguous, the name stays
        ("fs3", "gpfs"): 1 << 40,  # not in this namespace's mount table
    }
    assert values(out, "kvscope_fs_written_bytes_total")[("/gpfs/fs1", "gpfs")] == 314572800
    assert values(out, "kvscope_fs_mount_info") == {
        ("/gpfs/fs1", "gpfs", "fs1", ""): 1.0, ("fs2", "gpfs", "fs2", ""): 1.0, ("fs3", "gpfs", "fs3", ""): 1.0}
    assert values(out, "kvscope_host_input_errors_total") == {("gpfs",): 0}
    catalogue = Catalogue(METRICS)
    assert all(len(catalogue[r.name].labels) == len(r.labels) for r in out)


def test_collect_by_name_on_request(tmp_path: Path) -> None:
    out = collector(fake_mmpmon(tmp_path, GPFS / "fs_io_s.txt"), mount_label="name").collect()
    assert set(values(out, "kvscope_fs_read_bytes_total")) == {("fs1", "gpfs"), ("fs2", "gpfs"), ("fs3", "gpfs")}


def test_error_lines_are_counted_and_logged_once_good_lines_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    c = collector(fake_mmpmon(tmp_path, GPFS / "fs_io_s_errors.txt"))
    with caplog.at_level(logging.WARNING, "kvscope.collectors.gpfs"):
        c.collect()
        out = c.collect()
    assert values(out, "kvscope_fs_read_bytes_total") == {("gpfs1", "gpfs"): 4096}
    assert values(out, "kvscope_host_input_errors_total") == {("gpfs",): 6}  # (1 rc + 2 malformed) x 2
    assert len(caplog.records) == 2  # the _rc_ 16 kind and the malformed kind, once each
    assert any("_rc_ 16" in r.getMessage() for r in caplog.records)


def test_no_file_system_mounted_is_no_data(tmp_path: Path) -> None:
    out = collector(fake_mmpmon(tmp_path, GPFS / "fs_io_s_none_mounted.txt")).collect()
    assert [(r.name, r.value) for r in out if isinstance(r, Sample)] == [("kvscope_host_input_errors_total", 0)]


@pytest.mark.parametrize(("body", "message"), [
    ("#!/bin/sh\nexit 0\n", "answered no fs_io_s line"),
    ("#!/bin/sh\necho 'mmpmon: daemon is not running'\n", "daemon is not running"),
    ("#!/bin/sh\necho 'mmpmon: not root' >&2\nexit 1\n", "exited with status 1: mmpmon: not root"),
])
def test_a_failing_run_is_a_collector_error(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        collector(script(tmp_path, body)).collect()


def test_mmpmon_reset_keeps_the_store_monotonic(tmp_path: Path) -> None:
    """Another mmpmon user's `reset` (or a remount) zeroes _br_/_bw_: the store counts a reset."""
    answer = tmp_path / "answer.txt"
    c = collector(fake_mmpmon(tmp_path, answer), mount_label="name")
    store = Store(Catalogue([*AGENT_METRICS, *METRICS]))
    seen = []
    for t, n in enumerate((1000, 3000, 200, 700)):
        answer.write_text(f"_fs_io_s_ _n_ 10.0.0.1 _nn_ n1 _rc_ 0 _t_ 1 _tu_ 0 _cl_ c _fs_ kv _d_ 1 "
                          f"_br_ {n} _bw_ {n // 2} _oc_ 0 _cc_ 0 _rdc_ 0 _wc_ 0 _dir_ 0 _iu_ 0\n")
        assert store.ingest("gpfs", c.collect(), float(t)).rejected == 0
        seen.append(store.value("kvscope_fs_read_bytes_total", ("kv", "gpfs")))
    assert seen == [1000, 3000, 3200, 3700]
    assert store.value("kvscope_fs_written_bytes_total", ("kv", "gpfs")) == 1850
    assert store.value("kvscope_source_resets_total", ("gpfs",)) == 2


@pytest.mark.skipif(Path(DEFAULT_MMPMON).exists(), reason="Storage Scale is installed here")
def test_config_disabled_by_default_and_a_missing_mmpmon_stops_the_start() -> None:
    specs = components()
    assert not specs.collectors["gpfs"].enabled_by_default
    config = load_config(None, specs, {})  # disabled: the default path is not checked
    assert not config.collectors["gpfs"][0].enabled
    with pytest.raises(ConfigError, match=r"^collectors\.gpfs: mmpmon: /usr/lpp/mmfs/bin/mmpmon does not exist"):
        load_config(None, specs, {"KVSCOPE_COLLECTORS__GPFS__ENABLED": "true"})


def test_config_checks_path_and_timeout(tmp_path: Path) -> None:
    specs = components()
    not_exec = tmp_path / "mmpmon-not-exec"
    not_exec.write_text("#!/bin/sh\n")  # no execute bit at all: not executable even for root
    with pytest.raises(ConfigError, match="is not executable"):
        load_config(f'[collectors.gpfs]\nenabled = true\nmmpmon = "{not_exec}"\n', specs, {})
    with pytest.raises(ConfigError, match="must be an absolute path"):
        load_config('[collectors.gpfs]\nenabled = true\nmmpmon = "mmpmon"\n', specs, {})
    mmpmon = fake_mmpmon(tmp_path, GPFS / "fs_io_s.txt")
    config = load_config(f'[collectors.gpfs]\nenabled = true\nmmpmon = "{mmpmon}"\ncommand_timeout = 1.5\n',
                         specs, {})
    settings, options = config.collectors["gpfs"]
    assert settings.enabled and options.mmpmon == str(mmpmon) and options.command_timeout == 1.5
    with pytest.raises(ConfigError, match="command_timeout: must be > 0"):
        load_config(f'[collectors.gpfs]\nenabled = true\nmmpmon = "{mmpmon}"\ncommand_timeout = 0\n', specs, {})
