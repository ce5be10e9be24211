"""Error of the SHARDS-sampled reuse-distance histogram against the exact one (docs/vllm-kv-events.md).

For three synthetic traces of uniform 64-bit block hashes, stored in batches of 32, it runs the exact
tracker (rate 1) and sampled ones, and prints the largest absolute difference of the LRU miss-ratio
curve (1 - bucket / tracker stores) over the histogram's bounds >= MIN_BOUND, per seed.

Not part of `make bench` (bench_*.py): it takes a few minutes.
Run: .venv/bin/python bench/kv_reuse_sampling_error.py
"""

from __future__ import annotations

import bisect
import itertools
import random
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "lib"))  # testkit; kvscope itself is installed

from kvscope.collectors.kv_events.reuse import ReuseTracker

MIN_BOUND = 256.0
RATES = (1 / 4, 1 / 16, 1 / 64)
SEEDS = range(4)


def zipf_trace(seed: int, keys: int = 100_000, uses: int = 600_000, alpha: float = 0.9) -> list[int]:
    rng = random.Random(seed)
    ids = [rng.getrandbits(64) for _ in range(keys)]
    cum = list(itertools.accumulate(1 / (i + 1) ** alpha for i in range(keys)))
    return [ids[bisect.bisect_left(cum, rng.random() * cum[-1])] for _ in range(uses)]


def prefix_trace(seed: int, prefixes: int = 3000, requests: int = 25_000, system_prompt: int = 0) -> list[int]:
    """Each request re-stores [system prompt] + a Zipf(0.8)-chosen shared prefix of 4..64 blocks, then
    1..16 blocks of its own (kv_cache_report_mode=full)."""
    rng = random.Random(seed)
    system = [rng.getrandbits(64) for _ in range(system_prompt)]
    pre = [[rng.getrandbits(64) for _ in range(rng.randint(4, 64))] for _ in range(prefixes)]
    cum = list(itertools.accumulate(1 / (i + 1) ** 0.8 for i in range(prefixes)))
    out: list[int] = []
    for _ in range(requests):
        out += system + pre[bisect.bisect_left(cum, rng.random() * cum[-1])]
        out += [rng.getrandbits(64) for _ in range(rng.randint(1, 16))]
    return out


def curve(trace: list[int], rate: float) -> dict[float, float]:
    tracker = ReuseTracker(1 << 22, rate)
    for i in range(0, len(trace), 32):
        tracker.use_many(trace[i:i + 32])
    buckets, _, _ = tracker.cumulative()
    return {bound: 1 - count / tracker.estimated_uses for bound, count in buckets if bound != float("inf")}


def main() -> int:
    traces: list[tuple[str, Callable[[int], list[int]]]] = [
        ("prefix sharing, 25k requests", lambda s: prefix_trace(s)),
        ("20-block system prompt + prefixes, 12k requests", lambda s: prefix_trace(s, 2000, 12_000, 20)),
        ("Zipf 0.9 over 100k blocks, 600k stores", zipf_trace),
    ]
    print(f"max |miss-ratio error| over bounds >= {MIN_BOUND:.0f} blocks, seeds {list(SEEDS)}")
    for name, make in traces:
        errors: dict[float, list[float]] = {rate: [] for rate in RATES}
        for seed in SEEDS:
            trace = make(seed)
            exact = curve(trace, 1.0)
            for rate in RATES:
                sampled = curve(trace, rate)
                errors[rate].append(max(abs(sampled[b] - exact[b]) for b in exact if b >= MIN_BOUND))
        cells = "  ".join(f"1/{1 / r:.0f}: " + " ".join(f"{e:.3f}" for e in errs) for r, errs in errors.items())
        print(f"  {name:<50} {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
