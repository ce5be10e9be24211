"""Tier sizes as an operator writes them, and the scenarios (sizes per tier) the what-if answers.

A size is relative to today's (`2x`, `0.5x`), in bytes (`64GiB`, `1.5TB`, `0`: the tier off), in
tokens (`1.14M tokens`) or in blocks (`4096 blocks`). Bytes and tokens become blocks through the KV
geometry: a block is `block_tokens` tokens of `bytes_per_token` bytes each.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvscope.agent.analyses.whatif.hierarchy import TIERS

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "p": 10**15, "pb": 10**15, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40, "pib": 2**50}
_COUNT = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}
_SIZE = re.compile(r"^\s*(?P<n>\d+(?:\.\d*)?|\.\d+)(?P<rest>[^\d.].*)?$")


@dataclass(frozen=True, slots=True)
class Geometry:
    block_tokens: int
    bytes_per_token: int

    @property
    def block_bytes(self) -> int:
        return self.block_tokens * self.bytes_per_token


@dataclass(frozen=True, slots=True)
class Size:
    """One tier's size as written: a scale of today's, or blocks, tokens or bytes."""

    value: float
    unit: str  # "x", "blocks", "tokens", "bytes"

    def blocks(self, today: int | None, geometry: Geometry | None) -> int:
        if self.unit == "x":
            if today is None:
                raise ValueError("a size relative to today's needs today's size, which is unknown")
            return round(self.value * today)
        if self.unit == "blocks":
            return round(self.value)
        if geometry is None or geometry.block_tokens <= 0:
            raise ValueError(f"a size in {self.unit} needs the KV geometry (block size and bytes per token)")
        if self.unit == "tokens":
            return math.floor(self.value / geometry.block_tokens)
        if geometry.bytes_per_token <= 0:
            raise ValueError("a size in bytes needs the KV bytes per token (vllm_kv_events.kv_bytes_per_token)")
        return math.floor(self.value / geometry.block_bytes)

    def __str__(self) -> str:
        return f"{self.value:g}x" if self.unit == "x" else f"{self.value:g} {self.unit}"


def parse_size(text: str) -> Size:
    """`2x`, `0.5×`, `64GiB`, `1.5TB`, `0`, `4096 blocks`, `1.14M tokens`."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"cannot read the size {text!r} (examples: 2x, 64GiB, 0, 4096 blocks, 1.14M tokens)")
    n, rest = float(m["n"]), (m["rest"] or "").strip().lower()
    if rest in ("x", "×"):
        return Size(n, "x")
    for kind in ("blocks", "block", "tokens", "token"):
        if rest.endswith(kind):
            unit = rest.removesuffix(kind).strip()
            if unit not in _COUNT:
                raise ValueError(f"{text!r}: counts take k, M or G, not {unit!r}")
            return Size(n * _COUNT[unit], "blocks" if kind.startswith("block") else "tokens")
    if rest not in _UNITS:
        raise ValueError(f"{text!r}: unknown unit {rest!r} (x, B, KB, MB, GB, TB, KiB, MiB, GiB, TiB, blocks, "
                         "tokens)")
    return Size(n * _UNITS[rest], "bytes")


@dataclass(frozen=True, slots=True)
class Scenario:
    """Sizes that differ from today's, by tier; the tiers it does not name keep today's size."""

    name: str
    sizes: tuple[tuple[str, Size], ...] = ()

    def blocks(self, today: Sequence[int | None], geometry: Geometry | None) -> list[int]:
        """Blocks per tier (G1..G4); a tier of unknown size that the scenario does not set is taken as off."""
        out = [t or 0 for t in today]
        for tier, size in self.sizes:
            i = TIERS.index(tier)
            out[i] = size.blocks(today[i], geometry)
        return out


TODAY = Scenario("today")


def scenario(name: str, sizes: Mapping[str, str]) -> Scenario:
    for tier in sizes:
        if tier not in TIERS:
            raise ValueError(f"{name}: unknown tier {tier!r} (G1, G2, G3, G4)")
    return Scenario(name, tuple((tier, parse_size(text)) for tier, text in sorted(sizes.items())))


def scaled_scenarios(scales: Sequence[float], today: Sequence[int | None]) -> list[Scenario]:
    """One scenario per tier with a known size above 0 and per scale: `G1x2` is G1 at twice today's size."""
    out = []
    for tier, blocks in zip(TIERS, today, strict=True):
        if not blocks:
            continue
        for scale in scales:
            out.append(Scenario(f"{tier}x{scale:g}", ((tier, Size(scale, "x")),)))
    return out


def fmt_bytes(n: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"
