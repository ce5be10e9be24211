"""From outcomes to shares and TTFT: the arithmetic on cases worked by hand, and the profile format."""

from __future__ import annotations

from array import array

import pytest

from kvscope.agent.analyses.whatif.hierarchy import MISS
from kvscope.agent.analyses.whatif.predict import Outcomes, offload_ratio, predict_ttft, replay, transport
from kvscope.agent.analyses.whatif.profile import (
    MIN_DISTINCT_SAMPLED,
    Cost,
    Measured,
    RequestSample,
    StreamProfile,
    TierFetch,
    dumps,
    loads,
)
from kvscope.agent.analyses.whatif.report import header
from kvscope.agent.analyses.whatif.sizes import scenario
from kvscope.agent.tools.reference.blocks import chain_blocks
from kvscope.agent.tools.reference.scenarios import prefix_order

G2_BW = 4e9  # bytes/s
BYTES_PER_TOKEN = 36_864
COST = Cost(a=4e-5, b=0.0, confident=True, fetch={"G2": TierFetch(G2_BW), "G3": TierFetch(1e9, via="G2"),
                                                  "G4": TierFetch(None)}, store={"G2": 1e-10, "G3": None})


def outcomes(joint: dict[tuple[int, int], int]) -> Outcomes:
    o = Outcomes()
    for (today, then), n in joint.items():
        for _ in range(n):
            o.add(today, then)
    return o


def test_transport_rows_are_the_models_conditional_frequencies() -> None:
    o = outcomes({(0, 0): 10, (1, 0): 3, (1, 1): 1, (MISS, 1): 2, (MISS, MISS): 8})
    # 10 accesses of 32 tokens missed in the model; the engine recomputed 1,000 tokens (partial blocks included)
    measured = Measured(2000.0, {"G1": 500.0, "G2": 500.0})
    t = transport(o, measured, 32, 1.0, [100, 100, 0, 0])
    assert t[0] == [1, 0, 0, 0, 0] and t[1] == [0.75, 0.25, 0, 0, 0]
    assert t[MISS][1] == pytest.approx(2 * 32 / 1000) and sum(t[MISS]) == pytest.approx(1.0)
    assert t[2] == [0, 0, 0, 0, 1]  # G3 off in the scenario and never served today: its tokens are recomputed


def test_tokens_the_model_served_today_and_the_engine_recomputed_are_gained_where_the_scenario_moves_them() -> None:
    """The model served 5 accesses from G3 today, the engine 3 (96 tokens): the other 64 tokens the engine
    recomputed. The scenario moves 4 of every 5 of G3's accesses to G1, so 4/5 of those 64 become G1's hits
    beside the model's own 2 misses turned hits; the fifth stays in G3, where the engine missed it today."""
    o = outcomes({(0, 0): 10, (2, 0): 4, (2, 2): 1, (MISS, 0): 2, (MISS, MISS): 8})
    measured = Measured(1416.0, {"G1": 320.0, "G3": 96.0})  # 1,000 tokens recomputed
    t = transport(o, measured, 32, 1.0, [100, 0, 100, 0])
    assert t[MISS][0] == pytest.approx((2 * 32 + 64 * 4 / 5) / 1000)
    assert t[MISS][2] == 0 and sum(t[MISS]) == pytest.approx(1.0)


def test_ttft_moves_by_the_compute_and_fetch_of_the_tokens_that_change_tier() -> None:
    """A request of 1,000 tokens, 800 of them from G2 today; in the scenario G2 is gone and they are computed."""
    requests = [RequestSample(ttft=0.5, prompt_tokens=1000, cached_tokens=800)]
    measured = Measured(1000.0, {"G2": 800.0})
    t = [[1.0 if i == j else 0.0 for j in range(5)] for i in range(5)]
    t[1] = [0, 0, 0, 0, 1.0]
    predicted, notes = predict_ttft(requests, t, measured, COST, BYTES_PER_TOKEN, 32)
    assert predicted is not None and not notes
    fetch = 800 * BYTES_PER_TOKEN / G2_BW
    assert predicted.mean == pytest.approx(0.5 + COST.a * 800 - fetch)
    assert predicted.prefill_saved == pytest.approx(0.0)  # nothing is reused any more
    unchanged, _ = predict_ttft(requests, [[1.0 if i == j else 0.0 for j in range(5)] for i in range(5)],
                                measured, COST, BYTES_PER_TOKEN, 32)
    assert unchanged is not None and unchanged.mean == pytest.approx(0.5)
    assert unchanged.prefill_saved == pytest.approx(COST.a * 800 - fetch)


def test_a_runs_tokens_move_together_so_the_median_is_not_smeared() -> None:
    """Half of G2's runs go to G1, half are recomputed: the request is either fast or slow, never in between."""
    requests = [RequestSample(ttft=0.1, prompt_tokens=1000, cached_tokens=900)]
    t = [[1.0 if i == j else 0.0 for j in range(5)] for i in range(5)]
    t[1] = [0.5, 0, 0, 0, 0.5]
    predicted, _ = predict_ttft(requests, t, Measured(1000.0, {"G2": 900.0}), COST, BYTES_PER_TOKEN, 32)
    assert predicted is not None
    assert sorted(round(x, 6) for _, x in predicted.samples) == sorted(
        round(x, 6) for x in (0.1 - 900 * BYTES_PER_TOKEN / G2_BW, 0.1 - 900 * BYTES_PER_TOKEN / G2_BW + 900 * 4e-5))


def test_blocks_from_g3_pay_the_host_hop_too() -> None:
    requests = [RequestSample(ttft=0.2, prompt_tokens=100, cached_tokens=0)]
    t = [[1.0 if i == j else 0.0 for j in range(5)] for i in range(5)]
    t[MISS] = [0, 0, 0.5, 0, 0.5]  # half the computed tokens would come from G3
    predicted, _ = predict_ttft(requests, t, Measured(100.0, {}), COST, BYTES_PER_TOKEN, 32)
    assert predicted is not None
    fetch = 50 * BYTES_PER_TOKEN * (1 / 1e9 + 1 / G2_BW)
    assert predicted.mean == pytest.approx(0.2 - COST.a * 50 + fetch)


def test_what_was_never_measured_is_said_not_guessed() -> None:
    requests = [RequestSample(ttft=0.2, prompt_tokens=100, cached_tokens=0, offload=0.01)]
    t = [[1.0 if i == j else 0.0 for j in range(5)] for i in range(5)]
    t[MISS] = [0, 0, 0, 0.5, 0.5]
    predicted, notes = predict_ttft(requests, t, Measured(100.0, {}), COST, BYTES_PER_TOKEN, 32)
    assert predicted is None and "G4" in notes[0]
    predicted, notes = predict_ttft(requests, t, Measured(100.0, {}), COST, BYTES_PER_TOKEN, 32, offload=None)
    assert predicted is None and "never stored into" in notes[0]


def test_offload_scales_with_the_seconds_g1_s_evictions_spend_storing() -> None:
    """Today G1 evicts 100 blocks into G2 (a copy); a larger G1 evicts 25; without G2 the 100 go to G3 files,
    which cost 5x as much per byte."""
    costs: dict[str, float | None] = {"G2": 1e-10, "G3": 5e-10, "G4": None}
    today, bigger, no_g2, none = Outcomes(), Outcomes(), Outcomes(), Outcomes()
    today.stores, bigger.stores, no_g2.stores = [0, 100, 0, 0], [0, 25, 0, 0], [0, 0, 100, 0]
    assert offload_ratio(today, bigger, costs) == 0.25 and offload_ratio(today, none, costs) == 0.0
    assert offload_ratio(today, no_g2, costs) == pytest.approx(5.0)
    assert offload_ratio(none, today, costs) is None and offload_ratio(none, none, costs) == 1.0
    g4 = Outcomes()
    g4.stores = [0, 0, 0, 10]
    assert offload_ratio(today, g4, costs) is None  # never stored into G4: its cost is not guessed
    requests = [RequestSample(ttft=0.2, prompt_tokens=100, cached_tokens=0, offload=0.04)]
    identity = [[1.0 if i == j else 0.0 for j in range(5)] for i in range(5)]
    predicted, _ = predict_ttft(requests, identity, Measured(100.0, {}), COST, BYTES_PER_TOKEN, 32, offload=0.0)
    assert predicted is not None and predicted.mean == pytest.approx(0.16)  # no eviction: no offload


def profile() -> StreamProfile:
    trace = array("Q", [1, 2, 3, 1, 2, 3, 4, 1, 2, 2**64 - 1])
    return StreamProfile("vllm", "m", "0", sample_rate=1.0, block_tokens=16, bytes_per_token=BYTES_PER_TOKEN,
                         policy="inclusive", today=[2, 2, None, 0], size_sources={"G1": "engine"}, trace=trace,
                         batches=array("I", [3, 4, 3]), warmup=3,
                         measured=Measured(160.0, {"G1": 32.0, "G2": 16.0}), cost=COST,
                         requests=[RequestSample(0.1, 48, 16, 0.001), RequestSample(0.2, 64, None)],
                         notes=["G3: size unknown"], requests_per_hour=7200.0)


def test_the_profile_round_trips() -> None:
    original = profile()
    (back,) = loads(dumps([original]))
    assert back == original
    with pytest.raises(ValueError, match="format"):
        loads(b'{"format": "something else"}')
    broken = dumps([original]).replace(b'"batches":"AwAAAAQAAAADAAAA"', b'"batches":"AwAAAAQAAAA="')
    with pytest.raises(ValueError, match="add up"):
        loads(broken)


def test_replay_counts_after_the_warm_up_in_tokens_of_what_was_looked_up() -> None:
    """Worked by hand (G1 of 3 blocks, G2 of 2, inclusive): after warming up with [1 2], the steps [3 4] [1 2]
    [5 6] [1 2] [3 4] find 1 in G2 and 2 in G1 twice, everything else is computed. Without G2, 1 is gone each
    time, and so 2 is recomputed although G1 still holds it (the prefix rule)."""
    p = StreamProfile("vllm", "m", "0", sample_rate=1.0, block_tokens=16, bytes_per_token=BYTES_PER_TOKEN,
                      policy="inclusive", today=[3, 2, None, 0], trace=array("Q", [1, 2, 3, 4, 1, 2, 5, 6, 1, 2, 3, 4]),
                      batches=array("I", [2, 2, 2, 2, 2, 2]), warmup=2, measured=Measured(200.0, {}))
    today, no_g2 = replay(p, [scenario("no-g2", {"G2": "0"})])
    assert today.model_hit_tokens == [32.0, 32.0, 0.0, 0.0] and today.model_shares == [0.16, 0.16, 0.0, 0.0]
    assert no_g2.model_hit_tokens == [0.0, 0.0, 0.0, 0.0] and no_g2.blocks == [3, 0, 0, 0]
    assert today.ttft is None and "cost model" in today.notes[0]


def test_a_scenario_moves_what_the_engine_measured() -> None:
    """The same replay with the engine's counters: today predicts exactly what was measured, and without G2 the
    G2 tokens are recomputed (so are the G1 tokens that came after them), as the model says."""
    p = StreamProfile("vllm", "m", "0", sample_rate=1.0, block_tokens=16, bytes_per_token=BYTES_PER_TOKEN,
                      policy="inclusive", today=[3, 2, None, 0], trace=array("Q", [1, 2, 3, 4, 1, 2, 5, 6, 1, 2, 3, 4]),
                      batches=array("I", [2, 2, 2, 2, 2, 2]), warmup=2,
                      measured=Measured(200.0, {"G1": 30.0, "G2": 34.0}))
    today, no_g2 = replay(p, [scenario("no-g2", {"G2": "0"})])
    assert today.hit_tokens == [30.0, 34.0, 0.0, 0.0] and today.shares == [0.15, 0.17, 0.0, 0.0]
    assert no_g2.hit_tokens == [0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("seed", [0, 1])
def test_sampled_predictions_stay_near_the_exact_ones(seed: int) -> None:
    """At the default sample rate (1/16), on conversations over shared documents at vLLM's 16-token blocks and
    gpt-oss-120b's 36,864 B/token (a scenario sized in bytes): every tier's predicted share within 2 points of
    the prediction from every block (measured 0.2-0.7 here, 1.4 at worst in bench/whatif_sampling_error.py)."""
    prompts = prefix_order(600, seed, systems=4, system_tokens=512, documents=120, document_tokens=(256, 2048),
                           question_tokens=(16, 128), answer_tokens=(64, 256), turns=(2, 8), active=32)
    requests = [[b.key for b in chain_blocks(p, 16)] for p in prompts]
    lookup = float(sum(map(len, prompts)))
    g1 = 10 * sum(map(len, requests)) // len(requests)  # ten prompts
    today: list[int | None] = [g1, 4 * g1, 16 * g1, 0]
    scenarios = [scenario("G1x2", {"G1": "2x"}), scenario("no-G2", {"G2": "0"}), scenario("G3 64GiB", {"G3": "64GiB"})]

    def sampled(rate: float, hits: dict[str, float]) -> StreamProfile:
        threshold = round(rate * 2**64)
        trace, batches = array("Q"), array("I")
        for keys in requests:
            keep = [k for k in keys if k < threshold]
            if keep:
                trace.extend(keep)
                batches.append(len(keep))
        return StreamProfile("vllm", "m", "0", rate, 16, BYTES_PER_TOKEN, "inclusive", today, trace=trace,
                             batches=batches, measured=Measured(lookup, hits), max_blocks=1 << 20)

    exact = replay(sampled(1.0, {}), scenarios)
    assert exact[3].blocks[2] == 64 * 2**30 // (16 * BYTES_PER_TOKEN)
    counters = dict(zip(("G1", "G2", "G3", "G4"), exact[0].model_hit_tokens, strict=True))  # the engine's, exactly
    estimate = replay(sampled(1 / 16, counters), scenarios)
    for e, s in zip(exact, estimate, strict=True):
        for truth, predicted in zip(e.model_shares, s.shares, strict=True):
            assert abs(predicted - truth) <= 0.02, (e.scenario.name, e.model_shares, s.shares)


def test_a_sample_of_few_distinct_blocks_says_so_and_the_rate_that_would_do() -> None:
    """A working set of 320 blocks at 1/16 keeps ~20 of them: the predictions are marked low-confidence with
    the reason, and the report asks for the rate that would sample MIN_DISTINCT_SAMPLED blocks. Sampled
    every block (rate 1) nothing is said: there is no sampling error."""
    threshold = 2**64 // 16
    keys = [k * (2**64 // 320) + 12345 for k in range(320)]  # spread over the hash space, as vLLM's are
    kept = array("Q", [k for k in keys if k < threshold] * 4)
    small = StreamProfile("vllm", "m", "0", 1 / 16, 16, BYTES_PER_TOKEN, "inclusive", [64, 0, None, 0], trace=kept,
                          batches=array("I", [len(kept)]), measured=Measured(320.0 * 16 * 4, {"G1": 3.0 * 320 * 16}))
    assert small.distinct_sampled == 20 and small.sample_too_small
    assert small.rate_to_trust() == min(1.0, 1 / 16 * MIN_DISTINCT_SAMPLED / 20) == 1.0  # so small: every block
    (today,) = replay(small, [])
    assert today.confidence == "low" and any("20 distinct blocks" in n for n in today.notes)
    text = header(small)
    assert "WARNING: the sample holds only 20 distinct blocks" in text and "reuse_sample_rate = 1" in text
    whole = StreamProfile("vllm", "m", "0", 1.0, 16, BYTES_PER_TOKEN, "inclusive", [64, 0, None, 0],
                          trace=array("Q", keys * 4), batches=array("I", [4 * len(keys)]),
                          measured=Measured(320.0 * 16 * 4, {"G1": 3.0 * 320 * 16}))
    assert not whole.sample_too_small and "WARNING" not in header(whole)
    assert "sample: 320 distinct blocks" in header(whole)
