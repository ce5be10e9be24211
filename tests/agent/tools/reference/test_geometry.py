"""KV geometry and `kvscope kv-size` against the seeds' figures (shared/seeds/summary.md)."""

from __future__ import annotations

import pytest

from kvscope.agent.app.cli import main
from kvscope.agent.tools.reference.geometry import KVGeometry, parse_count, parse_size, preset


def test_gpt_oss_120b_bytes_per_token_is_the_seeds_figure() -> None:
    geo = preset("openai/gpt-oss-120b")
    # 18 full-attention layers × 2 (K,V) × 8 heads × 64 × 2 bytes
    assert geo.bytes_per_token == 36_864
    assert geo.full_attention_layers == 18


def test_24m_tokens_is_the_seeds_825_gb() -> None:
    total = 24_000_000 * preset("gpt-oss-120b").bytes_per_token
    assert round(total / 2**30) == 824


def test_sliding_window_layers_hold_only_their_window() -> None:
    geo = preset("gpt-oss-120b")
    per_layer = 2 * 8 * 64 * 2
    assert geo.window_bytes(10) == 18 * per_layer * 10
    assert geo.window_bytes(100_000) == 18 * per_layer * 128
    assert geo.sequence_bytes(1000) == 1000 * 36_864 + 18 * per_layer * 128


@pytest.mark.parametrize(("name", "bpt"), [
    ("llama-3.1-8b", 32 * 2 * 8 * 128 * 2),
    ("meta-llama/Llama-3.1-70B-Instruct", 80 * 2 * 8 * 128 * 2),
    ("gpt-oss-20b", 12 * 2 * 8 * 64 * 2),
    ("Qwen/Qwen3-32B", 64 * 2 * 8 * 128 * 2),
])
def test_presets(name: str, bpt: int) -> None:
    assert preset(name).bytes_per_token == bpt


def test_bad_geometry_is_refused() -> None:
    with pytest.raises(ValueError, match="dtype"):
        KVGeometry("x", 1, 1, 1, "fp12")
    with pytest.raises(ValueError, match="sliding_window"):
        KVGeometry("x", 4, 1, 1, sliding_window_layers=2)
    with pytest.raises(ValueError, match="unknown model"):
        preset("gpt-5")


def test_sizes_and_counts() -> None:
    assert parse_size("19.6GiB") == int(19.6 * 2**30)
    assert parse_size("825GB") == 825 * 10**9
    assert parse_size("4096") == 4096
    assert parse_count("24M") == 24_000_000
    assert parse_count("130k") == 130_000
    with pytest.raises(ValueError):
        parse_size("lots")


def test_kv_size_cli(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["kv-size", "--model", "gpt-oss-120b", "--tokens", "24000000", "--g1", "19.6GiB",
               "--block-tokens", "16"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "36,864 B" in out
    assert "824.0 GiB" in out
    g1_tokens = int(19.6 * 2**30) // 36_864
    assert f"holds {g1_tokens:,} tokens = {g1_tokens // 16:,} blocks" in out
    assert "1,500,000 of 16 tokens" in out


def test_kv_size_custom_geometry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kv-size", "--layers", "2", "--kv-heads", "1", "--head-dim", "4", "--tokens", "10"]) == 0
    assert "32 B" in capsys.readouterr().out  # 2 layers × 2 × 1 × 4 × 2 B
    assert main(["kv-size", "--layers", "2", "--tokens", "10"]) == 2
    assert "--kv-heads" in capsys.readouterr().err
