"""What the fuzz targets share: the target record, the values worth splicing in, the mutator, and the
crash check (tests/lib/testkit/fuzz_targets.py defines the targets)."""

from __future__ import annotations

import random
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Target:
    name: str
    run: Callable[[bytes], None]  # raises only `allowed`; an AssertionError is a broken invariant
    seeds: list[bytes]
    tokens: list[bytes]  # values worth splicing in
    allowed: tuple[type[BaseException], ...] = ()


# -- mutations ----------------------------------------------------------------------------------------

TEXT_TOKENS = [b"9" * 400, b"7" * 5000, b"-1", b"-0", b"+5", b"NaN", b"nan", b"+Inf", b"-Inf", b"1e309", b"1e-400",
               b"0x10", b"1_000", "\u0663\u0663".encode(), b"18446744073709551616", b"18446744073709551615",
               b"\x00", b"\xff\xfe", b"\t", b" ", b"\r\n", b"\n", b"\n\n", b"{", b"}", b'"', b"\\", b"\\n", b"=",
               b",", b":", b"#", b"_", b"1.5", b"0", b"e", b"\xe2\x80\xa8"]
MSGPACK_TOKENS = [b"\x91" * 1000, b"\x81\xa1a" * 500, b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff",
                  b"\xdb\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff", b"\xcf" + b"\xff" * 8,
                  b"\xd3" + b"\x80" + b"\0" * 7,
                  b"\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00", b"\xcb\x7f\xf0\x00\x00\x00\x00\x00\x00", b"\xc1", b"\xc0",
                  b"\xc2", b"\xc3", b"\x90", b"\x80", b"\xa0", b"\xa4type", b"\xabBlockStored", b"\xacBlockRemoved",
                  b"\xb0AllBlocksCleared", b"\xacblock_hashes", b"\xa6medium", b"\xa3GPU", b"\xa7STORAGE",
                  b"\xa8locality", b"\xa6REMOTE", b"\xaablock_size", b"\xa2ts", b"\xa6events", b"\xd4\x01\x00",
                  b"\xc7\x00\x05", b"\xd9\x05hello", b"\xc4\x03abc"]


def mutate(rng: random.Random, data: bytes, seeds: list[bytes], tokens: list[bytes]) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 3, 5))):
        n = len(buf)
        op = rng.randrange(10)
        i = rng.randrange(n + 1)
        if op == 0 and n:
            buf[min(i, n - 1)] ^= 1 << rng.randrange(8)
        elif op == 1 and n:
            buf[min(i, n - 1)] = rng.randrange(256)
        elif op == 2:
            buf[i:i] = rng.randbytes(rng.randint(1, 8))
        elif op == 3 and n:
            j = min(n, i + rng.randint(1, 64))
            del buf[i:j]
        elif op == 4 and n:
            j = min(n, i + rng.randint(1, 64))
            buf[i:i] = buf[i:j] * rng.randint(1, 16)
        elif op in (5, 6):
            buf[i:i] = rng.choice(tokens)
        elif op == 7 and n:  # overwrite a run of digits (a number) with a token
            start = i
            while start < n and not chr(buf[start]).isdigit():
                start += 1
            end = start
            while end < n and chr(buf[end]).isdigit():
                end += 1
            buf[start:end] = rng.choice(tokens)
        elif op == 8:
            other = rng.choice(seeds)
            buf = buf[:i] + other[rng.randrange(len(other) + 1):]
        elif op == 9:
            buf = buf[:i]
    return bytes(buf)


def inputs(target: Target, rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.03:
        return rng.randbytes(rng.randint(0, 256))
    seed = rng.choice(target.seeds)
    return seed if roll < 0.05 else mutate(rng, seed, target.seeds, target.tokens)


def check(target: Target, data: bytes) -> str | None:
    """None, or the signature of a crash (exception type and the line that raised it) on `data`."""
    try:
        target.run(data)
    except target.allowed:
        return None
    except Exception as exc:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        return f"{type(exc).__name__} at {Path(frame.filename).name}:{frame.lineno}: {str(exc)[:100]}"
    return None
