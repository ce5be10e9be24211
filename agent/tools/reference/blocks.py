"""Block identity: chained prefix hashes over fixed-size token blocks, as vLLM's prefix cache does.

A block's hash covers its parent's hash and its own token ids, so equal hashes mean equal prefixes up to
and including that block. The digest is SHA-256 (reproducible across processes, unlike Python's hash());
the block's key is the digest's low 64 bits, the same reduction vLLM applies before publishing KV events
(VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1), so event consumers see keys in the form they expect.
Only full blocks are hashed: a trailing partial block is never cached.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ROOT_DIGEST = b"\x00" * 32
KEY_MASK = 2**64 - 1


@dataclass(frozen=True, slots=True)
class BlockId:
    key: int  # low 64 bits of the chained digest
    parent: int | None  # the previous block's key; None for the first block of a sequence
    token_ids: tuple[int, ...]


def chain_blocks(token_ids: Sequence[int] | np.ndarray, block_tokens: int) -> list[BlockId]:
    tokens = np.asarray(token_ids, dtype=np.int64)
    out: list[BlockId] = []
    digest = ROOT_DIGEST
    parent: int | None = None
    for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
        chunk = tokens[start:start + block_tokens]
        digest = hashlib.sha256(digest + chunk.astype("<i8").tobytes()).digest()
        key = int.from_bytes(digest, "big") & KEY_MASK
        out.append(BlockId(key, parent, tuple(chunk.tolist())))  # Python ints, 10x faster than int() each
        parent = key
    return out


def stamp_block(dst: np.ndarray, template: np.ndarray, key: int) -> None:
    """Fills a block buffer with KV-sized bytes that identify the block (first and last 8 bytes = key).

    The reference engine computes no attention, so a block's "KV" is a template copy stamped with its key;
    a reader can then prove it got the block it asked for, on top of the file checksum.
    """
    np.copyto(dst, template)
    stamp = np.frombuffer(key.to_bytes(8, "little"), dtype=np.uint8)
    dst[:8] = stamp
    dst[-8:] = stamp


def block_stamp(buf: np.ndarray) -> tuple[int, int]:
    return int.from_bytes(buf[:8].tobytes(), "little"), int.from_bytes(buf[-8:].tobytes(), "little")
