"""The machine a benchmark runs on, as it is while it runs: model, cores, load, and how fast a core is now.

The 2-core development VM is shared: other jobs use its cores, and a core flips between two speeds from
second to second whatever runs in the guest (bench/machine_speed_trace.py, docs/vllm-kv-events.md). Each
bench prints `state()` at its start and end, so a figure can be read against what the machine was doing.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec

_PROBE = [msgspec.msgpack.encode([{"type": "BlockStored", "block_hashes": [i * 7919 + j], "medium": "GPU"}
                                  for j in range(32)]) for i in range(64)]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def busy_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]  # guest is in user
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def core_speed(seconds: float = 0.3) -> float:
    """Millions of small msgpack maps decoded per second on this thread now (a probe of the core's speed)."""
    decode = msgspec.msgpack.Decoder().decode
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for p in _PROBE:
            decode(p)
        n += 32 * len(_PROBE)
    return n / (time.perf_counter() - t0) / 1e6


class Load:
    """The whole machine's CPU use between two calls of `line()` (ours included)."""

    def __init__(self) -> None:
        self._busy, self._total = busy_jiffies()

    def line(self) -> str:
        busy, total = busy_jiffies()
        cores = os.cpu_count() or 1
        share = (busy - self._busy) / max(1, total - self._total) * cores
        self._busy, self._total = busy, total
        load1, load5, _ = os.getloadavg()
        return f"machine busy {share:.2f} of {cores} cores since last look, load {load1:.2f}/{load5:.2f}"


def state(load: Load | None = None) -> str:
    line = f"machine: {cpu_model()}, {os.cpu_count()} cores; core speed probe {core_speed():.2f} M maps/s"
    return line + (f"; {load.line()}" if load is not None else "")
