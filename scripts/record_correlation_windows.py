"""Record what the correlation analysis reads, window by window, from a real reference-engine run.

The reference engine serves the seeds' G4 experiment at test scale (gpt-oss-120b's 36,864 B/token, G1 and
G2 keep nothing, every reuse from G4 block files): shared prompts, each first recomputed and then fetched
from G4, one request at a time. kvscope's own vLLM collector scrapes the engine's /metrics over HTTP every
window; what it read is written as it read it, with the wall time of the window and, at the end, the
engine's truth per request. tests/agent/analyses/correlation/test_recorded.py replays the windows into a
store and the analysis.

    .venv/bin/python scripts/record_correlation_windows.py tests/fixtures/correlation/windows/seeds_g4.json
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from kvscope.agent.app.wiring import build_agent, components
from kvscope.agent.config.settings import load_config
from kvscope.agent.core.readings import HistogramSample, Reading
from kvscope.agent.tools.reference.engine import EngineConfig
from kvscope.agent.tools.reference.openai_server import ReferenceServer
from kvscope.agent.tools.reference.scenarios import running_engine

PROMPTS, ROUNDS, PROMPT_TOKENS, SEED = 4, 3, 2048, 7


def reading_json(r: Reading) -> dict[str, Any]:
    if isinstance(r, HistogramSample):
        return {"name": r.name, "labels": list(r.labels), "buckets": [list(b) for b in r.buckets], "sum": r.sum,
                "count": r.count}
    return {"name": r.name, "labels": list(r.labels), "value": r.value}


def main(out: Path) -> int:
    rng = np.random.default_rng(SEED)
    prompts = [[int(t) for t in rng.integers(1, 50_000, PROMPT_TOKENS)] for _ in range(PROMPTS)]
    windows: list[dict[str, Any]] = []
    truths: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        config = EngineConfig.seeds_g4(Path(tmp), kv_events_endpoint=None, kv_events_replay_endpoint=None)
        with running_engine(config) as engine:
            server = ReferenceServer(engine, "127.0.0.1", 0)
            server.start()
            toml = (f"[exporters.prometheus]\nenabled = false\n[collectors.vllm]\nenabled = true\n"
                    f"urls = ['{server.url}/metrics']\nengine = 'reference'\n"
                    "cache_hit_source_tiers = { external_unspecified = 'G4' }\n")
            agent = build_agent(load_config(toml, components(), environ={}))
            vllm = agent.collectors["vllm"]

            def window() -> None:
                windows.append({"wall": time.time(), "readings": [reading_json(r) for r in vllm.collect()]})

            try:
                window()
                for _ in range(ROUNDS):
                    for tokens in prompts:
                        truths.append(asdict(engine.generate(tokens)))
                        window()
            finally:
                server.stop()
    origin = (f"scripts/record_correlation_windows.py: the reference engine (seeds' G4 test, gpt-oss-120b, "
              f"{PROMPTS} prompts of {PROMPT_TOKENS} tokens, {ROUNDS} rounds, one request at a time), its /metrics "
              "scraped by kvscope's vllm collector after each request")
    out.write_text(json.dumps({"origin": origin, "windows": windows, "truth": truths}, indent=1) + "\n")
    print(f"{out}: {len(windows)} windows, {len(truths)} requests")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1])))
