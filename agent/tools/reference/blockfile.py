"""Block files for the disk tiers (G3 local, G4 shared): one file per block, read and written whole.

Layout: a 4096-byte header, then the payload padded to a multiple of 4096. The header is a full page so
that the payload starts aligned and the whole file can be read with O_DIRECT in one preadv into
page-aligned buffers (perf-baselines §4: Python adds nothing measurable at ≥ 512 KiB requests).

Header (little endian): magic b"KVSBLK01", key u64, payload bytes u64, checksum algorithm u32,
tokens per block u32, checksum u64; the rest zero. Checksum: xxh3-64 when the xxhash module is present
(≈ 11 GiB/s here, so it does not cap a warm read), else CRC-32 (≈ 1.9 GiB/s). The algorithm is in the
header, so files written with one are read correctly by the other.

Writes go to a temporary name and are renamed into place, so a reader never sees a half-written block;
no fsync, because a lost block is only a cache miss. A truncated or corrupted file is reported by
`parse_header`/`verify` and the caller treats it as a miss (never as data).
"""

from __future__ import annotations

import errno
import mmap
import os
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PAGE = 4096
MAGIC = b"KVSBLK01"
_HEADER = struct.Struct("<8sQQIIQ")
ALGO_CRC32, ALGO_XXH3 = 1, 2


def _checksums() -> dict[int, Callable[[memoryview], int]]:
    algos: dict[int, Callable[[memoryview], int]] = {ALGO_CRC32: zlib.crc32}
    try:
        import xxhash

        algos[ALGO_XXH3] = xxhash.xxh3_64_intdigest
    except ImportError:
        pass
    return algos


CHECKSUMS = _checksums()
DEFAULT_ALGO = ALGO_XXH3 if ALGO_XXH3 in CHECKSUMS else ALGO_CRC32


def padded(n: int) -> int:
    return -(-n // PAGE) * PAGE


@dataclass(frozen=True, slots=True)
class BlockHeader:
    key: int
    payload_bytes: int
    algo: int
    block_tokens: int
    checksum: int


class BlockFileError(ValueError):
    """Why a block file cannot be used: kind is 'truncated', 'corrupt' or 'mismatch'."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


def encode_header(h: BlockHeader) -> bytes:
    return _HEADER.pack(MAGIC, h.key, h.payload_bytes, h.algo, h.block_tokens, h.checksum).ljust(PAGE, b"\0")


def parse_header(raw: bytes | memoryview, file_bytes: int) -> BlockHeader:
    """Pure: the header of a block file whose first page is `raw` and whose size is `file_bytes`."""
    if len(raw) < _HEADER.size or file_bytes < PAGE:
        raise BlockFileError("truncated", f"{file_bytes} bytes, shorter than the header")
    magic, key, length, algo, tokens, checksum = _HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise BlockFileError("corrupt", f"bad magic {magic!r}")
    if algo not in (ALGO_CRC32, ALGO_XXH3):
        raise BlockFileError("corrupt", f"unknown checksum algorithm {algo}")
    if file_bytes < PAGE + length:
        raise BlockFileError("truncated", f"{file_bytes} bytes for a {length}-byte payload")
    return BlockHeader(key, length, algo, tokens, checksum)


def verify(header: BlockHeader, want_key: int, want_bytes: int, payload: memoryview) -> None:
    if header.key != want_key or header.payload_bytes != want_bytes:
        raise BlockFileError("mismatch", f"file holds key {header.key:016x}/{header.payload_bytes} B, "
                                         f"wanted {want_key:016x}/{want_bytes} B")
    algo = CHECKSUMS.get(header.algo)
    if algo is None:
        raise BlockFileError("corrupt", f"checksum algorithm {header.algo} not available here")
    if algo(payload) != header.checksum:
        raise BlockFileError("corrupt", "checksum mismatch")


def direct_io_supported(directory: Path) -> tuple[bool, str]:
    """Whether O_DIRECT opens and reads on this filesystem (tmpfs and some overlays refuse it)."""
    if not hasattr(os, "O_DIRECT"):
        return False, "this platform has no O_DIRECT"
    probe = directory / ".kvscope-odirect-probe"
    try:
        probe.write_bytes(b"\0" * PAGE)
        fd = os.open(probe, os.O_RDONLY | os.O_DIRECT)
        try:
            buf = mmap.mmap(-1, PAGE)
            os.preadv(fd, [buf], 0)
        finally:
            os.close(fd)
        return True, "ok"
    except OSError as exc:
        return False, f"O_DIRECT refused on {directory}: {errno.errorcode.get(exc.errno or 0, exc.errno)}"
    finally:
        probe.unlink(missing_ok=True)


class BlockFiles:
    """Reads and writes block files in one directory. Buffers passed in must be page-aligned when direct."""

    def __init__(self, directory: Path, direct: bool = False, algo: int = DEFAULT_ALGO) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.direct = direct
        self.algo = algo
        self._header = mmap.mmap(-1, PAGE)  # page-aligned header buffer for O_DIRECT
        self._flags = os.O_DIRECT if direct else 0

    def path(self, key: int) -> Path:
        return self.directory / f"{key:016x}.kvb"

    def write(self, key: int, slot: np.ndarray, n: int, block_tokens: int) -> int:
        """Writes the first `n` bytes of `slot` (a page-padded pool slot) as block `key`. Returns bytes written."""
        checksum = CHECKSUMS[self.algo](slot[:n].data)
        self._header[:] = encode_header(BlockHeader(key, n, self.algo, block_tokens, checksum))
        body = slot[:padded(n)] if self.direct else slot[:n]
        final = self.path(key)
        tmp = final.with_suffix(f".tmp{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | self._flags, 0o644)
        try:
            written = os.pwritev(fd, [self._header, body.data], 0)
        finally:
            os.close(fd)
        if written != PAGE + len(body):
            tmp.unlink(missing_ok=True)
            raise OSError(errno.EIO, f"short write of {tmp}: {written} bytes")
        os.replace(tmp, final)
        return written

    def read(self, key: int, slot: np.ndarray, n: int) -> int:
        """Reads block `key` (n payload bytes) into `slot`, a page-padded pool slot.

        Returns the bytes read from the file; raises BlockFileError if the file is unusable and
        FileNotFoundError if it is gone (another process may have evicted it from a shared directory)."""
        target = slot[:padded(n)] if self.direct else slot[:n]
        fd = os.open(self.path(key), os.O_RDONLY | self._flags)
        try:
            got = os.preadv(fd, [self._header, target.data], 0)
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        header = parse_header(memoryview(self._header), size)
        if got < PAGE + min(n, header.payload_bytes):
            raise BlockFileError("truncated", f"read {got} bytes")
        verify(header, key, n, slot[:n].data)
        return got

    def remove(self, key: int) -> None:
        self.path(key).unlink(missing_ok=True)

    def existing_keys(self) -> list[int]:
        """Keys of block files already in the directory, oldest first (to adopt a shared tier's content)."""
        found = []
        for p in self.directory.glob("*.kvb"):
            try:
                found.append((p.stat().st_mtime, int(p.stem, 16)))
            except (ValueError, OSError):
                continue
        return [k for _, k in sorted(found)]

