"""IBM Storage Scale (GPFS) client: bytes per mounted file system from `mmpmon` `fs_io_s`
(hardware.md §4.1). Disabled by default: mmpmon needs root and the local mmfsd.

Each cycle runs `mmpmon -p -s` (no shell) with `fs_io_s` on stdin and a hard timeout. `-p` gives one
line per mounted file system, keywords then values:

    _fs_io_s_ _n_ <ip> _nn_ <node> _rc_ 0 _t_ <s> _tu_ <us> _cl_ <cluster> _fs_ <fs> _d_ <disks>
    _br_ <bytes read> _bw_ <bytes written> _oc_ ... _cc_ ... _rdc_ ... _wc_ ... _dir_ ... _iu_ ...

`_br_`/`_bw_` are unsigned 64-bit bytes read/written by applications on this node "from both disk
and cache", cumulative since the mount or the last `reset` request (another mmpmon user may issue
one: the store takes the drop as a reset). `_rc_` 1 on fs_io_s means no file system is mounted (no
data); any other non-zero `_rc_` makes that line an error (counted and logged once).

The `mount` label is the file system's mount point when the mount table (`<proc_root>/self/mountinfo`,
fstype gpfs, source `<fs>` or `/dev/<fs>`) shows exactly one, else the file system name (`_fs_`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from kvscope.agent.core.pipeline import CollectorContext, CollectorSpec
from kvscope.agent.core.readings import Reading
from kvscope.collectors.host.inputs import INPUT_ERRORS, InputErrors, parse_u64
from kvscope.collectors.sharedfs.common import (
    FS_METRICS,
    FsTotals,
    MountEntry,
    ToolError,
    check_tool,
    mount_point_of,
    read_mounts,
    run_tool,
    under_root,
)

log = logging.getLogger("kvscope.collectors.gpfs")

FSTYPE = "gpfs"
DEFAULT_MMPMON = "/usr/lpp/mmfs/bin/mmpmon"
REQUEST = b"fs_io_s\n"
RESPONSE = "_fs_io_s_"
RC_NO_FILESYSTEMS = 1  # "For the fs_io_s request, no file systems are mounted" (mmpmon return codes)

METRICS = (*FS_METRICS, INPUT_ERRORS)


@dataclass(frozen=True, slots=True)
class GpfsFs:
    cluster: str
    fs: str
    bytes_read: int
    bytes_written: int


@dataclass(slots=True)
class FsIoS:
    filesystems: list[GpfsFs] = field(default_factory=list)
    failed: list[tuple[str, int]] = field(default_factory=list)  # (file system or "?", _rc_) of error lines
    malformed: list[str] = field(default_factory=list)  # fs_io_s lines that could not be read
    responses: int = 0  # fs_io_s lines seen, good or bad


def parse_fs_io_s(text: str) -> FsIoS:
    """`mmpmon -p` output → per file system bytes. Lines of other responses (`_end_`, ...) are ignored."""
    out = FsIoS()
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0] != RESPONSE:
            continue
        out.responses += 1
        pairs = parts[1:]
        if len(pairs) % 2:
            out.malformed.append(line)
            continue
        kv = dict(zip(pairs[::2], pairs[1::2], strict=True))
        rc_text = kv.get("_rc_", "")
        magnitude = parse_u64(rc_text.removeprefix("-"))  # a return code: a small int, maybe negative
        if magnitude is None:
            out.malformed.append(line)
            continue
        rc = -magnitude if rc_text.startswith("-") else magnitude
        if rc == RC_NO_FILESYSTEMS:
            continue
        if rc != 0:
            out.failed.append((kv.get("_fs_", "?"), rc))
            continue
        fs, read, written = kv.get("_fs_"), parse_u64(kv.get("_br_", "")), parse_u64(kv.get("_bw_", ""))
        if not fs or read is None or written is None:
            out.malformed.append(line)
            continue
        out.filesystems.append(GpfsFs(kv.get("_cl_", ""), fs, read, written))
    return out


def run_mmpmon(path: str, timeout: float) -> str:
    """One `fs_io_s` request; ToolError when mmpmon cannot run, hangs or exits non-zero."""
    return run_tool([path, "-p", "-s"], REQUEST, timeout)


def gpfs_source_is(fs: str) -> Callable[[str], bool]:
    names = {fs, f"/dev/{fs}"}  # newer releases show the bare device name, older ones /dev/<fs>
    return names.__contains__


@dataclass
class GpfsOptions:
    mmpmon: str = DEFAULT_MMPMON
    command_timeout: float = 2.0  # seconds mmpmon may take (keep below the collector's timeout)
    mount_label: Literal["mountpoint", "name"] = "mountpoint"
    mountinfo: str = "self/mountinfo"  # below agent.proc_root unless absolute

    def validate(self, path: str) -> None:
        # only called when the collector is enabled: a missing mmpmon then stops the agent at start
        if self.command_timeout <= 0:
            raise ValueError(f"command_timeout: must be > 0, got {self.command_timeout}")
        check_tool(self.mmpmon, "mmpmon")


class GpfsCollector:
    def __init__(self, options: GpfsOptions, proc_root: str) -> None:
        self._mmpmon = options.mmpmon
        self._timeout = options.command_timeout
        self._resolve = options.mount_label == "mountpoint"
        self._mountinfo = under_root(proc_root, options.mountinfo)
        self._errors = InputErrors("gpfs", log)

    def _mounts(self) -> list[MountEntry]:
        return read_mounts(self._mountinfo, self._errors, "file system names") if self._resolve else []

    def collect(self) -> list[Reading]:
        try:
            text = run_mmpmon(self._mmpmon, self._timeout)
        except ToolError as exc:
            raise RuntimeError(f"gpfs: {exc}") from None
        parsed = parse_fs_io_s(text)
        if parsed.responses == 0:
            first = text.strip().splitlines()[0][:120] if text.strip() else "nothing"
            raise RuntimeError(f"gpfs: mmpmon answered no fs_io_s line (it printed {first!r})")
        for fs, rc in parsed.failed:
            self._errors.note(f"rc:{rc}", f"mmpmon fs_io_s _rc_ {rc} for file system {fs}")
        if parsed.malformed:
            self._errors.note("malformed", f"unreadable fs_io_s line: {parsed.malformed[0][:120]!r}",
                              count=len(parsed.malformed))
        mounts = self._mounts() if parsed.filesystems else []
        totals = FsTotals.empty()
        for f in parsed.filesystems:
            mount = mount_point_of(mounts, FSTYPE, gpfs_source_is(f.fs)) if mounts else None
            totals.add((mount or f.fs, FSTYPE), f.bytes_read, f.bytes_written, f.fs)
        return [*totals.readings(), self._errors.sample()]


def build(options: GpfsOptions, context: CollectorContext) -> GpfsCollector:
    return GpfsCollector(options, context.proc_root)


SPEC = CollectorSpec(
    name="gpfs",
    description="IBM Storage Scale (GPFS) client: bytes read and written per file system (mmpmon fs_io_s; "
                "needs root)",
    options=GpfsOptions,
    factory=build,
    metrics=METRICS,
    enabled_by_default=False,
    roots=("proc",),
    on_read=True,
)
