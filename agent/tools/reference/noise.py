"""Competing I/O for the G4 path: a noisy neighbour on the same filesystem and device as G4.

`NoiseInjector` runs threads doing large sequential reads and/or writes of one big file beside G4.
They bypass the page cache (O_DIRECT, or, where the filesystem refuses it, buffered I/O with fsync
after writes and POSIX_FADV_DONTNEED after reads), so every byte crosses the device the block files
live on, as unrelated traffic on a shared storage path would. Intensity: the number of threads, the
I/O size and an optional cap in bytes/s. The scenario that runs it beside the engine is
`agent.reference.noisy_neighbour`.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

MIB = 1 << 20
Mode = Literal["read", "write", "mixed"]


@dataclass(frozen=True, slots=True)
class NoiseSpec:
    threads: int = 2  # concurrent streams; each works on its own region of the file
    mode: Mode = "read"  # "mixed": even threads read, odd threads write
    io_bytes: int = 4 * MIB  # bytes per read/write call
    file_bytes: int = 512 * MIB  # the competing file; large enough that streams do not revisit soon
    bytes_per_second: float = 0.0  # total cap over all threads; 0 = as fast as the device allows
    direct: bool = True  # O_DIRECT where the filesystem allows it

    def __post_init__(self) -> None:
        if self.threads < 1 or self.io_bytes < 4096 or self.io_bytes % 4096:
            raise ValueError("threads >= 1 and io_bytes a positive multiple of 4096")
        if self.file_bytes < self.io_bytes * self.threads:
            raise ValueError("file_bytes must hold at least one I/O per thread")
        if self.mode not in ("read", "write", "mixed"):
            raise ValueError(f"mode: read, write or mixed, not {self.mode!r}")


class NoiseInjector:
    """Competing I/O in `directory`. `prepare()` writes the file (slow: do it before timing anything);
    `start()`/`stop()` or `with injector:` run the streams; `bytes_read`/`bytes_written` count them."""

    def __init__(self, directory: Path, spec: NoiseSpec = NoiseSpec(),
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.spec = spec
        self.path = directory / "kvscope-noise.dat"
        self._clock, self._sleep = clock, sleep
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.bytes_read = 0
        self.bytes_written = 0
        self.direct = spec.direct and hasattr(os, "O_DIRECT")
        self.errors: list[str] = []
        self.started_at: float | None = None
        self.stopped_at: float | None = None

    def _open(self, flags: int) -> int:
        if self.direct:
            try:
                return os.open(self.path, flags | os.O_DIRECT, 0o644)
            except OSError:
                self.direct = False  # tmpfs and some overlays refuse O_DIRECT: fall back, keep going
        return os.open(self.path, flags, 0o644)

    def prepare(self) -> None:
        """Writes the whole file with real data (unwritten extents would be read back without any I/O)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        buf = mmap.mmap(-1, self.spec.io_bytes)  # page-aligned, as O_DIRECT needs
        buf.write(os.urandom(min(self.spec.io_bytes, MIB)) * max(1, self.spec.io_bytes // MIB))
        fd = self._open(os.O_WRONLY | os.O_CREAT)
        try:
            for offset in range(0, self.spec.file_bytes, self.spec.io_bytes):
                os.pwritev(fd, [buf], offset)
            os.fsync(fd)
        finally:
            os.close(fd)

    def start(self) -> None:
        if not self.path.exists() or self.path.stat().st_size < self.spec.file_bytes:
            self.prepare()
        self._stop.clear()
        self.started_at, self.stopped_at = self._clock(), None
        region = self.spec.file_bytes // self.spec.threads // self.spec.io_bytes * self.spec.io_bytes
        for i in range(self.spec.threads):
            write = self.spec.mode == "write" or (self.spec.mode == "mixed" and i % 2 == 1)
            t = threading.Thread(target=self._stream, args=(i * region, region, write), name=f"noise-{i}",
                                 daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)
        self._threads.clear()
        self.stopped_at = self._clock()

    def __enter__(self) -> NoiseInjector:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    @property
    def bytes_moved(self) -> int:
        return self.bytes_read + self.bytes_written

    def _stream(self, first: int, length: int, write: bool) -> None:
        spec = self.spec
        per_thread = spec.bytes_per_second / spec.threads if spec.bytes_per_second > 0 else 0.0
        buf = mmap.mmap(-1, spec.io_bytes)
        if write:
            buf.write(os.urandom(spec.io_bytes))
        try:
            fd = self._open(os.O_RDWR)
        except OSError as exc:
            self.errors.append(f"open {self.path}: {exc}")
            return
        began, moved, offset = self._clock(), 0, 0
        try:
            while not self._stop.is_set():
                if per_thread:  # pace: never ahead of the cap
                    ahead = moved / per_thread - (self._clock() - began)
                    if ahead > 0:
                        self._sleep(min(ahead, 0.05))
                        continue
                at = first + offset
                if write:
                    n = os.pwritev(fd, [buf], at)
                    if not self.direct:
                        os.fsync(fd)  # buffered writes must reach the device now, not at writeback
                else:
                    n = os.preadv(fd, [buf], at)
                    if not self.direct:
                        os.posix_fadvise(fd, at, n, os.POSIX_FADV_DONTNEED)  # next pass reads the device
                moved += n
                with self._lock:
                    if write:
                        self.bytes_written += n
                    else:
                        self.bytes_read += n
                offset = (offset + spec.io_bytes) % length
        except OSError as exc:
            self.errors.append(f"{'write' if write else 'read'} {self.path}: {exc}")
        finally:
            os.close(fd)
