"""What the shared-filesystem collectors (nfs, lustre, gpfs) share: their metrics, the mount table,
and running a client tool (mmpmon, lctl) without a shell and with a hard timeout.

All three report `kvscope_fs_read_bytes_total{mount,fstype}` / `kvscope_fs_written_bytes_total`
with one meaning: bytes that applications on this node read or wrote through the filesystem client,
page-cache hits included (NFS normal + O_DIRECT bytes, Lustre llite `read_bytes`/`write_bytes`,
Storage Scale `_br_`/`_bw_`). Bytes on the wire to the servers are a different number; NFS gives
them (`kvscope_fs_server_*`), see docs/shared-fs.md.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from kvscope.agent.core.catalogue import counter, gauge
from kvscope.agent.core.readings import Reading, Sample
from kvscope.collectors.host.inputs import InputErrors, read_text

FS_LABELS = ("mount", "fstype")
FS_SOURCE = "NFS /proc/self/mountstats, Lustre llite.*.stats, Storage Scale mmpmon fs_io_s"

FS_READ = "kvscope_fs_read_bytes_total"
FS_WRITTEN = "kvscope_fs_written_bytes_total"
FS_SERVER_READ = "kvscope_fs_server_read_bytes_total"
FS_SERVER_WRITTEN = "kvscope_fs_server_written_bytes_total"
FS_MOUNT_INFO = "kvscope_fs_mount_info"

FS_METRICS = (
    counter(FS_READ, "bytes", FS_LABELS,
            "Bytes applications on this node read through the shared-filesystem client (cache hits included).",
            FS_SOURCE),
    counter(FS_WRITTEN, "bytes", FS_LABELS,
            "Bytes applications on this node wrote through the shared-filesystem client.", FS_SOURCE),
    gauge(FS_MOUNT_INFO, "", ("mount", "fstype", "source", "transport"),
          "Always 1; what the mount label stands for: the export, llite instance or file system name, "
          "and the transport where the client says (NFS xprt: tcp, rdma).", FS_SOURCE),
)
NFS_SERVER_METRICS = (
    counter(FS_SERVER_READ, "bytes", FS_LABELS,
            "Payload bytes the NFS client received in READ replies (the wire, without RPC headers).",
            "/proc/self/mountstats bytes: field 5 (SERVERREADBYTES)"),
    counter(FS_SERVER_WRITTEN, "bytes", FS_LABELS,
            "Payload bytes the NFS client sent in WRITE calls (the wire, without RPC headers).",
            "/proc/self/mountstats bytes: field 6 (SERVERWRITTENBYTES)"),
)


def under_root(root: str, path: str) -> str:
    """`path` when absolute, else `path` below the injected proc/sys root."""
    return path if os.path.isabs(path) else os.path.join(root, path)


# -- mount table ------------------------------------------------------------------------------------

_OCTAL = re.compile(r"\\([0-7]{3})")


def unescape(field: str) -> str:
    """Undo the kernel's octal escapes in mount fields (`\\040` is a space, `\\011` a tab...)."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field) if "\\" in field else field


@dataclass(frozen=True, slots=True)
class MountEntry:
    root: str  # the directory of the filesystem that is mounted here ("/" = the whole filesystem)
    mount_point: str
    fstype: str
    source: str


def parse_mountinfo(text: str) -> list[MountEntry]:
    """`/proc/<pid>/mountinfo` (proc(5)): `id parent maj:min root mountpoint opts [optional...] - fstype
    source superopts`. Lines that do not have that shape are skipped (the table only names mounts)."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        try:
            dash = parts.index("-", 6)
        except ValueError:
            continue
        if len(parts) < dash + 3:
            continue
        out.append(MountEntry(unescape(parts[3]), unescape(parts[4]), parts[dash + 1], unescape(parts[dash + 2])))
    return out


def read_mounts(path: str, errors: InputErrors, fallback: str) -> list[MountEntry]:
    """The mount table at `path`; unreadable means no mount points (labels fall back to `fallback`)."""
    try:
        return parse_mountinfo(read_text(path))
    except OSError as exc:
        errors.note("mountinfo", f"cannot read {path} (labels fall back to {fallback}): {exc}")
        return []


def mount_point_of(mounts: Iterable[MountEntry], fstype: str, is_source: Callable[[str], bool]) -> str | None:
    """The one mount point where this filesystem is mounted, or None when none or several are visible.

    Mounts of the whole filesystem (root "/") win over bind mounts of a directory in it; a sidecar that
    only sees a bind mount of a subdirectory gets that mount point.
    """
    found = [m for m in mounts if m.fstype == fstype and is_source(m.source)]
    whole = [m for m in found if m.root == "/"] or found
    points = {m.mount_point for m in whole}
    return points.pop() if len(points) == 1 else None


# -- readings ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class FsTotals:
    """Byte totals per (mount, fstype) label pair, as the collection will report them.

    Two entries on the same labels (an NFS mount over another on the same directory) are not added:
    the later one wins, which is the mount on top, the one applications reach. Adding them would
    turn the lower mount's unmount into a drop of the sum, i.e. a reset, and count its bytes again.
    """

    read: dict[tuple[str, str], int]
    written: dict[tuple[str, str], int]
    info: dict[tuple[str, str], tuple[str, str]]

    @classmethod
    def empty(cls) -> FsTotals:
        return cls({}, {}, {})

    def add(self, labels: tuple[str, str], read: int | None, written: int | None, source: str,
            transport: str = "") -> None:
        """None leaves that counter out this cycle (its line was unreadable): better no point than a
        wrong one, which the store would take as a reset and then count the whole total again."""
        self.read.pop(labels, None)
        self.written.pop(labels, None)
        if read is not None:
            self.read[labels] = read
        if written is not None:
            self.written[labels] = written
        self.info[labels] = (source, transport)

    def readings(self) -> list[Reading]:
        out: list[Reading] = [Sample(FS_READ, k, float(v)) for k, v in self.read.items()]
        out += [Sample(FS_WRITTEN, k, float(v)) for k, v in self.written.items()]
        out += [Sample(FS_MOUNT_INFO, (*k, *v), 1.0) for k, v in self.info.items()]
        return out


# -- running a client tool --------------------------------------------------------------------------


class ToolError(RuntimeError):
    """The tool could not be run, hung past its timeout, or exited non-zero (a collector error)."""


STDERR_SHOWN = 200  # characters of the tool's stderr quoted in the error


def run_tool(argv: Sequence[str], stdin: bytes, timeout: float) -> str:
    """Run `argv` (no shell), feed it `stdin`, return its stdout as text.

    The tool runs in its own session and on timeout the whole process group is killed: mmpmon and
    lctl may be wrapper scripts, and subprocess.run's timeout kills only the direct child, leaving a
    hung grandchild (still talking to mmfsd) behind at every cycle.
    """
    try:
        proc = subprocess.Popen(
            list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True, close_fds=True,
        )
    except OSError as exc:
        raise ToolError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise ToolError(f"{argv[0]} gave no answer within {timeout:g} s (killed)") from None
    except BaseException:
        _kill_group(proc)
        raise
    if proc.returncode != 0:
        detail = err.decode("utf-8", "replace").strip()[:STDERR_SHOWN] or "no message on stderr"
        raise ToolError(f"{argv[0]} exited with status {proc.returncode}: {detail}")
    return out.decode("utf-8", "replace")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()  # the direct child is dead; its pipes are closed without waiting for more output
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def check_tool(path: str, key: str) -> None:
    """Raise ValueError naming `key` when `path` is not an executable file (a config/start error)."""
    if not os.path.isabs(path):
        raise ValueError(f"{key}: must be an absolute path, got {path!r}")
    if not os.path.isfile(path):
        raise ValueError(f"{key}: {path} does not exist (is the client installed on this node, or mounted "
                         "into the container?)")
    if not os.access(path, os.X_OK):
        raise ValueError(f"{key}: {path} is not executable by this user")
