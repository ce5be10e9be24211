"""G1 forced small (--num-gpu-blocks-override): vLLM evicts, and kvscope's residency follows its events."""

from __future__ import annotations

from typing import Any

from testkit.live_vllm import SMALL_G1_BLOCKS, check_counters, total


def test_counters_hold_while_g1_evicts(small_live: Any) -> None:
    engine, agent = check_counters(small_live, seed=3, count=24)
    removed = total(agent, "kvscope_kv_events_total", type="BlockRemoved")
    assert removed > 0, "G1 was forced small, so vLLM must have evicted blocks"
    gpu_blocks = float(next(dict(lab)["num_gpu_blocks"] for (n, lab) in engine if n == "vllm:cache_config_info"))
    assert gpu_blocks == SMALL_G1_BLOCKS
