"""NFS client: bytes per NFS mount from `/proc/self/mountstats` (hardware.md §4.2).

Each mount is a `device <server>:<export> mounted on <mountpoint> with fstype nfs|nfs4 statvers=1.x`
block; its `bytes:` line holds eight u64 counters in `include/linux/nfs_iostat.h` enum order:

  1 NORMALREADBYTES    read(2) through the page cache     5 SERVERREADBYTES    READ reply payload
  2 NORMALWRITTENBYTES write(2) through the page cache    6 SERVERWRITTENBYTES WRITE call payload
  3 DIRECTREADBYTES    O_DIRECT reads                     7 READPAGES
  4 DIRECTWRITTENBYTES O_DIRECT writes                    8 WRITEPAGES

Client traffic (`kvscope_fs_read_bytes_total`, like Lustre's and Storage Scale's numbers) is what
applications moved: 1 + 3 and 2 + 4. The wire (`kvscope_fs_server_*`) is 5 and 6: a page-cache hit
counts in 1 and not in 5, and read-ahead counts in 5 before anyone reads it. The kernel never zeroes
them while the mount lives; a remount starts at zero, which the store takes as a reset.

The file is per mount namespace: in a pod it lists the pod's mounts. Other filesystems appear in it
too (without statistics) and are ignored. Mount points are reported as the kernel prints them, with
its octal escapes (`\\040` for a space) undone.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

from kvscope.agent.core.pipeline import CollectorContext, CollectorSpec
from kvscope.agent.core.readings import Reading, Sample
from kvscope.collectors.host.inputs import INPUT_ERRORS, InputErrors, KernelFile, NameFilter, check_patterns, parse_u64s
from kvscope.collectors.sharedfs.common import (
    FS_METRICS,
    FS_SERVER_READ,
    FS_SERVER_WRITTEN,
    NFS_SERVER_METRICS,
    FsTotals,
    under_root,
    unescape,
)

log = logging.getLogger("kvscope.collectors.nfs")

NFS_FSTYPES = frozenset({"nfs", "nfs4"})
BYTES_FIELDS = 8  # __NFSIOS_BYTESMAX
_STARTS = ("device ", "no device ")
# "device X" or, for a mount without a device name, "no device"; then the mount point and type
_HEADER = re.compile(r"(?:device (\S+)|no device) mounted on (\S+) with fstype (\S+)(?: statvers=(\S+))?")

METRICS = (*FS_METRICS, *NFS_SERVER_METRICS, INPUT_ERRORS)


@dataclass(frozen=True, slots=True)
class NfsMount:
    device: str  # server:/export
    mount_point: str
    fstype: str
    transport: str  # first xprt: protocol (tcp, udp, rdma), "" when the block has none
    bytes: tuple[int, ...]  # the eight bytes: counters, in enum order


@dataclass(slots=True)
class MountStats:
    mounts: list[NfsMount] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)  # mount points whose bytes: line is unusable


def _bytes(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    fields = text.split()
    if len(fields) < BYTES_FIELDS:  # more is tolerated: a future kernel appending counters
        return None
    values = parse_u64s(fields[:BYTES_FIELDS])
    return None if values is None else tuple(values)


def _mount_starts(text: str) -> list[int]:
    """Offsets of the lines that start a mount block ("device ..." or "no device ...")."""
    starts = [0] if text.startswith(_STARTS) else []
    for marker in ("\ndevice ", "\nno device "):
        i = text.find(marker)
        while i >= 0:
            starts.append(i + 1)
            i = text.find(marker, i + 1)
    starts.sort()
    return starts


def _field(block: str, key: str) -> str | None:
    """The rest of the first indented `key` line of a block (`bytes:`, `xprt:`), or None."""
    i = block.find(key)
    while i >= 0:
        line_start = block.rfind("\n", 0, i) + 1
        if line_start > 0 and not block[line_start:i].strip():  # the key starts its (indented) line
            end = block.find("\n", i)
            return block[i + len(key):end if end >= 0 else len(block)]
        i = block.find(key, i + 1)
    return None


def parse_mountstats(text: str) -> MountStats:
    """The NFS mounts of a mountstats text with their byte counters; non-NFS mounts are skipped.

    Blocks and their `bytes:`/`xprt:` lines are found with str.find, not line by line: per-op
    statistics are most of the file (some 60 lines per NFSv4 mount) and are never looked at.
    """
    out = MountStats()
    if " with fstype nfs" not in text:  # no NFS mount at all (every fstype of NFS_FSTYPES begins so)
        return out
    starts = _mount_starts(text)
    for n, start in enumerate(starts):
        block = text[start:starts[n + 1] if n + 1 < len(starts) else len(text)]
        m = _HEADER.match(block)
        # only NFS has statistics (statvers=); every other filesystem is a bare device line
        if m is None or m.group(3) not in NFS_FSTYPES or m.group(4) is None:
            continue
        mount_point = unescape(m.group(2))
        values = _bytes(_field(block, "bytes:"))
        if values is None:
            out.malformed.append(mount_point)
            continue
        xprt = (_field(block, "xprt:") or "").split()
        out.mounts.append(NfsMount(unescape(m.group(1) or ""), mount_point, m.group(3), xprt[0] if xprt else "",
                                   values))
    return out


@dataclass
class NfsOptions:
    mountstats: str = "self/mountstats"  # below agent.proc_root unless absolute ("1/mountstats": the host's)
    include: list[str] = field(default_factory=list)  # mount-point globs, or regexes after "re:"; [] = all
    exclude: list[str] = field(default_factory=list)  # wins over include
    server_bytes: bool = True  # also report the wire bytes (kvscope_fs_server_*)

    def validate(self, path: str) -> None:
        if not self.mountstats:
            raise ValueError("mountstats: must name a file")
        check_patterns("include", self.include)
        check_patterns("exclude", self.exclude)


class NfsCollector:
    def __init__(self, options: NfsOptions, proc_root: str) -> None:
        self._path = under_root(proc_root, options.mountstats)
        self._file = KernelFile(self._path)
        self._wanted = NameFilter(options.include, options.exclude)
        self._server_bytes = options.server_bytes
        self._errors = InputErrors("nfs", log)

    def collect(self) -> list[Reading]:
        try:
            text = self._file.read()
        except FileNotFoundError:
            return [self._errors.sample()]  # no procfs there (or not Linux): no data, not an error
        except OSError as exc:
            self._errors.note("read", f"cannot read {self._path}: {exc}")
            return [self._errors.sample()]
        parsed = parse_mountstats(text)
        if parsed.malformed:
            self._errors.note("malformed", f"{self._path}: unusable bytes: line for {parsed.malformed[0]}",
                              count=len(parsed.malformed))
        totals = FsTotals.empty()
        server: dict[tuple[str, str], tuple[int, int]] = {}
        for mount in parsed.mounts:  # in mount order: a mount over another one comes later and wins
            if not self._wanted(mount.mount_point):
                continue
            b = mount.bytes
            labels = (mount.mount_point, mount.fstype)
            totals.add(labels, b[0] + b[2], b[1] + b[3], mount.device, mount.transport)
            server[labels] = (b[4], b[5])
        out = totals.readings()
        if self._server_bytes:
            for labels, (rd, wr) in server.items():
                out.append(Sample(FS_SERVER_READ, labels, float(rd)))
                out.append(Sample(FS_SERVER_WRITTEN, labels, float(wr)))
        out.append(self._errors.sample())
        return out


def build(options: NfsOptions, context: CollectorContext) -> NfsCollector:
    return NfsCollector(options, context.proc_root)


SPEC = CollectorSpec(
    name="nfs",
    description="NFS client: bytes read and written per NFS mount (/proc/self/mountstats)",
    options=NfsOptions,
    factory=build,
    metrics=METRICS,
    roots=("proc",),
    on_read=True,
)
