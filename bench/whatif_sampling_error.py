"""How far the what-if analysis' SHARDS-sampled predictions are from exact ones, and what its models cost.

A workload of conversations over shared documents and system prompts (prefix_order), at vLLM's 16-token
blocks and gpt-oss-120b's 36,864 B/token, is replayed once with every block (rate 1) and once with the blocks
whose hash is below R × 2**64 (R = 1/4, 1/16, 1/64), capacities scaled by R, at today's sizes and at five
scenarios. The engine's counters (today's hit tokens per tier) are stood in for by the exact replay's.
Reported, for both estimators: the largest difference of any tier's predicted served share between the
sampled and the exact replay, over the scenarios, worst of the seeds. "model" is each model's own count
scaled by 1/R (the exported kvscope_whatif_hit_tokens_total); "anchored" moves the engine's measured tokens
by the sampled transport (what `kvscope what-if` prints). Also: time per sampled access, memory per block.

Run: .venv/bin/python bench/whatif_sampling_error.py   (about two minutes on 2 cores)
"""

from __future__ import annotations

import sys
import time
import tracemalloc
from array import array
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "lib"))  # testkit; kvscope itself is installed

from kvscope.agent.analyses.whatif.hierarchy import Chains, Hierarchy
from kvscope.agent.analyses.whatif.predict import replay
from kvscope.agent.analyses.whatif.profile import Measured, StreamProfile
from kvscope.agent.analyses.whatif.sizes import scenario
from kvscope.agent.tools.reference.blocks import chain_blocks
from kvscope.agent.tools.reference.scenarios import prefix_order

BLOCK_TOKENS = 16
BYTES_PER_TOKEN = 36_864
RATES = (1 / 4, 1 / 16, 1 / 64)
SEEDS = (0, 1, 2, 3)
SCENARIOS = [scenario("G1x0.5", {"G1": "0.5x"}), scenario("G1x2", {"G1": "2x"}), scenario("G1x4", {"G1": "4x"}),
             scenario("no-G2", {"G2": "0"}), scenario("G3x0.25", {"G3": "0.25x"})]


def workload(seed: int) -> tuple[list[list[int]], int]:
    """Per request the keys of its 16-token blocks, and the tokens looked up."""
    prompts = prefix_order(1500, seed, systems=4, system_tokens=512, documents=300, document_tokens=(256, 2048),
                           question_tokens=(16, 128), answer_tokens=(64, 256), turns=(2, 8), active=48)
    return [[b.key for b in chain_blocks(p, BLOCK_TOKENS)] for p in prompts], sum(len(p) for p in prompts)


def profile(requests: list[list[int]], lookup: int, rate: float, today: list[int],
            hits: dict[str, float] | None = None) -> StreamProfile:
    threshold = round(rate * 2**64)
    trace, batches = array("Q"), array("I")
    for keys in requests:
        sampled = [k for k in keys if k < threshold]
        if sampled:
            trace.extend(sampled)
            batches.append(len(sampled))
    return StreamProfile("vllm", "gpt-oss-120b", "0", rate, BLOCK_TOKENS, BYTES_PER_TOKEN, "inclusive",
                         list(today), trace=trace, batches=batches, measured=Measured(float(lookup), hits or {}),
                         max_blocks=1 << 20)


def memory_per_block() -> tuple[float, float]:
    """Bytes a model holds per resident block, and the chain links per learnt block (traced allocations)."""
    keys = list(range(1, 200_001))
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    model = Hierarchy([len(keys), 0, 0, 0], "inclusive")
    model.access_batch(keys)
    mid = tracemalloc.take_snapshot()
    chains = Chains(1 << 20)
    chains.links(keys)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    per_model = sum(s.size_diff for s in mid.compare_to(before, "filename")) / len(keys)
    per_link = sum(s.size_diff for s in after.compare_to(mid, "filename")) / len(keys)
    return per_model, per_link


def main() -> int:
    t0 = time.perf_counter()
    worst = {(rate, kind): 0.0 for rate in RATES for kind in ("model", "anchored")}
    timing: dict[float, list[float]] = {rate: [] for rate in (1.0, *RATES)}
    for seed in SEEDS:
        requests, lookup = workload(seed)
        accesses = sum(map(len, requests))
        # today: G1 holds ~12 prompts, G2 4x G1, G3 16x G1 (a DRAM tier and a local NVMe tier)
        g1 = 12 * accesses // len(requests)
        today = [g1, 4 * g1, 16 * g1, 0]
        started = time.perf_counter()
        exact = replay(profile(requests, lookup, 1.0, today), SCENARIOS)
        timing[1.0].append((time.perf_counter() - started) / accesses)
        counters = dict(zip(("G1", "G2", "G3", "G4"), exact[0].model_hit_tokens, strict=True))
        line = [f"seed {seed}: {len(requests)} requests, {accesses:,} block accesses, G1 {g1:,} blocks"]
        for rate in RATES:
            p = profile(requests, lookup, rate, today, counters)
            started = time.perf_counter()
            sampled = replay(p, SCENARIOS)
            timing[rate].append((time.perf_counter() - started) / max(1, len(p.trace)))
            errors = {}
            for kind in ("model", "anchored"):
                errors[kind] = max(abs(a - b) for e, s in zip(exact, sampled, strict=True)
                                   for a, b in zip(e.model_shares, s.model_shares if kind == "model" else s.shares,
                                                   strict=True))
                worst[(rate, kind)] = max(worst[(rate, kind)], errors[kind])
            line.append(f"R=1/{1 / rate:.0f} model {100 * errors['model']:.2f} / anchored "
                        f"{100 * errors['anchored']:.2f} pp")
        today_exact = " ".join(f"{100 * s:.1f}" for s in exact[0].model_shares)
        print("; ".join(line) + f" (exact shares today G1..G4 %: {today_exact})")
    models = 1 + len(SCENARIOS)
    for kind in ("model", "anchored"):
        print(f"largest served-share error ({kind}) over 6 scenarios and 4 tiers, worst of {len(SEEDS)} seeds: "
              + ", ".join(f"R=1/{1 / r:.0f} {100 * worst[(r, kind)]:.2f} pp" for r in RATES))
    print("replay time per sampled access, all " + str(models) + " models: "
          + ", ".join(f"R={r:g} {1e6 * min(t):.1f} us" for r, t in timing.items()))
    per_model, per_link = memory_per_block()
    print(f"memory: {per_model:.0f} B per block a model holds; {per_link:.0f} B per learnt chain link")
    print(f"total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
