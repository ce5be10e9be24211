"""The what-if analysis' options (`[analyses.whatif]`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvscope.agent.analyses.whatif.hierarchy import POLICIES, TIERS
from kvscope.agent.analyses.whatif.sizes import parse_size, scenario


@dataclass
class WhatIfOptions:
    # how the engine's tiers hold copies (hierarchy.py): "inclusive" keeps a block's lower copy when it is
    # promoted (the reference engine, vLLM's CPU offload, LMCache, KVBM); "exclusive" moves it
    policy: str = "inclusive"
    # each tier of known size, at each of these multiples of today's size: the exported scenarios G1x0.5, ...
    scales: list[float] = field(default_factory=lambda: [0.5, 2.0, 4.0])
    # more scenarios by name: {"no-G2" = {G2 = "0"}, "big-G4" = {G4 = "1PB"}}; sizes as `kvscope what-if` takes
    scenarios: dict[str, dict[str, str]] = field(default_factory=dict)
    # today's size of tiers the engine does not report (G3, G4 on vLLM): {G3 = "2TiB", G4 = "983TB"}; a size
    # here also overrides the engine's
    tier_sizes: dict[str, str] = field(default_factory=dict)
    # sampled blocks one model may hold (each scenario is one model): at sample rate R it sees reuse up to
    # this / R blocks apart
    max_model_blocks: int = 1 << 15
    # sampled accesses kept for `kvscope what-if` (the profile's trace; 8 bytes each)
    trace_blocks: int = 1 << 18
    # sampled accesses waiting between the collector and this analysis (beyond: dropped and counted)
    queue_blocks: int = 1 << 16
    # the latest attributed requests the TTFT prediction replays (and the profile carries)
    requests: int = 1024
    # where to write the profile (`kvscope what-if --recording FILE` reads it); "" = not written
    recording: str = ""
    recording_interval: float = 60.0  # seconds between two writes of the recording

    def validate(self, path: str) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy: expected one of {', '.join(POLICIES)}, got {self.policy!r}")
        for scale in self.scales:
            if not scale >= 0:
                raise ValueError(f"scales: must be >= 0, got {scale}")
        for name, sizes in self.scenarios.items():
            if name == "today":
                raise ValueError("scenarios: 'today' is the name of today's sizes")
            scenario(name, sizes)
        for tier, text in self.tier_sizes.items():
            if tier not in TIERS:
                raise ValueError(f"tier_sizes.{tier}: unknown tier (G1, G2, G3, G4)")
            if parse_size(text).unit == "x":
                raise ValueError(f"tier_sizes.{tier}: today's size cannot be relative to itself")
        for name in ("max_model_blocks", "trace_blocks", "queue_blocks", "requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.recording_interval <= 0:
            raise ValueError("recording_interval must be > 0")
