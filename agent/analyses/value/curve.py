"""The arithmetic of value, as pure functions (docs/value.md has the formulas and an example).

A tier's curve is the what-if's predicted GPU-seconds saved per hour at each size it explores: today's and
each scale of today's (`G4x2`, `G4x0.5`). The next step is today -> the smallest scale above 1, the last
step the largest scale below 1 -> today. With prices, a size costs size / GiB x its GiB-month price / 730
per hour, and the GPU time it saves is worth GPU-seconds / 3600 x the GPU-hour price; the break-even size is
the explored size where value less cost is largest.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

HOURS_PER_MONTH = 730.0  # 365 x 24 / 12
GIB = float(2**30)
_SCALED = re.compile(r"^(G[1-4])x(\d+(?:\.\d*)?)$")


def scale_of(scenario: str, tier: str) -> float | None:
    """k of the what-if's scaled scenario `{tier}x{k}`; None for any other scenario."""
    m = _SCALED.match(scenario)
    return float(m[2]) if m and m[1] == tier else None


@dataclass(frozen=True, slots=True)
class Step:
    tier: str
    step: str  # "next" | "last"
    scenario: str  # the scaled scenario at the other end of the step from today
    size_change: float | None  # bytes added (next) or removed (last); None without the sizes
    saved: float  # GPU-seconds (per hour, or per request: as given) the step would save (next) or saves (last)


def steps(tier: str, saved: Mapping[str, float], sizes: Mapping[str, float]) -> list[Step]:
    """The next and last steps of `tier` from the what-if's GPU-seconds saved per hour by scenario (`saved`,
    `today` among them) and the tier's size in each (`sizes`, bytes)."""
    if "today" not in saved:
        return []
    scaled = {k: name for name in saved if (k := scale_of(name, tier)) is not None}
    out = []
    up = [k for k in scaled if k > 1]
    down = [k for k in scaled if k < 1]
    for step, pick, sign in (("next", min(up) if up else None, 1.0), ("last", max(down) if down else None, -1.0)):
        if pick is None:
            continue
        name = scaled[pick]
        change = (sign * (sizes[name] - sizes["today"]) if name in sizes and "today" in sizes else None)
        out.append(Step(tier, step, name, change, sign * (saved[name] - saved["today"])))
    return out


def hourly_cost(size_bytes: float, gib_month: float, moved_gb_per_hour: float = 0.0, gb_price: float = 0.0) -> float:
    return size_bytes / GIB * gib_month / HOURS_PER_MONTH + moved_gb_per_hour * gb_price


def gpu_value(gpu_seconds_per_hour: float, gpu_hour: float) -> float:
    return gpu_seconds_per_hour / 3600.0 * gpu_hour


def breakeven(curve: list[tuple[float, float]], gpu_hour: float, gib_month: float) -> tuple[float, bool] | None:
    """(size, beyond) of the explored size where value − cost is largest; beyond: it is the largest explored,
    so the break-even may lie further. `curve`: (bytes, GPU-seconds saved per hour) per explored size."""
    if len(curve) < 2:
        return None
    net = [(gpu_value(saved, gpu_hour) - hourly_cost(size, gib_month), size) for size, saved in curve]
    best = max(net)[1]
    return best, best >= max(size for size, _ in curve)


def token_cost(bytes_per_token: float, bandwidth: float | None, hourly: float, tokens_per_hour: float,
               gpu_hour: float, gpus: float) -> float | None:
    """Cost of serving one prompt token from a tier: its fetch as GPU time plus the tier's cost per hour over
    the tokens it served per hour (None when it served none)."""
    if tokens_per_hour <= 0:
        return None
    fetch = bytes_per_token / bandwidth if bandwidth else 0.0
    return fetch * gpus * gpu_hour / 3600.0 + hourly / tokens_per_hour


def recompute_token_cost(a: float, b: float, tokens: float, gpu_hour: float, gpus: float) -> float:
    """compute(n, 0) / n of GPU time at the GPU-hour price, n the typical reused prefix."""
    return (a + b * tokens) * gpus * gpu_hour / 3600.0


Key = tuple[str, tuple[str, ...]]


class Rates:
    """Per-hour rates of cumulative totals over a sliding window of wall time (the oldest snapshot still in the
    window against the newest)."""

    def __init__(self, window: float) -> None:
        self._window = window
        self._snapshots: deque[tuple[float, dict[Key, float]]] = deque()

    def add(self, now: float, totals: dict[Key, float]) -> None:
        self._snapshots.append((now, totals))
        while len(self._snapshots) > 2 and self._snapshots[1][0] <= now - self._window:
            self._snapshots.popleft()

    def series(self) -> list[Key]:
        return list(self._snapshots[-1][1]) if self._snapshots else []

    @property
    def span(self) -> float:
        return self._snapshots[-1][0] - self._snapshots[0][0] if self._snapshots else 0.0

    def growth(self, key: Key) -> float | None:
        if self.span <= 0:
            return None
        first, last = self._snapshots[0][1], self._snapshots[-1][1]
        if key not in last:
            return None
        return last[key] - first.get(key, 0.0)

    def per_hour(self, key: Key) -> float | None:
        grown = self.growth(key)
        return None if grown is None else grown / self.span * 3600.0
