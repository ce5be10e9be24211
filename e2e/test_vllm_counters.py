"""kvscope against a live vLLM's own counters: what the sidecar exports equals what the engine counted."""

from __future__ import annotations

import json
import random
import time
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
                     "application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;q=0.4,"
                     "text/plain;version=0.0.4;q=0.3,*/*;q=0.2")


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    request = urllib.request.Request(f"{url}/metrics", headers={"Accept": PROMETHEUS_ACCEPT})
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    out = {}
    for family in text_string_to_metric_families(text.replace("# EOF\n", "")):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(page: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return sum(v for (n, lab), v in page.items() if n == name and all((k, x) in lab for k, x in labels.items()))


def prompts(seed: int, count: int) -> list[str]:
    """Histories continued: each prompt extends one of a few shared prefixes, so prefix caching hits."""
    rng = random.Random(seed)
    stems = [" ".join(f"word{rng.randrange(2000)} alpha" for _ in range(150)) for _ in range(3)]
    return [rng.choice(stems) + " " + " ".join(f"word{rng.randrange(2000)}" for _ in range(rng.randrange(5, 60)))
            for _ in range(count)]


def stream(live: Any, prompt: str, full_report: bool = False) -> float:
    """One streaming completion, as a benchmark client sends it; returns the client's TTFT. `full_report`:
    ask vLLM to re-announce the cached blocks it reuses (kv_cache_report_mode=full)."""
    body: dict[str, Any] = {"model": live.model, "prompt": prompt, "max_tokens": 4, "stream": True,
                            "ignore_eos": True}
    if full_report:
        body["vllm_xargs"] = {"kv_cache_report_mode": "full"}
    request = urllib.request.Request(f"{live.engine_url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    start = time.monotonic()
    first = None
    with urllib.request.urlopen(request, timeout=60) as response:
        for line in response:
            if first is None and line.startswith(b"data: {"):
                first = time.monotonic() - start
    assert first is not None
    return first


Page = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def settled(live: Any, name: str, engine_name: str) -> tuple[Page, Page]:
    """Both pages once the agent has caught up with the engine's counter (two scrape intervals at most)."""
    deadline = time.monotonic() + 15
    while True:
        engine, agent = scrape(live.engine_url), scrape(live.agent_url)
        if total(agent, name) == total(engine, engine_name) or time.monotonic() > deadline:
            return engine, agent
        time.sleep(0.5)


def test_counters_equal_the_engines_own(live: Any) -> None:
    check_counters(live, seed=1, count=24)


def check_counters(live: Any, seed: int, count: int) -> tuple[Page, Page]:
    """Drives `count` requests one at a time and holds kvscope's page to the engine's; returns both pages."""
    for prompt in prompts(seed=seed, count=count):
        stream(live, prompt)
    engine, agent = settled(live, "kvscope_ttft_seconds_count", "vllm:time_to_first_token_seconds_count")
    pairs = [
        ("kvscope_kv_lookup_tokens_total", "vllm:prefix_cache_queries_total"),
        ("kvscope_prompt_tokens_total", "vllm:prompt_tokens_total"),
        ("kvscope_ttft_seconds_count", "vllm:time_to_first_token_seconds_count"),
        ("kvscope_ttft_seconds_sum", "vllm:time_to_first_token_seconds_sum"),
        ("kvscope_queue_time_seconds_count", "vllm:request_queue_time_seconds_count"),
        ("kvscope_queue_time_seconds_sum", "vllm:request_queue_time_seconds_sum"),
        ("kvscope_prefill_time_seconds_count", "vllm:request_prefill_time_seconds_count"),
        ("kvscope_prefill_time_seconds_sum", "vllm:request_prefill_time_seconds_sum"),
    ]
    for ours, theirs in pairs:
        assert total(agent, ours) == total(engine, theirs), (ours, total(agent, ours), theirs, total(engine, theirs))
    assert total(engine, "vllm:prefix_cache_hits_total") > 0  # the prompts share prefixes
    assert total(agent, "kvscope_kv_hit_tokens_total", tier="G1") == total(engine, "vllm:prefix_cache_hits_total")
    assert total(engine, "vllm:time_to_first_token_seconds_count") == count
    # KV events: none lost, malformed or dropped; resident G1 blocks as stored − removed, used bytes from them
    for fault in ("missed", "malformed", "dropped"):
        assert total(agent, f"kvscope_kv_events_{fault}_total") == 0, fault
    resident = total(agent, "kvscope_kv_resident_blocks", tier="G1")
    stored = total(agent, "kvscope_kv_events_total", type="BlockStored")
    gpu_blocks = float(next(dict(lab)["num_gpu_blocks"] for (n, lab) in engine if n == "vllm:cache_config_info"))
    assert 0 < resident <= gpu_blocks and stored > 0
    assert total(agent, "kvscope_tier_used_bytes", tier="G1") == resident * live.block_tokens * live.kv_bytes_per_token
    return engine, agent


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
