"""The what-if models: the exclusive hierarchy is the LRU stack against cumulative sizes; the inclusive one
replays the reference tier store; pins, the prefix rule, sampling, sizes."""

from __future__ import annotations

import random
from collections import OrderedDict
from pathlib import Path

import pytest

from kvscope.agent.analyses.whatif.hierarchy import MISS, Chains, Hierarchy, scaled_capacities
from kvscope.agent.analyses.whatif.sizes import Geometry, parse_size, scaled_scenarios, scenario
from kvscope.agent.core.tiers import Tier
from kvscope.agent.tools.reference.blocks import chain_blocks
from kvscope.agent.tools.reference.scenarios import prefix_order
from kvscope.agent.tools.reference.tierstore import TieredStore, TierSpec
from kvscope.collectors.kv_events.reuse import REUSE_BOUNDS, ReuseTracker


def stack_distances(keys: list[int]) -> list[int | None]:
    """LRU stack distance of each access the obvious way (None: first use)."""
    stack: OrderedDict[int, None] = OrderedDict()
    out: list[int | None] = []
    for k in keys:
        if k in stack:
            order = list(stack)
            out.append(len(order) - 1 - order.index(k))
            stack.move_to_end(k)
        else:
            out.append(None)
            stack[k] = None
    return out


def zipf_trace(n: int, blocks: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    weights = [1 / (i + 1) for i in range(blocks)]
    return rng.choices(range(1, blocks + 1), weights, k=n)


@pytest.mark.parametrize("caps", [(8, 16, 32, 0), (20, 0, 40, 100), (5, 5, 5, 5), (0, 30, 0, 60)])
def test_exclusive_tiers_are_the_stack_distance_against_cumulative_sizes(caps: tuple[int, ...]) -> None:
    keys = zipf_trace(4000, 300, seed=sum(caps))
    model = Hierarchy(caps, "exclusive")
    cumulative = [sum(caps[:i + 1]) for i in range(4)]
    for key, d in zip(keys, stack_distances(keys), strict=True):
        expected = MISS if d is None else next((i for i, c in enumerate(cumulative) if d < c and caps[i]), MISS)
        assert model.access_batch([key]) == [expected]


def test_the_reuse_histogram_answers_the_exclusive_curve_at_its_bounds() -> None:
    """The PromQL of docs/whatif.md: with every block tracked, hits of a cache of b + 1 blocks = bucket{le=b}."""
    keys = zipf_trace(5000, 2000, seed=3)
    tracker = ReuseTracker(100_000)
    tracker.use_many(keys)
    buckets, _, _ = tracker.cumulative()
    for bound, count in buckets[:12]:
        model = Hierarchy((int(bound) + 1, 0, 0, 0), "exclusive")
        hits = sum(o == 0 for o in model.access_batch(keys[:1]) + [model.access(k) for k in keys[1:]])
        assert hits == count, bound
    assert REUSE_BOUNDS[1] == 1.0


def replay_with_the_reference_store(tmp_path: Path, caps: tuple[int, int, int, int], prompts: list[list[int]],
                                    block_tokens: int) -> tuple[list[int], list[int]]:
    """Blocks served per tier (G1..G4, computed) by the reference tier store driven as its engine drives it,
    and by the inclusive model fed what the engine's KV events show: a request's found run in one batch, its
    computed blocks in the next."""
    specs = {Tier.G1: TierSpec(caps[0]), Tier.G2: TierSpec(caps[1]),
             Tier.G3: TierSpec(caps[2], path=tmp_path / "g3"), Tier.G4: TierSpec(caps[3], path=tmp_path / "g4")}

    class Quiet:
        def transfer(self, t: object) -> None: ...
        def block_event(self, e: object) -> None: ...
        def error(self, tier: Tier, kind: str) -> None: raise AssertionError(kind)

    store = TieredStore(block_tokens, 64, specs, Quiet(), write_behind=0)
    model, chains = Hierarchy(caps, "inclusive"), Chains(1 << 16)
    order = (Tier.G1, Tier.G2, Tier.G3, Tier.G4)
    counts = [0] * 5
    for tokens in prompts:
        blocks = chain_blocks(tokens, block_tokens)
        tiers = store.lookup(blocks[:(len(tokens) - 1) // block_tokens])
        fetched = store.fetch(blocks[:len(tiers)], tiers)
        computed = blocks[fetched.loaded:]
        store.reserve(sum(not store.holds(Tier.G1, b.key) for b in computed))
        for b in computed:
            store.put_computed(b)
        store.release()
        for t in tiers:
            counts[order.index(t)] += 1
        counts[MISS] += len(blocks) - len(tiers)
        keys = [b.key for b in blocks]
        for batch in (keys[:len(tiers)], keys[len(tiers):]):
            model.access_batch(batch, chains.links(batch))
    return counts, model.counts


@pytest.mark.parametrize("caps", [(96, 128, 96, 0), (192, 128, 96, 0), (96, 0, 96, 0), (64, 128, 128, 0),
                                  (64, 0, 128, 0), (48, 0, 0, 200)])
def test_the_inclusive_model_serves_what_the_reference_tier_store_serves(tmp_path: Path,
                                                                        caps: tuple[int, int, int, int]) -> None:
    """Measured gap on this workload (tiers of 3-12 prompts): 0.6 points at most; without the prefix rule it
    was up to 1.9, without pins 3."""
    prompts = prefix_order(160, seed=0, active=16, documents=24)
    truth, model = replay_with_the_reference_store(tmp_path, caps, prompts, 32)
    total = sum(truth)
    for tier in range(5):
        assert abs(model[tier] - truth[tier]) / total <= 0.01, (tier, model, truth)


def test_a_batch_is_pinned_while_it_runs() -> None:
    model = Hierarchy((2, 0, 0, 0), "inclusive")
    model.access_batch([1, 2])
    # 3 needs room: LRU would evict 1, which this batch uses next; pinned, 2 goes instead... also pinned, so
    # 3 cannot stay: the engine keeps the request's own blocks
    assert model.access_batch([1, 2, 3]) == [0, 0, MISS]
    assert set(model.tiers[0]) == {1, 2}


def test_past_a_missing_block_the_rest_of_the_prompt_is_computed() -> None:
    """An LRU tier loses a prefix's first block first: the rest is still there but cannot be used."""
    model, chains = Hierarchy((3, 0, 4, 0), "inclusive"), Chains(100)
    prefix = [1, 2, 3]
    model.access_batch(prefix, chains.links(prefix))
    model.access_batch([4, 5, 6], chains.links([4, 5, 6]))  # the prefix goes down to G3
    for k in (7, 8):  # G3 (4 blocks) fills up: 1, the oldest, is dropped; 2 and 3 stay
        model.access_batch([k], chains.links([k]))
    assert 1 not in model.tiers[2] and 2 in model.tiers[2]
    assert model.access_batch(prefix, chains.links(prefix)) == [MISS, MISS, MISS]
    assert chains.links([9, 2]) == [False, False]  # 2 came after 1, not 9: another request's order is not a link


def test_capacities_scale_with_the_sample_and_are_cut_to_what_a_model_holds() -> None:
    assert scaled_capacities([1600, 3200, 0, 10**9], 1 / 16, 1000) == ([100, 200, 0, 700], True)
    assert scaled_capacities([10, 20, 30, 40], 1.0, 1000) == ([10, 20, 30, 40], False)


def test_a_g1_that_keeps_nothing_passes_blocks_down() -> None:
    model = Hierarchy((0, 0, 0, 10), "inclusive")
    assert model.access_batch([1]) == [MISS] and 1 in model.tiers[3]
    assert model.access_batch([1]) == [3]


def test_sizes() -> None:
    geo = Geometry(block_tokens=16, bytes_per_token=36_864)
    assert parse_size("2x").blocks(1000, geo) == 2000
    assert parse_size("0.5×").blocks(1000, geo) == 500
    assert parse_size("0").blocks(1000, geo) == 0
    assert parse_size("4096 blocks").blocks(None, geo) == 4096
    assert parse_size("1.6M tokens").blocks(None, geo) == 100_000
    assert parse_size("19.6GiB").blocks(None, geo) == int(19.6 * 2**30) // (16 * 36_864)
    assert parse_size("983TB").blocks(None, geo) == 983 * 10**12 // (16 * 36_864)
    for bad in ("2 GiBx", "fast", "-1GiB", "3 apples"):
        with pytest.raises(ValueError):
            parse_size(bad)
    with pytest.raises(ValueError, match="today's size"):
        parse_size("2x").blocks(None, geo)
    with pytest.raises(ValueError, match="bytes per token"):
        parse_size("1GiB").blocks(None, Geometry(16, 0))
    assert [s.name for s in scaled_scenarios([0.5, 2], [10, 0, 5, None])] == ["G1x0.5", "G1x2", "G3x0.5", "G3x2"]
    assert scenario("no-g2", {"G2": "0"}).blocks([10, 20, None, 5], geo) == [10, 0, 0, 5]
