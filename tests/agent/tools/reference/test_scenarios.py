"""The seeds' two experiments at test scale, the write-behind path, and the `kvscope reference` CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvscope.agent.app.cli import main
from kvscope.agent.tools.reference.engine import Engine, EngineConfig
from kvscope.agent.tools.reference.geometry import KVGeometry
from kvscope.agent.tools.reference.scenarios import shared_prompts, ttft_sweep
from kvscope.agent.tools.reference.truth import RequestTruth

TINY = KVGeometry("tiny", 4, 2, 64)  # 2 KiB per token


def config(tmp: Path, **kw: object) -> EngineConfig:
    settings: dict[str, object] = {"geometry": TINY, "block_tokens": 16, "g1_blocks": 1, "g4_blocks": 0,
                                   "time_scale": 0.05, "default_max_tokens": 2, "kv_events_endpoint": None, **kw}
    return EngineConfig.seeds_g4(tmp, **settings)


def test_ttft_sweep_warm_reuses_everything_but_the_last_block(tmp_path: Path) -> None:
    rows = ttft_sweep(config(tmp_path), [64, 256, 1024], seed=3)
    for r in rows:
        n = r.prompt_tokens
        assert r.cold.tokens_by_tier == {} and r.cold.computed_tokens == n
        assert r.warm.tokens_by_tier == {"G4": (n - 1) // 16 * 16}
        assert r.warm.computed_tokens == n - (n - 1) // 16 * 16
        assert r.warm.prefill_model_s < r.cold.prefill_model_s
    assert rows[-1].warm.fetch_bytes["G4"] > rows[0].warm.fetch_bytes["G4"]


def test_shared_prompts_cache_against_recompute(tmp_path: Path) -> None:
    cache, recompute = shared_prompts(config(tmp_path), requests=12, prompts=4, concurrency=3, prompt_tokens=512,
                                      seed=1)
    assert len(cache.truths) == len(recompute.truths) == 12
    assert recompute.reused_share == 0
    assert all(t.tokens_by_tier == {} for t in recompute.truths)
    assert 0 < cache.reused_share < 1  # the first use of each prompt is a cold fill
    assert sum(t.tokens_by_tier.get("G4", 0) > 0 for t in cache.truths) <= 8


def cold_then_warm(tmp_path: Path, write_behind_blocks: int) -> tuple[RequestTruth, RequestTruth]:
    """One 300-token prompt twice on the seeds' G4 configuration, the stores landed in between."""
    engine = Engine(config(tmp_path, g1_blocks=64, g4_blocks=100, write_behind_blocks=write_behind_blocks))
    engine.start()
    try:
        tokens = list(range(300))
        cold = engine.generate(tokens)
        engine.store.flush()
        return cold, engine.generate(tokens)
    finally:
        engine.stop()


def test_write_behind_lands_then_hits(tmp_path: Path) -> None:
    cold, warm = cold_then_warm(tmp_path, 32)
    assert warm.tokens_by_tier == {"G4": 288}
    # the copy into the write buffer is the request's; the background file write is nobody's
    assert cold.bytes_by_link["G1->G2"] == 18 * 16 * 2048 and "G2->G4" not in cold.bytes_by_link


def test_reference_scenario_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep.json"
    rc = main(["reference", "scenario", "ttft-sweep", "--layers", "4", "--kv-heads", "2", "--head-dim", "64",
               "--block-tokens", "16", "--lengths", "64,128", "--time-scale", "0.01", "--json", str(out),
               "--data-dir", str(tmp_path / "data")])
    assert rc == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split()[0] == "tokens" and len(table.splitlines()) == 3
    rows = json.loads(out.read_text())
    assert [r["warm"]["tokens_by_tier"]["G4"] for r in rows] == [48, 112]


def test_write_behind_backpressure_waits_and_every_block_lands(tmp_path: Path) -> None:
    """One write buffer for 18 blocks: the store waits for the writer (which lands writes meanwhile), never
    deadlocks, writes nothing inline, and the wait is timed as the cold request's offload."""
    cold, warm = cold_then_warm(tmp_path, 1)
    assert warm.tokens_by_tier == {"G4": 288}
    assert cold.bytes_by_link["G1->G2"] == 18 * 16 * 2048 and "G2->G4" not in cold.bytes_by_link
    assert cold.offload_s >= cold.seconds_by_link["G1->G2"] > 0


def test_g1_evictions_are_offload_timed_by_the_store_timer(tmp_path: Path) -> None:
    """A G1 that keeps blocks and is full evicts to G2 inside the next request's step: the truth calls it
    offload (not fetch, not compute), and the G1 -> G2 store seconds the engine publishes cover it."""
    cfg = config(tmp_path, g1_blocks=20, g1_retain=True, g2_blocks=64, g4_blocks=0)
    engine = Engine(cfg)
    engine.start()
    try:
        first = engine.generate(list(range(300)))  # 18 blocks in G1
        second = engine.generate(list(range(1000, 1300)))  # needs 18 more: 16 of the first go down to G2
    finally:
        engine.stop()
    assert first.offload_s == 0.0 and "G1->G2" not in first.bytes_by_link
    assert second.bytes_by_link["G1->G2"] == 16 * 16 * 2048
    store_seconds = second.seconds_by_link["G1->G2"]
    assert 0 < store_seconds <= second.offload_s
    assert second.ttft_s == pytest.approx(sum(second.components().values()), abs=1e-9)
