"""The reference engine's device slot, seen the way the NVML collector shows a GPU.

The correlation engine computes fetch stall from GPU busy/idle intervals (`gpus()` and
`recent_samples(gpu)`: wall-clock (start, end, busy_fraction), as collectors/gpu/nvml.py offers
them). Without a GPU, the reference engine's single device slot plays that part: its compute
intervals are busy (1.0), the gaps between them idle (0.0). This is exact where NVML gives ~1/6 s
samples of a busy percentage; the arithmetic downstream is the same.
"""

from __future__ import annotations

from collections.abc import Callable


class DeviceSamples:
    def __init__(self, intervals: Callable[[], list[tuple[float, float]]], since: float,
                 wall: Callable[[], float], label: str = "reference0", uuid: str = "reference-device-0") -> None:
        self._intervals, self._since, self._wall = intervals, since, wall
        self.label, self.uuid = label, uuid

    def gpus(self) -> dict[str, str]:
        return {self.label: self.uuid}

    def recent_samples(self, gpu: str) -> list[tuple[float, float, float]]:
        if gpu not in (self.label, self.uuid):
            return []
        out: list[tuple[float, float, float]] = []
        t = self._since
        for start, end in sorted(self._intervals()):
            if end <= t:
                continue
            if start > t:
                out.append((t, start, 0.0))
            out.append((max(start, t), end, 1.0))
            t = end
        now = self._wall()
        if now > t:
            out.append((t, now, 0.0))
        return out
