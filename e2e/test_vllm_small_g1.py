"""G1 forced small (--num-gpu-blocks-override): vLLM evicts, and kvscope's residency follows its events."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

_spec = importlib.util.spec_from_file_location("e2e_counters", Path(__file__).with_name("test_vllm_counters.py"))
assert _spec is not None and _spec.loader is not None
counters = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(counters)


def test_counters_hold_while_g1_evicts(small_live: Any) -> None:
    engine, agent = counters.check_counters(small_live, seed=3, count=24)
    removed = counters.total(agent, "kvscope_kv_events_total", type="BlockRemoved")
    assert removed > 0, "G1 was forced small, so vLLM must have evicted blocks"
    gpu_blocks = float(next(dict(lab)["num_gpu_blocks"] for (n, lab) in engine if n == "vllm:cache_config_info"))
    assert gpu_blocks == 64
