"""Block devices: bytes, operations and busy time per whole disk, from /proc/diskstats; sysfs decides
which lines count.

Why the file is parsed here and not by psutil: `psutil.disk_io_counters` reads from
`psutil.PROCFS_PATH`, a module global. Pointing it at the injected proc root (a host /proc mounted
into a sidecar, a test fixture) would change it for every psutil user in the process (a library
reading /proc/self through psutil) and race with them across collector threads. Its `nowrap` cache is
process-global too, and it turns a device reset into a jump. The format is a fixed list of integer
columns (shared/facts/hardware.md §1.1) that psutil itself parses with a dozen lines; this module
takes the same fields with the same 512-byte sector, from the injected root, in one read.

What counts (hardware.md §1.2): only entries of /sys/block (whole disks; partitions live below their
disk and are never added), minus the `exclude` patterns (loop, ram, zram, dm, md, sr by default).
NVMe native multipath: a per-path disk `nvme<S>c<C>n<N>` (sysfs `hidden` = 1) is never reported on
its own. Its head `nvme<S>n<N>` is reported with the head's own counters when they are not all zero
(newer kernels account I/O on the head), otherwise as the sum of its path disks (older kernels left
the head at zero) — never both.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, cast

from kvscope.agent.core.catalogue import counter
from kvscope.agent.core.pipeline import CollectorContext, CollectorSpec
from kvscope.agent.core.readings import Reading, Sample
from kvscope.collectors.host.inputs import (
    INPUT_ERRORS,
    InputErrors,
    KernelFile,
    NameFilter,
    check_patterns,
    parse_u64s,
    read_text,
)

log = logging.getLogger("kvscope.collectors.disk")

SECTOR_BYTES = 512  # diskstats counts 512-byte units whatever the device's block size (stat.rst)
TICKS_MODULUS_MS = 1 << 32  # io_ticks is printed with %u: 32 bits of milliseconds
IO_TIME_MODULUS_S = TICKS_MODULUS_MS / 1000  # the same wrap in the exported unit, seconds
TICKS_SLACK_MS = 1000.0  # io_ticks moves in jiffies and is read without a lock: allow some slack
DEFAULT_EXCLUDE = ("loop*", "ram*", "zram*", "dm-*", "md*", "sr*")
_NVME_PATH = re.compile(r"nvme(\d+)c\d+n(\d+)")  # nvme<subsystem>c<controller>n<namespace head>

METRICS = (
    counter("kvscope_disk_read_bytes_total", "bytes", ("device",),
            "Bytes read from the whole disk (sectors read x 512).", "/proc/diskstats"),
    counter("kvscope_disk_written_bytes_total", "bytes", ("device",),
            "Bytes written to the whole disk (sectors written x 512).", "/proc/diskstats"),
    counter("kvscope_disk_reads_completed_total", "", ("device",),
            "Read requests completed by the whole disk.", "/proc/diskstats"),
    counter("kvscope_disk_writes_completed_total", "", ("device",),
            "Write requests completed by the whole disk.", "/proc/diskstats"),
    counter("kvscope_disk_io_time_seconds_total", "seconds", ("device",),
            "Time the disk had at least one request in flight (io_ticks); approximate, and not a "
            "saturation measure for NVMe.", "/proc/diskstats"),
    INPUT_ERRORS,
)


class DiskCounters(NamedTuple):
    reads: int
    read_sectors: int
    writes: int
    write_sectors: int
    io_ticks_ms: int


_TICKS = DiskCounters._fields.index("io_ticks_ms")
_ZERO = DiskCounters(0, 0, 0, 0, 0)


def parse_diskstats(text: str, keep: Callable[[str], bool] | None = None) -> tuple[dict[str, DiskCounters], int]:
    """Counters per device name, and the number of malformed lines.

    Lines have 14 (kernel < 4.18), 18 (< 5.5) or 20 fields; 7-field lines are pre-2.6.25 partitions. With
    `keep`, the numbers of a device it rejects (a partition, a loop device) are not read, nor checked.
    """
    out: dict[str, DiskCounters] = {}
    bad = 0
    for line in text.splitlines():
        f = line.split()
        if not f:
            continue
        if keep is not None and len(f) in (7, 14, 18, 20) and not keep(f[2]):
            continue
        if len(f) >= 14:
            values = parse_u64s(f[i] for i in (3, 5, 7, 9, 12))
        elif len(f) == 7:
            values = parse_u64s((f[3], f[4], f[5], f[6], "0"))
        else:
            values = None
        if values is None:  # a short line, or a field that is no kernel counter (a sign, > 64 bits, ...)
            bad += 1
            continue
        out[f[2]] = DiskCounters(*values)
    return out, bad


def multipath_head(name: str) -> str | None:
    """The ns-head disk a hidden NVMe path disk belongs to (`nvme0c1n2` -> `nvme0n2`)."""
    m = _NVME_PATH.fullmatch(name)
    return f"nvme{m[1]}n{m[2]}" if m else None


def select_disks(
    stats: Mapping[str, DiskCounters],
    whole_disks: Iterable[str],
    hidden: Mapping[str, bool],
    wanted: Callable[[str], bool],
) -> list[tuple[str, tuple[str, ...]]]:
    """(device to report, diskstats names whose counters make it up), in diskstats order."""
    whole = set(whole_disks)
    paths: dict[str, list[str]] = {}
    disks: list[str] = []
    for name in stats:
        if name not in whole:  # a partition, or a disk already gone from sysfs
            continue
        if hidden.get(name, False):
            head = multipath_head(name)
            if head is not None:
                paths.setdefault(head, []).append(name)
            continue  # a hidden disk is never reported under its own name
        disks.append(name)
    out: list[tuple[str, tuple[str, ...]]] = []
    for name in disks:
        members = paths.pop(name, None)
        if not wanted(name):
            continue
        if members and stats[name] == _ZERO:
            out.append((name, tuple(sorted(members))))
        else:
            out.append((name, (name,)))
    for head, members in paths.items():  # paths whose head is not listed: still one device
        if wanted(head):
            out.append((head, tuple(sorted(members))))
    return out


def ticks_wrapped(previous_ms: float, current_ms: float, elapsed_s: float, disks: int = 1) -> bool:
    """Whether a decrease of io_ticks is a 32-bit wrap rather than a device reset.

    Busy time grows at most as fast as wall time (per disk), so a wrap is possible only if the
    time it implies fits in the time that passed; a re-created or hot-swapped disk starts from zero
    and must be counted as a reset, not as ~49.7 days of busy time.
    """
    if current_ms >= previous_ms:
        return False
    implied_ms = current_ms + TICKS_MODULUS_MS - previous_ms
    return implied_ms <= max(elapsed_s, 0.0) * 1000.0 * disks + TICKS_SLACK_MS


class MemberSum:
    """A monotonic sum of the counters of members that come and go (the paths of one NVMe head).

    The store keeps a single source counter monotonic, but a sum over paths is not one: when a path
    disappears (failover) or restarts, the sum drops although nothing was un-read. What a departed
    or restarted path had counted is kept in a base, so the sum only grows; 32-bit io_ticks wraps
    of one path are unwrapped here, so the sum needs no modulus.
    """

    def __init__(self) -> None:
        self._last: dict[str, tuple[DiskCounters, float]] = {}
        self._base = [0] * len(DiskCounters._fields)

    def update(self, members: Mapping[str, DiskCounters], now: float) -> DiskCounters:
        base = self._base
        for name, (last, _) in self._last.items():
            if name not in members:
                base[:] = [b + v for b, v in zip(base, last, strict=True)]
        for name, current in members.items():
            seen = self._last.get(name)
            if seen is None:
                continue
            last, at = seen
            for i, (c, p) in enumerate(zip(current, last, strict=True)):
                if c < p:
                    wrap = i == _TICKS and ticks_wrapped(p, c, now - at)
                    base[i] += TICKS_MODULUS_MS if wrap else p
        self._last = {name: (c, now) for name, c in members.items()}
        sums = [sum(col) for col in zip(*members.values(), strict=True)] if members else [0] * len(base)
        return DiskCounters(*(b + s for b, s in zip(base, sums, strict=True)))


@dataclass
class DiskOptions:
    include: list[str] = field(default_factory=list)  # globs, or regexes after "re:"; [] = every disk
    exclude: list[str] = field(default_factory=lambda: list(DEFAULT_EXCLUDE))  # wins over include

    def validate(self, path: str) -> None:
        check_patterns("include", self.include)
        check_patterns("exclude", self.exclude)


def hidden_flag(text: str | None, name: str) -> bool:
    """sysfs `hidden` says it; kernels without the attribute give only the path disk's name."""
    if text is None:
        return multipath_head(name) is not None
    return text.strip() == "1"


class DiskCollector:
    def __init__(self, options: DiskOptions, proc_root: str, sys_root: str, clock: Callable[[], float]) -> None:
        self._diskstats = os.path.join(proc_root, "diskstats")
        self._file = KernelFile(self._diskstats)
        self._block = os.path.join(sys_root, "block")
        self._clock = clock
        self._wanted = NameFilter(options.include, options.exclude)
        self._hidden: dict[str, bool] = {}  # per disk name while it stays in /sys/block
        self._sums: dict[str, MemberSum] = {}  # multipath heads reported as the sum of their paths
        self._ticks: dict[str, tuple[int, float]] = {}  # last io_ticks and when, per reported disk
        self._errors = InputErrors("disk", log)

    def _hidden_of(self, name: str) -> bool:
        flag = self._hidden.get(name)
        if flag is None:
            path = os.path.join(self._block, name, "hidden")
            try:
                text: str | None = read_text(path)
            except FileNotFoundError:
                text = None  # kernel without the attribute, or the disk left between listing and read
            except OSError as exc:
                self._errors.note(f"hidden:{name}", f"cannot read {path}: {exc}")
                text = None
            flag = self._hidden[name] = hidden_flag(text, name)
        return flag

    def collect(self) -> list[Reading]:
        # Without these two there is nothing true to report: let the scheduler mark the run failed.
        text = self._file.read()
        whole = set(os.listdir(self._block))
        # a disk that can be reported: it passes the filters, or it may be an NVMe path disk whose head does
        stats, bad = parse_diskstats(text, lambda name: name in whole and (
            self._wanted(name) or multipath_head(name) is not None))
        if bad:
            self._errors.note("diskstats", f"{bad} malformed line(s) in {self._diskstats}", bad)
        self._hidden = {n: f for n, f in self._hidden.items() if n in whole}
        hidden = {name: self._hidden_of(name) for name in stats if name in whole}
        now = self._clock()
        out: list[Reading] = []
        for device, members in select_disks(stats, whole, hidden, self._wanted):
            if members == (device,):
                out.extend(self._readings(device, stats[device], now))
            else:
                summed = self._sums.setdefault(device, MemberSum()).update({m: stats[m] for m in members}, now)
                out.extend(self._readings(device, summed, now, unwrapped=True))
        out.append(self._errors.sample())
        return out

    def _readings(self, device: str, c: DiskCounters, now: float, unwrapped: bool = False) -> list[Reading]:
        modulus: float | None = None
        previous = self._ticks.get(device)
        if not unwrapped and previous is not None and ticks_wrapped(previous[0], c.io_ticks_ms, now - previous[1]):
            modulus = IO_TIME_MODULUS_S
        self._ticks[device] = (c.io_ticks_ms, now)
        labels = (device,)
        return [
            Sample("kvscope_disk_read_bytes_total", labels, float(c.read_sectors * SECTOR_BYTES)),
            Sample("kvscope_disk_written_bytes_total", labels, float(c.write_sectors * SECTOR_BYTES)),
            Sample("kvscope_disk_reads_completed_total", labels, float(c.reads)),
            Sample("kvscope_disk_writes_completed_total", labels, float(c.writes)),
            # The modulus is 2^32 ms expressed in seconds, a fraction; Sample declares int (see report).
            Sample("kvscope_disk_io_time_seconds_total", labels, c.io_ticks_ms / 1000.0,
                   wrap_modulus=cast(int | None, modulus)),
        ]


def build(options: DiskOptions, context: CollectorContext) -> DiskCollector:
    return DiskCollector(options, context.proc_root, context.sys_root, context.clock)


SPEC = CollectorSpec(
    name="disk",
    description="Block devices: bytes, requests and busy time per whole disk (/proc/diskstats, /sys/block)",
    options=DiskOptions,
    factory=build,
    metrics=METRICS,
    roots=("proc", "sys"),
    on_read=True,
)
