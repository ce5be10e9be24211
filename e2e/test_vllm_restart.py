"""A vLLM restart mid-run: kvscope sees it as a restart (its counters reset, its KV-event publisher starts
again) and nothing it exports goes backwards or negative; the TTFT count is both lives' together."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from testkit.live_vllm import prompts, scrape, settled, stream, total

MONOTONIC = ("counter", "histogram")  # what must never go backwards


def test_a_restart_is_seen_and_nothing_goes_backwards(launcher: Callable[..., Any]) -> None:
    with launcher("restart") as live:
        for prompt in prompts(seed=4, count=8):
            stream(live, prompt)
        engine, _ = settled(live, "kvscope_ttft_seconds_count", "vllm:time_to_first_token_seconds_count")
        first_life = total(engine, "vllm:time_to_first_token_seconds_count")
        before = scrape(live.agent_url, MONOTONIC)
        live.restart()
        for prompt in prompts(seed=5, count=8):
            stream(live, prompt)
        second_life = total(scrape(live.engine_url), "vllm:time_to_first_token_seconds_count")
        deadline = time.monotonic() + 20
        while True:
            agent = scrape(live.agent_url)
            done = (total(agent, "kvscope_ttft_seconds_count") == first_life + second_life
                    and total(agent, "kvscope_kv_publisher_restarts_total") >= 1)
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        after = scrape(live.agent_url, MONOTONIC)
    assert second_life == 8 and first_life >= 8  # the engine's own count started again
    assert total(agent, "kvscope_ttft_seconds_count") == first_life + second_life
    assert total(agent, "kvscope_source_resets_total") >= 1  # its counters went back: taken as a reset
    assert total(agent, "kvscope_kv_publisher_restarts_total") >= 1  # its KV-event sequence started again
    for fault in ("missed", "malformed"):
        assert total(agent, f"kvscope_kv_events_{fault}_total") == 0, fault
    backwards = {k: (before[k], v) for k, v in after.items() if k in before and v < before[k]}
    assert not backwards, backwards
    negative = {k: v for k, v in after.items() if v < 0}
    assert not negative, negative
