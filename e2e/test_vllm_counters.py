"""kvscope against a live vLLM's own counters: what the sidecar exports equals what the engine counted."""

from __future__ import annotations

import time
from typing import Any

from testkit.live_vllm import check_counters, prompts, scrape, settled, stream, total


def test_counters_equal_the_engines_own(live: Any) -> None:
    check_counters(live, seed=1, count=24)


def test_every_span_becomes_an_attribution_that_adds_up_to_its_ttft(live: Any) -> None:
    for prompt in prompts(seed=2, count=8):
        stream(live, prompt)
    served = total(scrape(live.engine_url), "vllm:time_to_first_token_seconds_count")  # this test's and before
    deadline = time.monotonic() + 20
    while total(agent := scrape(live.agent_url), "kvscope_requests_attributed_total") < served:
        assert time.monotonic() < deadline, "vLLM's llm_request spans did not all reach kvscope's OTLP receiver"
        time.sleep(0.5)
    assert total(agent, "kvscope_requests_attributed_total") == served  # one per request, none twice
    # the aggregate split: its components add up to vLLM's TTFT sum (less any negative remainder), once the
    # correlation engine has seen the window of the last scrape
    engine, agent = settled(live, "kvscope_ttft_seconds_count", "vllm:time_to_first_token_seconds_count")
    ttft = total(engine, "vllm:time_to_first_token_seconds_sum")
    deadline = time.monotonic() + 15
    while True:
        parts = total(agent, "kvscope_ttft_attributed_seconds_total")
        errors = total(agent, "kvscope_ttft_attribution_error_seconds_total", basis="aggregate",
                       kind="negative_remainder")
        if abs(parts - errors - ttft) <= 1e-9 * ttft or time.monotonic() > deadline:
            break
        time.sleep(0.5)
        agent = scrape(live.agent_url)
    shares = {c: total(agent, "kvscope_ttft_attributed_seconds_total", component=c) / ttft
              for c in ("frontend", "queue", "fetch", "offload", "prefill", "other")}
    print("TTFT split on the live engine:", {c: f"{100 * v:.1f} %" for c, v in shares.items()})
    assert abs(parts - errors - ttft) <= 1e-9 * ttft, (parts, errors, ttft)
    # frontend is vLLM's own TTFT less its queue and prefill time (the API server before QUEUED and on the
    # first token's way back): window by window the remainder, so over all windows, less the negative ones,
    # exactly the histograms' sums; other (what no engine timer places) stays under 10 % of TTFT
    outside = ttft - total(engine, "vllm:request_queue_time_seconds_sum") - total(
        engine, "vllm:request_prefill_time_seconds_sum")
    assert abs(shares["frontend"] * ttft - errors - outside) <= 1e-9 * ttft, (shares, errors, outside)
    assert shares["other"] < 0.10, shares


def test_full_report_reannouncements_are_counted_exactly(live: Any) -> None:
    """With kv_cache_report_mode=full vLLM stores every reused G1 block again: kvscope counts each such
    store of a resident block (not a sampled estimate), so re-announced blocks × block size equal the
    engine's own prefix-cache hits over the same requests."""
    engine, agent = settled(live, "kvscope_ttft_seconds_count", "vllm:time_to_first_token_seconds_count")
    hits0 = total(engine, "vllm:prefix_cache_hits_total")
    again0 = total(agent, "kvscope_kv_blocks_reannounced_total", tier="G1")
    for prompt in prompts(seed=3, count=12):
        stream(live, prompt, full_report=True)
    engine, agent = settled(live, "kvscope_ttft_seconds_count", "vllm:time_to_first_token_seconds_count")
    hits = total(engine, "vllm:prefix_cache_hits_total") - hits0
    deadline = time.monotonic() + 15
    while True:
        again = total(agent, "kvscope_kv_blocks_reannounced_total", tier="G1") - again0
        if again * live.block_tokens == hits or time.monotonic() > deadline:
            break
        time.sleep(0.5)
        agent = scrape(live.agent_url)
    print(f"full report: {hits:.0f} G1 hit tokens, {again:.0f} blocks re-announced")
    assert hits > 0
    assert again * live.block_tokens == hits, (again, live.block_tokens, hits)
