"""Lustre client: bytes per mounted Lustre filesystem from the llite `stats` files (hardware.md §4.3).

Each client mount has an llite instance `<fsname>-<superblock address>` with a `stats` file:

    snapshot_time             1700000000.123456789 secs.nsecs
    read_bytes                500 samples [bytes] 4096 1048576 209715200 ...
    write_bytes               ...

`<name> <count> samples [<unit>] <min> <max> <sum> [<sumsq>]`: the sum (7th token) of `read_bytes` /
`write_bytes` is the bytes applications read/wrote through that mount (llite is the VFS layer, so
page-cache hits count). A line is absent until its first event, which reads as 0 here.

Where: `/proc/fs/lustre/llite/*/stats` on older clients, debugfs `/sys/kernel/debug/lustre/llite/*/stats`
on newer ones (debugfs is normally root-only), both globbed under the injected roots; or the output of
`lctl get_param llite.*.stats` when `lctl` is configured. No Lustre is no data.

The `mount` label: the instance name changes at every mount (it holds a kernel address), so it is
resolved to the mount point through the mount table (`<proc_root>/self/mountinfo`, fstype lustre,
source `<nids>:/<fsname>[/subdir]`) when exactly one mount of that filesystem is visible; otherwise,
or with `mount_label = "instance"`, the label is the instance name. `kvscope_fs_mount_info` shows
the pairing either way.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from kvscope.agent.core.pipeline import CollectorContext, CollectorSpec
from kvscope.agent.core.readings import Reading
from kvscope.collectors.host.inputs import INPUT_ERRORS, InputErrors, parse_u64, read_text
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

log = logging.getLogger("kvscope.collectors.lustre")

FSTYPE = "lustre"
SUM_TOKEN = 6  # name count "samples" [unit] min max SUM [sumsq]
BYTE_STATS = ("read_bytes", "write_bytes")
DEFAULT_GLOBS = ("{proc_root}/fs/lustre/llite/*/stats", "{sys_root}/kernel/debug/lustre/llite/*/stats")
LCTL_PARAM = "llite.*.stats"

METRICS = (*FS_METRICS, INPUT_ERRORS)


@dataclass(slots=True)
class LliteStats:
    read_bytes: int | None = 0  # None: the line is there but unreadable (absent = no event yet = 0)
    write_bytes: int | None = 0
    malformed: list[str] = field(default_factory=list)  # stat lines that could not be read
    recognised: bool = False  # False: nothing in the text looked like an llite stats file


def parse_llite_stats(text: str) -> LliteStats:
    out = LliteStats()
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "snapshot_time" or (len(parts) >= 3 and parts[2] == "samples"):
            out.recognised = True
        if parts[0] not in BYTE_STATS:
            continue
        total = parse_u64(parts[SUM_TOKEN]) if len(parts) > SUM_TOKEN and parts[2] == "samples" else None
        if total is None:
            out.malformed.append(parts[0])
        if parts[0] == "read_bytes":
            out.read_bytes = total
        else:
            out.write_bytes = total
    return out


def split_lctl_output(text: str) -> dict[str, str]:
    """`lctl get_param llite.*.stats` output → {instance: stats text}.

    Each parameter starts with a `llite.<instance>.stats=` line; lctl puts a single-line value after
    the `=` and a multi-line one on the lines below it.
    """
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        head, eq, rest = line.partition("=")
        if eq and head.startswith("llite.") and head.endswith(".stats") and " " not in head:
            current = out.setdefault(head[len("llite."):-len(".stats")], [])
            if rest.strip():
                current.append(rest)
        elif current is not None:
            current.append(line)
    return {instance: "\n".join(lines) for instance, lines in out.items()}


def fsname_of(instance: str) -> str:
    """`lustre-ffff8d2a3c1e5000` → `lustre` (the part after the last dash is the instance id)."""
    return instance.rpartition("-")[0] or instance


def lustre_source_is(fsname: str) -> Callable[[str], bool]:
    """A mount source `nid[:nid...]:/fsname[/subdir]` names filesystem `fsname`."""

    def match(source: str) -> bool:
        _, sep, path = source.rpartition(":/")
        return bool(sep) and path.split("/", 1)[0] == fsname

    return match


@dataclass
class LustreOptions:
    # stats files to read, globbed; {proc_root} and {sys_root} stand for agent.proc_root / sys_root
    stats_globs: list[str] = field(default_factory=lambda: list(DEFAULT_GLOBS))
    lctl: str = ""  # path of lctl to run `lctl get_param llite.*.stats` instead of the files; "" = files
    command_timeout: float = 2.0  # seconds lctl may take (keep below the collector's timeout)
    mount_label: Literal["mountpoint", "instance"] = "mountpoint"
    mountinfo: str = "self/mountinfo"  # below agent.proc_root unless absolute

    def validate(self, path: str) -> None:
        if self.command_timeout <= 0:
            raise ValueError(f"command_timeout: must be > 0, got {self.command_timeout}")
        if self.lctl:
            check_tool(self.lctl, "lctl")
        for pattern in self.stats_globs:
            try:
                pattern.format(proc_root="", sys_root="")
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(f"stats_globs: {pattern!r}: only {{proc_root}} and {{sys_root}} may be "
                                 f"used ({exc!r})") from None


class LustreCollector:
    def __init__(self, options: LustreOptions, proc_root: str, sys_root: str) -> None:
        self._globs = [p.format(proc_root=proc_root, sys_root=sys_root) for p in options.stats_globs]
        self._lctl = options.lctl
        self._timeout = options.command_timeout
        self._resolve = options.mount_label == "mountpoint"
        self._mountinfo = under_root(proc_root, options.mountinfo)
        self._errors = InputErrors("lustre", log)

    def _from_files(self) -> dict[str, str]:
        texts: dict[str, str] = {}
        for pattern in self._globs:
            for path in sorted(glob.glob(pattern)):
                instance = os.path.basename(os.path.dirname(path))
                if instance in texts:
                    continue  # the same instance under both trees (an upgrade in progress): read once
                try:
                    texts[instance] = read_text(path)
                except FileNotFoundError:
                    continue  # unmounted between the listing and the read
                except OSError as exc:
                    self._errors.note("read", f"cannot read {path}: {exc}")
        return texts

    def _mounts(self) -> list[MountEntry]:
        return read_mounts(self._mountinfo, self._errors, "instance names") if self._resolve else []

    def collect(self) -> list[Reading]:
        if self._lctl:
            try:
                texts = split_lctl_output(run_tool([self._lctl, "get_param", LCTL_PARAM], b"", self._timeout))
            except ToolError as exc:
                raise RuntimeError(f"lustre: {exc}") from None
        else:
            texts = self._from_files()
        mounts = self._mounts() if texts else []
        # a filesystem mounted twice has two instances: neither can take "the" mount point's name
        per_fs: dict[str, int] = {}
        for instance in texts:
            per_fs[fsname_of(instance)] = per_fs.get(fsname_of(instance), 0) + 1
        totals = FsTotals.empty()
        for instance, text in sorted(texts.items()):
            stats = parse_llite_stats(text)
            if not stats.recognised:
                self._errors.note("unrecognised", f"llite stats of {instance} do not look like Lustre stats")
                continue
            if stats.malformed:
                self._errors.note("malformed", f"{instance}: unreadable {stats.malformed[0]} line",
                                  count=len(stats.malformed))
            fsname = fsname_of(instance)
            mount = None
            if mounts and per_fs[fsname] == 1:
                mount = mount_point_of(mounts, FSTYPE, lustre_source_is(fsname))
            totals.add((mount or instance, FSTYPE), stats.read_bytes, stats.write_bytes, instance)
        return [*totals.readings(), self._errors.sample()]


def build(options: LustreOptions, context: CollectorContext) -> LustreCollector:
    return LustreCollector(options, context.proc_root, context.sys_root)


SPEC = CollectorSpec(
    name="lustre",
    description="Lustre client: bytes read and written per mount (llite.*.stats)",
    options=LustreOptions,
    factory=build,
    metrics=METRICS,
    roots=("proc", "sys"),
    on_read=True,
)
