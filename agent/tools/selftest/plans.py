"""The scenarios `kvscope selftest` and `kvscope demo` run, at sizes that finish in seconds on 2 cores.

shared-prompts uses every tier (G1 and G2 keep a couple of prompts each, G3 a couple more, G4 all of
them), so hits, promotions, offload cascades and background writes all happen. ttft-sweep is the
seeds' G4 test (G1 and G2 keep nothing, no G3): every warm block comes from G4. g1-eviction is issue
12's repro at gpt-oss-120b's real KV geometry (36,864 B/token, 9 MiB blocks), scaled in count: G1 keeps
blocks and evicts them to G2 inside the requests' steps, at concurrency 1. narrow-prompts sends prompts
of 1,650-1,800 tokens, too narrow a range for the cost model to tell a from b.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvscope.agent.tools.reference.engine import EngineConfig
from kvscope.agent.tools.reference.geometry import KVGeometry, preset
from kvscope.agent.tools.reference.scenarios import (
    LoadResult,
    SweepRow,
    cache_config,
    prompt_order,
    recompute_sweep,
    run_load,
    shared_prompts,
    ttft_sweep,
)
from kvscope.agent.tools.reference.truth import RequestTruth
from kvscope.agent.tools.selftest.harness import Harness

SCENARIOS = ("shared-prompts", "ttft-sweep", "g1-eviction", "narrow-prompts")
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


@dataclass(frozen=True, slots=True)
class EvictionPlan:
    """Issue 12's repro (`--g1 1GiB --g1-retain --g2 2GiB --g4 20GiB`, AIPerf ISL 8000, 16 requests from 8
    prompts at concurrency 1) scaled in count, not in bytes per token: G1 holds 3.5 prompts and keeps them,
    G2 7, G4 all; each warm request brings its blocks up from G2 and evicts others from G1 to G2 first."""

    requests: int = 16
    prompts: int = 8
    prompt_tokens: int = 4096
    concurrency: int = 1
    block_tokens: int = 256
    time_scale: float = 1.0
    model: str = "gpt-oss-120b"
    seed: int = 0

    def run(self, harness: Harness, data_dir: Path) -> LoadResult:
        per_prompt = -(-self.prompt_tokens // self.block_tokens)
        base = EngineConfig(data_dir=data_dir, geometry=preset(self.model), block_tokens=self.block_tokens,
                            g1_blocks=7 * per_prompt // 2, g1_retain=True, g2_blocks=7 * per_prompt,
                            g4_blocks=self.prompts * (per_prompt + 1), time_scale=self.time_scale,
                            default_max_tokens=4)
        order = prompt_order(self.requests, self.prompts, self.prompt_tokens, self.seed)
        return run_load(base, "G1 eviction", order, self.concurrency, harness.attached)


@dataclass(frozen=True, slots=True)
class NarrowPlan:
    """Prompts of lengths drawn from [min_tokens, prompt_tokens] (1,650-1,800, as in issue 12), each reused:
    the spread is too small for the cost model to separate a from b, so it must fall back to its prior's
    shape and say so. Compute at 2x the seeds' model, so the prior's scale has to be learnt."""

    requests: int = 24
    prompts: int = 8
    min_tokens: int = 1650
    prompt_tokens: int = 1800
    concurrency: int = 2
    block_tokens: int = 256
    time_scale: float = 2.0
    seed: int = 0

    def run(self, harness: Harness, data_dir: Path) -> LoadResult:
        per_prompt = -(-self.prompt_tokens // self.block_tokens) + 1
        base = EngineConfig(data_dir=data_dir, geometry=SMALL, block_tokens=self.block_tokens,
                            g1_blocks=2 * per_prompt, g2_blocks=2 * per_prompt, time_scale=self.time_scale,
                            default_max_tokens=4)
        order = prompt_order(self.requests, self.prompts, self.prompt_tokens, self.seed, self.min_tokens)
        return run_load(cache_config(base, self.prompts, self.prompt_tokens), "narrow prompts", order,
                        self.concurrency, harness.attached)


@dataclass(frozen=True, slots=True)
class DemoPlan:
    """`kvscope demo`: the seeds' two experiments at laptop scale, in the seeds' configuration (G1 and G2 keep
    nothing, every reused block comes from G4) at gpt-oss-120b's KV geometry, compute from the seeds' cost
    model in real time.

    1. TTFT against prompt length: each length recomputed on an engine without a cache, then sent cold and
       warm to the engine with G4 (the warm one fetches its KV from G4).
    2. Shared prompts: `requests` drawn from `prompts` at `concurrency`, cache starting empty (the cold fill
       included), against the same requests recomputed."""

    lengths: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384)
    requests: int = 32
    prompts: int = 4
    concurrency: int = 4
    prompt_tokens: int = 4096
    block_tokens: int = 256
    time_scale: float = 1.0
    model: str = "gpt-oss-120b"
    seed: int = 0

    def base(self, data_dir: Path) -> EngineConfig:
        geometry = preset(self.model) if self.model else SMALL
        data_dir.mkdir(parents=True, exist_ok=True)  # the harness looks up the disk it is on
        return EngineConfig.seeds_g4(data_dir, geometry=geometry, block_tokens=self.block_tokens, g1_blocks=1,
                                     g4_blocks=0, time_scale=self.time_scale, default_max_tokens=4)

    def sweep(self, harness: Harness, data_dir: Path) -> tuple[list[RequestTruth], list[SweepRow]]:
        harness.prefix = "sweep "
        lengths = list(self.lengths)
        recompute = recompute_sweep(self.base(data_dir / "recompute"), lengths, self.seed, harness.attached)
        return recompute, ttft_sweep(self.base(data_dir / "cache"), lengths, self.seed, harness.attached)

    def throughput(self, harness: Harness, data_dir: Path) -> tuple[LoadResult, LoadResult]:
        harness.prefix = "shared-prompts "
        return shared_prompts(self.base(data_dir), self.requests, self.prompts, self.concurrency, self.prompt_tokens,
                              self.seed, engine_factory=harness.attached)
