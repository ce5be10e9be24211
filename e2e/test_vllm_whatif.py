"""What-if proven on the live engine: G1 hit shares predicted at 2x and 4x of G1 from one run, against
re-runs of the same seeded workload (one request at a time) with G1 at 2x and 4x (--num-gpu-blocks-override).

The run that predicts samples every block (reuse_sample_rate = 1): at the default 1/16 this working set
(a few hundred blocks) is too small a sample, which `kvscope what-if` says (tests/agent/analyses/whatif)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from kvscope.agent.analyses.whatif.commands import fetch
from kvscope.agent.analyses.whatif.predict import replay
from kvscope.agent.analyses.whatif.profile import loads
from kvscope.agent.analyses.whatif.sizes import scenario
from testkit.live_vllm import SMALL_G1_BLOCKS, scrape, settled, stream, total

POINTS = 0.03  # the bar: within 3 points of the re-run's measured G1 share


def workload() -> list[str]:
    """Eight shared prefixes of ~500 tokens (~16 blocks each) continued, chosen with a skew: more than 64
    blocks of G1 can hold, less than 256 can."""
    rng = random.Random(11)
    stems = [" ".join(f"word{rng.randrange(2000)} alpha" for _ in range(150)) for _ in range(8)]
    weights = [1 / (i + 1) for i in range(len(stems))]
    return [rng.choices(stems, weights)[0] + " " + " ".join(f"word{rng.randrange(2000)}" for _ in range(
        rng.randrange(5, 40))) for _ in range(48)]


def g1_share(live: Any) -> float:
    """Drives the workload with the full report; the engine's own G1 hit share of it (hits / queries)."""
    engine, _ = settled(live, "kvscope_ttft_seconds_count", "vllm:time_to_first_token_seconds_count")
    hits0, queries0 = total(engine, "vllm:prefix_cache_hits_total"), total(engine, "vllm:prefix_cache_queries_total")
    for prompt in workload():
        stream(live, prompt, full_report=True)
    engine, _ = settled(live, "kvscope_ttft_seconds_count", "vllm:time_to_first_token_seconds_count")
    queries = total(engine, "vllm:prefix_cache_queries_total") - queries0
    return (total(engine, "vllm:prefix_cache_hits_total") - hits0) / queries


def test_g1_predictions_at_2x_and_4x_match_the_re_runs(launcher: Callable[..., Any]) -> None:
    with launcher("whatif-1x", gpu_blocks=SMALL_G1_BLOCKS, max_model_len=1024, reuse_sample_rate=1.0) as base:
        measured = g1_share(base)
        scrape(base.agent_url)  # the agent has collected the last window (settled above)
        (profile,) = loads(fetch(base.agent_url))
        today, x2, x4 = replay(profile, [scenario("G1x2", {"G1": "2x"}), scenario("G1x4", {"G1": "4x"})])
    rerun = {}
    for factor in (2, 4):
        with launcher(f"whatif-{factor}x", gpu_blocks=factor * SMALL_G1_BLOCKS, max_model_len=1024) as run:
            rerun[factor] = g1_share(run)
    print(f"G1 share: 1x measured {measured:.3f} (model {today.model_shares[0]:.3f}); "
          f"2x predicted {x2.shares[0]:.3f}, re-run {rerun[2]:.3f}; 4x predicted {x4.shares[0]:.3f}, "
          f"re-run {rerun[4]:.3f}; {profile.distinct_sampled} distinct blocks sampled")
    assert not profile.sample_too_small
    assert rerun[4] > rerun[2] > measured  # the workload does tell the sizes apart
    assert abs(x2.shares[0] - rerun[2]) <= POINTS, (x2.shares, rerun)
    assert abs(x4.shares[0] - rerun[4]) <= POINTS, (x4.shares, rerun)
