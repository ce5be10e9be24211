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

from agent.readings import Reading, Sample
from collectors.base import CollectorContext, CollectorSpec
from collectors.fs_common import (
    FS_METRICS,
    FS_SERVER_READ,
    FS_SERVER_WRITTEN,
    NFS_SERVER_METRICS,
    FsTotals,
    under_root,
    unescape,
)
from collectors.sysfs import INPUT_ERRORS, InputErrors, NameFilter, check_patterns, read_text

log = logging.getLogger("kvscope.collectors.nfs")

NFS_FSTYPES = frozenset({"nfs", "nfs4"})
BYTES_FIELDS = 8  # __NFSIOS_BYTESMAX
# "device X" or, for a mount without a device name, "no device"; then the mount point and type
_DEVICE = re.compile(r"^(?:device (\S+)|no device) mounted on (\S+) with fstype (\S+)(?: statvers=(\S+))?")

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


@dataclass(slots=True)
class _Block:
    device: str
    mount_point: str
    fstype: str
    transport: str = ""
    bytes_text: str | None = None


def _bytes(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    fields = text.split()
    if len(fields) < BYTES_FIELDS:  # more is tolerated: a future kernel appending counters
        return None
    try:
        values = tuple(int(f) for f in fields[:BYTES_FIELDS])
    except ValueError:
        return None
    return values if min(values) >= 0 else None


def parse_mountstats(text: str) -> MountStats:
    """The NFS mounts of a mountstats text with their byte counters; non-NFS mounts are skipped."""
    out = MountStats()
    block: _Block | None = None

    def finish(b: _Block | None) -> None:
        if b is None:
            return
        values = _bytes(b.bytes_text)
        if values is None:
            out.malformed.append(b.mount_point)
        else:
            out.mounts.append(NfsMount(b.device, b.mount_point, b.fstype, b.transport, values))

    for line in text.splitlines():
        if line.startswith(("device ", "no device ")):
            finish(block)
            block = None
            m = _DEVICE.match(line)
            # only NFS has statistics (statvers=); every other filesystem is a bare device line
            if m is not None and m.group(3) in NFS_FSTYPES and m.group(4) is not None:
                block = _Block(unescape(m.group(1) or ""), unescape(m.group(2)), m.group(3))
            continue
        if block is None:
            continue
        stripped = line.lstrip()
        if stripped.startswith("bytes:"):
            block.bytes_text = stripped[len("bytes:"):]
        elif stripped.startswith("xprt:") and not block.transport:
            proto = stripped[len("xprt:"):].split()
            block.transport = proto[0] if proto else ""
    finish(block)
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
        self._wanted = NameFilter(options.include, options.exclude)
        self._server_bytes = options.server_bytes
        self._errors = InputErrors("nfs", log)

    def collect(self) -> list[Reading]:
        try:
            text = read_text(self._path)
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
)
