"""The input side every host collector (disk, network, rdma, nfs, lustre, gpfs) shares: small-file
reads, the kernel-counter number parser, device and interface name filters, the input-error counter,
and which whole disk holds a path.

Kernel files are read whole, a file read every collection through a `KernelFile` (opened once, then
re-read with one `pread` from offset 0: procfs and sysfs make a file's text anew at each read from the
start); callers pass paths built from the injected proc/sys roots, never a hard-coded `/proc` or `/sys`.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path

from kvscope.agent.core.catalogue import counter
from kvscope.agent.core.readings import Sample

INPUT_ERRORS_METRIC = "kvscope_host_input_errors_total"
INPUT_ERRORS = counter(
    INPUT_ERRORS_METRIC, "", ("collector",),
    "Source files or lines a host collector could not read or parse; it skipped them and reported the rest.",
    "/proc, /sys, mmpmon, lctl",
)

REGEX_PREFIX = "re:"


def read_text(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as fh:
        return fh.read()


class KernelFile:
    """A procfs or sysfs file read every collection. Opened at the first read and kept open; each read is one
    `pread` from offset 0, which saves the open, close and text wrapper of `read_text` (about 15 µs of CPU a
    file on the 2-core VM). An error closes it, so the next read opens the path again (and raises what
    open() raises, naming the file, when it is gone)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = -1
        self._size = 16 * 1024  # grows to hold the whole file in one read

    def read(self) -> str:
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            while len(data := os.pread(self._fd, self._size, 0)) >= self._size:
                self._size *= 2
        except OSError:
            self.close()
            raise
        return data.decode("ascii", "replace")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


U64_DIGITS = len(str(2**64 - 1))  # 20


def parse_u64(token: str) -> int | None:
    """A kernel or client-tool counter: decimal ASCII digits of an unsigned 64-bit value, else None.

    Everything these collectors read is an unsigned counter of at most 64 bits (`%llu`, `%u`). A sign,
    an underscore, non-ASCII digits, or more than 20 digits is not one: `int()` would take `-5`, `1_0`
    and `٣`, raise ValueError past 4,300 digits, and a 400-digit value would overflow float() later. The
    caller skips the line or file and counts it; the rest of the input is still reported."""
    if not (0 < len(token) <= U64_DIGITS and token.isascii() and token.isdigit()):
        return None
    value = int(token)
    return value if value < 1 << 64 else None


def parse_u64s(tokens: Iterable[str]) -> list[int] | None:
    """parse_u64 of every token, or None when any of them is not a counter. The checks run over all tokens
    at once (in C): this is the inner loop of every host collector."""
    tokens = tuple(tokens)
    joined = "".join(tokens)
    if not (joined.isascii() and joined.isdigit()) or max(map(len, tokens)) > U64_DIGITS or not all(tokens):
        return None if tokens else []
    values = list(map(int, tokens))
    return values if max(values) < 1 << 64 else None


def _pattern_regex(pattern: str) -> str:
    if pattern.startswith(REGEX_PREFIX):
        return f"(?:{pattern[len(REGEX_PREFIX):]})"
    return fnmatch.translate(pattern)  # already anchored at both ends


def check_patterns(key: str, patterns: Iterable[str]) -> None:
    """Raise ValueError naming `key` when a pattern is empty or not a regular expression."""
    for pattern in patterns:
        if not pattern or pattern == REGEX_PREFIX:
            raise ValueError(f"{key}: empty pattern")
        try:
            re.compile(_pattern_regex(pattern))
        except re.error as exc:
            raise ValueError(f"{key}: {pattern!r} is not a regular expression: {exc}") from None


class NameFilter:
    """Device/interface selection: a name is kept when it matches `include` (or include is empty)
    and matches no `exclude` pattern. Patterns are shell globs (`nvme*`), or regular expressions
    after a `re:` prefix (`re:nvme[0-9]+n1`); both must match the whole name."""

    def __init__(self, include: Iterable[str], exclude: Iterable[str]) -> None:
        self._include = self._compile(include)
        self._exclude = self._compile(exclude)
        self._cache: dict[str, bool] = {}

    @staticmethod
    def _compile(patterns: Iterable[str]) -> re.Pattern[str] | None:
        parts = [_pattern_regex(p) for p in patterns]
        return re.compile("|".join(f"(?:{p})" for p in parts)) if parts else None

    def __call__(self, name: str) -> bool:
        kept = self._cache.get(name)
        if kept is None:
            kept = (self._include is None or self._include.fullmatch(name) is not None) and (
                self._exclude is None or self._exclude.fullmatch(name) is None
            )
            if len(self._cache) < 4096:  # names come from the kernel; bound it all the same
                self._cache[name] = kept
        return kept


class InputErrors:
    """Counts unreadable or malformed input and logs each kind of problem once, not per cycle."""

    def __init__(self, collector: str, log: logging.Logger) -> None:
        self.collector = collector
        self.total = 0
        self._log = log
        self._logged: set[str] = set()

    def note(self, kind: str, detail: str, count: int = 1) -> None:
        self.total += count
        if kind not in self._logged and len(self._logged) < 256:
            self._logged.add(kind)
            self._log.warning("%s: %s (skipped; logged once)", self.collector, detail)

    def sample(self) -> Sample:
        return Sample(INPUT_ERRORS_METRIC, (self.collector,), float(self.total))


def block_device_of(path: Path, sys_root: str = "/sys") -> str | None:
    """The whole disk holding `path`, as /proc/diskstats and /sys/block name it (a partition's parent),
    or None where there is none the disk collector can see (tmpfs, overlay, NFS, no sysfs)."""
    dev = os.stat(path).st_dev
    link = Path(sys_root) / "dev" / "block" / f"{os.major(dev)}:{os.minor(dev)}"
    try:
        real = link.resolve(strict=True)
    except OSError:
        return None
    if (real / "partition").exists():
        real = real.parent
    return real.name if (Path(sys_root) / "block" / real.name).exists() else None
