"""A deterministic word-level tokenizer, so the same text always gives the same token ids.

Pieces are runs of word characters or single punctuation marks (closer to BPE counts than bytes or
whitespace words); a piece's id is its CRC-32 folded into a 200k vocabulary, the size of gpt-oss's
o200k. Chat messages are rendered "role: content" one per line, so a shared system prompt is a shared
token prefix, as with a real chat template. Output text is a fixed cycle of words.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Mapping

VOCAB = 200_000
_PIECE = re.compile(r"\w+|[^\w\s]")
_WORDS = ("the", "cache", "holds", "blocks", "of", "keys", "and", "values", "for", "reuse")


def encode(text: str) -> list[int]:
    return [zlib.crc32(p.encode()) % VOCAB for p in _PIECE.findall(text)]


def render_chat(messages: Iterable[Mapping[str, object]]) -> str:
    parts = []
    for m in messages:
        content = m.get("content") or ""  # null: an assistant turn that only called tools
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        parts.append(f"{m.get('role', 'user')}: {content}")
    return "\n".join(parts) + "\nassistant:"


def output_piece(i: int) -> str:
    return (" " if i else "") + _WORDS[i % len(_WORDS)]
