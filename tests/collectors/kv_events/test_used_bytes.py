"""kvscope_tier_used_bytes from KV events: resident blocks × the events' block_size × kv_bytes_per_token.

Every test feeds the collector whole ZMQ messages ([topic, seq, payload]) through `handle()`, the code the
socket thread runs, with payloads encoded by the vLLM 0.33 / 0.20 structs that tests/collectors/kv_events/test_decode.py
holds byte for byte to shared/facts/vllm.md §2.6.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
import pytest

from kvscope.agent.app.wiring import components
from kvscope.agent.config.settings import ConfigError, load_config
from kvscope.agent.core.contract import KV_RESIDENT_BLOCKS, TIER_USED_BYTES
from kvscope.agent.core.readings import Sample
from kvscope.agent.tools.reference.vllm_kv_wire import (
    Vllm020Batch,
    Vllm020BlockStored,
    Vllm033AllBlocksCleared,
    Vllm033Batch,
    Vllm033BlockRemoved,
    Vllm033BlockStored,
)
from kvscope.collectors.kv_events.collector import NAME, VllmKvEventsCollector, VllmKvEventsOptions
from testkit.paths import FIXTURES

FIX = FIXTURES / "kv_events"
# The seeds' model: `kvscope kv-size --model gpt-oss-120b` (18 full-attention layers x 8 KV heads x 64 x 2 B
# x K and V), vLLM's default GPU block of 16 tokens
GPT_OSS_120B_BYTES_PER_TOKEN = 36_864
GPU_BLOCK_TOKENS = 16
GPU_BLOCK_BYTES = 589_824
LAB = ("vllm", "openai/gpt-oss-120b", "0")


class Feed:
    """A collector that is handed messages in sequence order from seq 0, as a subscriber that saw the start."""

    def __init__(self, **options: Any) -> None:
        opts = VllmKvEventsOptions(endpoint="tcp://127.0.0.1:1", model="openai/gpt-oss-120b", **options)
        opts.validate(NAME)
        self.collector = VllmKvEventsCollector(opts)
        self.stream = self.collector.streams[0]
        self.seq = 0
        self.ts = 1767225600.0  # vLLM's batch ts is the wall clock at each engine step: it moves on

    def send(self, payload: bytes) -> None:
        self.collector.handle(self.stream, [b"", self.seq.to_bytes(8, "big"), payload])
        self.seq += 1

    def batch(self, *events: Any) -> None:
        self.ts += 0.01
        self.send(msgspec.msgpack.encode(Vllm033Batch(self.ts, list(events), 0)))

    def series(self, name: str) -> dict[str, float]:
        return {r.labels[3]: r.value for r in self.collector.collect()
                if isinstance(r, Sample) and r.name == name and r.labels[:3] == LAB}

    def close(self) -> None:
        self.collector.close()


@pytest.fixture
def feeds() -> Any:
    made: list[Feed] = []

    def make(**options: Any) -> Feed:
        made.append(Feed(**options))
        return made[-1]

    yield make
    for f in made:
        f.close()


def stored(h: int, block_size: int = GPU_BLOCK_TOKENS, medium: str = "GPU", locality: str | None = None,
           parent: int | None = None) -> Vllm033BlockStored:
    tokens = [] if medium != "GPU" else list(range(h % 1000, h % 1000 + block_size))
    return Vllm033BlockStored([h], parent, tokens, block_size, None, medium, None, group_idx=0, locality=locality)


def removed(*hashes: int, medium: str = "GPU", locality: str | None = None) -> Vllm033BlockRemoved:
    return Vllm033BlockRemoved(list(hashes), medium, group_idx=0, locality=locality)


def gpu_steps(feed: Feed, first: int, blocks: int, per_batch: int = 32) -> None:
    """Engine steps that each cache `per_batch` new full GPU blocks (batches of GPU stores only)."""
    for start in range(first, first + blocks, per_batch):
        feed.batch(*(stored(h) for h in range(start, min(start + per_batch, first + blocks))))


def test_seeds_geometry_gpt_oss_120b_16_token_blocks(feeds: Any) -> None:
    """589,824 B per block (16 tokens x 36,864 B); scaled down in blocks, not in bytes per token."""
    feed = feeds(kv_bytes_per_token=GPT_OSS_120B_BYTES_PER_TOKEN)
    gpu_steps(feed, 1, 1000)  # 32 batches of GPU stores only: most are decoded without block_size
    feed.batch(*(removed(h) for h in range(1, 41)), *(stored(h) for h in range(1001, 1009)))  # evict, cache
    feed.batch(*(stored(h, medium="CPU") for h in range(1, 41)))  # the evicted blocks offloaded to host memory
    assert GPU_BLOCK_TOKENS * GPT_OSS_120B_BYTES_PER_TOKEN == GPU_BLOCK_BYTES
    assert feed.series(KV_RESIDENT_BLOCKS) == {"G1": 968, "G2": 40, "G3": 0, "G4": 0}
    assert feed.series(TIER_USED_BYTES) == {"G1": 968 * GPU_BLOCK_BYTES, "G2": 40 * GPU_BLOCK_BYTES, "G3": 0, "G4": 0}
    assert feed.series(TIER_USED_BYTES)["G1"] == 570_949_632


def test_no_kv_bytes_per_token_no_used_bytes(feeds: Any) -> None:
    """Without the model's KV geometry there is no used-bytes series at all, not a guessed one."""
    feed = feeds()
    gpu_steps(feed, 1, 100)
    assert feed.series(KV_RESIDENT_BLOCKS)["G1"] == 100
    assert feed.series(TIER_USED_BYTES) == {}


def test_each_tier_uses_its_own_block_size(feeds: Any) -> None:
    """LMCache's events carry its chunk size (256 tokens) as block_size, medium "cpu" (facts §4)."""
    feed = feeds(kv_bytes_per_token=1000)
    feed.batch(*(stored(h) for h in range(1, 5)), *(stored(h, 256, "cpu") for h in range(10, 13)),
               stored(20, 64, "STORAGE", "REMOTE"))
    assert feed.series(TIER_USED_BYTES) == {"G1": 4 * 16 * 1000, "G2": 3 * 256 * 1000, "G3": 0, "G4": 64 * 1000}


def test_legacy_array_events_carry_block_size_too(feeds: Any) -> None:
    feed = feeds(kv_bytes_per_token=100)
    events = [Vllm020BlockStored([h], None, list(range(32)), 32, None, "GPU", None) for h in range(1, 6)]
    for _ in range(3):  # later batches re-announce the same blocks: still 5 resident
        feed.send(msgspec.msgpack.encode(Vllm020Batch(1.0, events, 0)))
    assert feed.series(TIER_USED_BYTES)["G1"] == 5 * 32 * 100


def test_the_facts_tiers_fixture(feeds: Any) -> None:
    """vllm-0.33.0_tiers.hex mixes sizes in G1 (16, and 1 for the bytes-hash block) and G2 (LMCache's
    256-token "cpu" chunks beside 16-token "CPU" blocks): no bytes for those; G3's two 16-token blocks."""
    feed = feeds(kv_bytes_per_token=10)
    feed.send(bytes.fromhex((FIX / "vllm-0.33.0_tiers.hex").read_text().strip()))
    feed.stream.labels = LAB  # the fixture is rank 1's batch; the label is the socket's rank
    assert feed.series(KV_RESIDENT_BLOCKS) == {"G1": 2, "G2": 3, "G3": 2, "G4": 0}
    assert feed.series(TIER_USED_BYTES) == {"G3": 2 * 16 * 10, "G4": 0}


def test_mixed_sizes_withhold_the_tier_until_it_is_empty(feeds: Any, caplog: pytest.LogCaptureFixture) -> None:
    feed = feeds(kv_bytes_per_token=10)
    feed.batch(*(stored(h, 256, "cpu") for h in range(1, 4)), stored(4, 100, "cpu"))  # a partial last chunk
    with caplog.at_level(logging.WARNING, "kvscope.vllm_kv_events"):
        assert "G2" not in feed.series(TIER_USED_BYTES) and feed.series(KV_RESIDENT_BLOCKS)["G2"] == 4
        feed.series(TIER_USED_BYTES)
    assert [r.getMessage() for r in caplog.records].count(
        "rank 0 (tcp://127.0.0.1:1): no kvscope_tier_used_bytes for G2: its resident blocks were stored with "
        "different block sizes (logged once)") == 1
    feed.batch(removed(1, 2, medium="cpu"))
    assert "G2" not in feed.series(TIER_USED_BYTES)  # blocks 3 and 4 are still there, of different sizes
    feed.batch(removed(3, 4, medium="cpu"))
    assert feed.series(TIER_USED_BYTES)["G2"] == 0  # empty: sizes no longer matter
    feed.batch(*(stored(h, 256, "cpu") for h in range(5, 7)))
    assert feed.series(TIER_USED_BYTES)["G2"] == 2 * 256 * 10
    feed.batch(stored(7, 256, "cpu"), stored(8, 16, "cpu"), stored(9, 256, "cpu"))
    # a size that differs only inside a run whose ends agree is not seen (the check reads the ends)
    assert feed.series(TIER_USED_BYTES)["G2"] == 5 * 256 * 10


def test_a_size_change_between_batches_is_seen(feeds: Any) -> None:
    feed = feeds(kv_bytes_per_token=10)
    feed.batch(stored(1, 16, "CPU"), stored(2, 16, "CPU"))
    feed.batch(stored(3, 32, "CPU"), stored(4, 32, "CPU"))
    assert "G2" not in feed.series(TIER_USED_BYTES)


def test_offload_placeholders_use_default_block_size(feeds: Any) -> None:
    """vLLM's offloading connector sends block_size 0 unless self_describing_kv_events is on: such a tier
    gets bytes only from default_block_size; a tier whose events say their size ignores it."""
    blocks = [stored(h) for h in range(1, 3)] + [stored(h, 0, "CPU") for h in range(10, 13)]
    without = feeds(kv_bytes_per_token=10)
    without.batch(*blocks)
    assert without.series(TIER_USED_BYTES) == {"G1": 2 * 16 * 10, "G3": 0, "G4": 0}
    configured = feeds(kv_bytes_per_token=10, default_block_size=256)
    configured.batch(*blocks)
    assert configured.series(TIER_USED_BYTES) == {"G1": 2 * 16 * 10, "G2": 3 * 256 * 10, "G3": 0, "G4": 0}
    configured.batch(stored(13, 16, "CPU"))  # a described block beside placeholders: sizes differ
    assert "G2" not in configured.series(TIER_USED_BYTES)


def test_odd_block_size_values_count_as_not_sent(feeds: Any) -> None:
    feed = feeds(kv_bytes_per_token=10)
    feed.send(msgspec.msgpack.encode([1.0, [
        {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": [], "block_size": None,
         "lora_id": None, "medium": "CPU", "lora_name": None},
        {"type": "BlockStored", "block_hashes": [2], "medium": "CPU"},  # no block_size key at all
    ], 0]))
    assert feed.series(KV_RESIDENT_BLOCKS)["G2"] == 2 and "G2" not in feed.series(TIER_USED_BYTES)


def test_unknown_residency_has_no_used_bytes(feeds: Any) -> None:
    """A late joiner without replay: residency unknown, so neither blocks nor bytes are exported."""
    feed = feeds(kv_bytes_per_token=10)
    feed.seq = 5
    gpu_steps(feed, 1, 64)
    assert feed.series(KV_RESIDENT_BLOCKS) == {} and feed.series(TIER_USED_BYTES) == {}
    feed.batch(Vllm033AllBlocksCleared())  # G1 is known empty from here on
    gpu_steps(feed, 100, 32)
    assert feed.series(TIER_USED_BYTES) == {"G1": 32 * 16 * 10}


def test_g1_size_after_a_restart_waits_for_a_batch_that_reads_it(feeds: Any) -> None:
    """Batches of GPU stores only are read with block_size one in 16 (after any other batch the next 16
    go through the general decoders, which always read it). A restarted engine whose first batches are
    all GPU stores leaves G1's size pending for up to 15 of them: its bytes are absent, not assumed."""
    feed = feeds(kv_bytes_per_token=10)
    gpu_steps(feed, 1, 32)  # the decoder's first batch of GPU stores only is read with its block_size
    assert feed.series(TIER_USED_BYTES)["G1"] == 32 * 16 * 10
    feed.seq = 0  # the engine restarted: G1 is empty and its block size unknown again
    seen = []
    for step in range(16):
        gpu_steps(feed, 1000 + 32 * step, 32)
        seen.append(feed.series(TIER_USED_BYTES).get("G1"))
    assert seen[:15] == [None] * 15 and seen[15] == 16 * 32 * 16 * 10
    assert feed.series(KV_RESIDENT_BLOCKS)["G1"] == 16 * 32


def test_all_blocks_cleared_forgets_g1_size(feeds: Any) -> None:
    feed = feeds(kv_bytes_per_token=10)
    gpu_steps(feed, 1, 8)
    feed.batch(Vllm033AllBlocksCleared(), *(stored(h, 32) for h in range(100, 104)))  # a new block size
    assert feed.series(TIER_USED_BYTES)["G1"] == 4 * 32 * 10


def test_restart_forgets_the_block_size(feeds: Any) -> None:
    feed = feeds(kv_bytes_per_token=10)
    feed.batch(stored(1, 16, "CPU"))
    feed.seq = 0  # a new engine process: seq starts again
    feed.batch(stored(2, 32, "CPU"))
    assert feed.series(TIER_USED_BYTES)["G2"] == 32 * 10


@pytest.mark.parametrize(("key", "value"), [("kv_bytes_per_token", -1), ("default_block_size", -16)])
def test_config_rejects_negative_sizes(key: str, value: int) -> None:
    text = f"[collectors.{NAME}]\nenabled = true\nmodel = 'm'\nendpoint = 'tcp://127.0.0.1:5557'\n{key} = {value}\n"
    with pytest.raises(ConfigError, match=f"{key}: must be >= 0"):
        load_config(text, components(), environ={})


def test_config_accepts_the_kv_size_figure() -> None:
    text = (f"[collectors.{NAME}]\nenabled = true\nmodel = 'm'\nendpoint = 'tcp://127.0.0.1:5557'\n"
            "kv_bytes_per_token = 36864\n")
    _, options = load_config(text, components(), environ={}).collectors[NAME]
    assert (options.kv_bytes_per_token, options.default_block_size) == (36864, 0)
