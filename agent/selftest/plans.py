"""The scenarios `kvscope selftest` and `kvscope demo` run, at sizes that finish in seconds on 2 cores.

shared-prompts uses every tier (G1 and G2 keep a couple of prompts each, G3 a couple more, G4 all of
them), so hits, promotions, offload cascades and background writes all happen. ttft-sweep is the
seeds' G4 test (G1 and G2 keep nothing, no G3): every warm block comes from G4.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvscope.agent.reference.engine import EngineConfig
from kvscope.agent.reference.geometry import KVGeometry, preset
from kvscope.agent.reference.scenarios import LoadResult, SweepRow, shared_prompts, ttft_sweep
from kvscope.agent.selftest.harness import Harness

SCENARIOS = ("shared-prompts", "ttft-sweep")
# 4 layers x 2 KV heads x 64 dims x fp16 = 2 KiB per token: real bytes, small files
SMALL = KVGeometry("selftest-small", 4, 2, 64, source="kvscope selftest: a small geometry so runs take seconds")


@dataclass(frozen=True, slots=True)
class SharedPromptsPlan:
    requests: int = 40
    prompts: int = 8
    concurrency: int = 4
    prompt_tokens: int = 2048
    block_tokens: int = 256
    time_scale: float = 1.0  # the seeds' cost model in real time
    model: str = ""  # a preset name; "" = the small selftest geometry
    seed: int = 0

    def base(self, data_dir: Path) -> EngineConfig:
        per_prompt = -(-self.prompt_tokens // self.block_tokens) + 1
        geometry = preset(self.model) if self.model else SMALL
        return EngineConfig(data_dir=data_dir, geometry=geometry, block_tokens=self.block_tokens,
                            g1_blocks=2 * per_prompt, g2_blocks=2 * per_prompt, g3_blocks=2 * per_prompt,
                            g4_blocks=self.prompts * per_prompt, time_scale=self.time_scale, default_max_tokens=4)

    def run(self, harness: Harness, data_dir: Path) -> tuple[LoadResult, LoadResult]:
        return shared_prompts(self.base(data_dir), self.requests, self.prompts, self.concurrency,
                              self.prompt_tokens, self.seed, engine_factory=harness.attached)


@dataclass(frozen=True, slots=True)
class SweepPlan:
    lengths: tuple[int, ...] = (256, 512, 1024, 2048, 4096)
    block_tokens: int = 64
    time_scale: float = 0.25
    model: str = ""  # a preset name; "" = the small selftest geometry
    seed: int = 0

    def run(self, harness: Harness, data_dir: Path) -> list[SweepRow]:
        geometry = preset(self.model) if self.model else SMALL
        base = EngineConfig.seeds_g4(data_dir, geometry=geometry, block_tokens=self.block_tokens, g1_blocks=1,
                                     g4_blocks=0, time_scale=self.time_scale, default_max_tokens=4)
        return ttft_sweep(base, list(self.lengths), self.seed, engine_factory=harness.attached)
