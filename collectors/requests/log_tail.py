"""Follows a directory of hourly log files the way `tail -F` follows one: complete lines, in order, once.

An engine that writes one file per hour (SGLang's `sglang-request-metrics-<YYYYMMDD_HH>.log`) names them so
that their names sort in time order. The tail reads the current file from where it stopped; once a newer file
exists, it reads the current one to its end (it is complete: the writer moved on before creating the new one)
and moves to the next, in name order, so a backlog of several hours is read file by file. A file that shrank
below the position read (truncated: `> file`, logrotate's copytruncate) is read again from its start; a file
replaced under the same name (a new inode) likewise. Each is counted by reason.

A line is complete at its newline: the bytes after the last newline wait for the next read. A line longer
than `max_line_bytes` is skipped up to its newline and counted, so one runaway line cannot hold memory.
Reads are bounded by `max_read_bytes` per call; the rest waits for the next call.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from typing import Literal

StartAt = Literal["end", "start"]


@dataclass(slots=True)
class TailRead:
    lines: list[bytes] = field(default_factory=list)
    bytes_read: int = 0
    too_long: int = 0  # lines skipped for their length
    reopened: dict[str, int] = field(default_factory=dict)  # reason (rotated, truncated, replaced) -> times


class DirectoryTail:
    def __init__(self, directory: str, pattern: str, start_at: StartAt = "end",
                 max_read_bytes: int = 8 * 1024 * 1024, max_line_bytes: int = 4 * 1024 * 1024) -> None:
        self._directory, self._pattern = directory, pattern
        self._max_read, self._max_line = max_read_bytes, max_line_bytes
        self._name: str | None = None  # the file being followed
        self._inode = 0
        self._offset = 0
        self._partial = b""  # bytes after the last newline read
        self._skipping = False  # inside a line over max_line_bytes: drop bytes up to its newline
        names = self._names()
        if names:  # "end" is where the newest file ends now; a file that appears later is new, read whole
            self._open(names[-1], TailRead(), at_end=start_at == "end")

    @property
    def current(self) -> str | None:
        return self._name

    def _names(self) -> list[str]:
        try:
            entries = os.listdir(self._directory)
        except FileNotFoundError:
            return []  # the engine has not created it yet: no data, not an error
        return sorted(n for n in entries if fnmatch.fnmatchcase(n, self._pattern))

    def read(self) -> TailRead:
        """Complete lines written since the last call, or since the tail was made (OSError other than a missing
        file or directory propagates)."""
        out = TailRead()
        names = self._names()
        if self._name is None:
            if not names:
                return out
            self._open(names[0], out, at_end=False)
        while True:
            assert self._name is not None
            budget = self._max_read - out.bytes_read
            if budget <= 0:
                return out
            at_eof = self._read_current(budget, out)
            newer = [n for n in names if n > self._name]
            if not at_eof or not newer:
                return out
            self._open(newer[0], out, at_end=False)
            out.reopened["rotated"] = out.reopened.get("rotated", 0) + 1

    def _open(self, name: str, out: TailRead, at_end: bool) -> None:
        self._name, self._partial, self._skipping = name, b"", False
        try:
            st = os.stat(os.path.join(self._directory, name))
        except FileNotFoundError:
            self._inode, self._offset = 0, 0
            return
        self._inode, self._offset = st.st_ino, st.st_size if at_end else 0

    def _read_current(self, budget: int, out: TailRead) -> bool:
        """Reads the followed file from the offset; True when its end was reached."""
        assert self._name is not None
        path = os.path.join(self._directory, self._name)
        try:
            with open(path, "rb") as handle:
                st = os.fstat(handle.fileno())
                if self._inode and st.st_ino != self._inode:
                    self._restart(out, "replaced")
                elif st.st_size < self._offset:
                    self._restart(out, "truncated")
                self._inode = st.st_ino
                handle.seek(self._offset)
                data = handle.read(budget)
        except FileNotFoundError:
            return True  # removed: a newer file, if any, is next
        self._offset += len(data)
        out.bytes_read += len(data)
        self._split(data, out)
        return len(data) < budget

    def _restart(self, out: TailRead, reason: str) -> None:
        self._offset, self._partial, self._skipping = 0, b"", False
        out.reopened[reason] = out.reopened.get(reason, 0) + 1

    def _split(self, data: bytes, out: TailRead) -> None:
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                break
            if self._skipping:
                self._skipping = False
            else:
                line = self._partial + data[start:end]
                if len(line) > self._max_line:
                    out.too_long += 1
                else:
                    out.lines.append(line)
            self._partial = b""
            start = end + 1
        if self._skipping:
            return
        self._partial += data[start:]
        if len(self._partial) > self._max_line:
            out.too_long += 1
            self._partial, self._skipping = b"", True
