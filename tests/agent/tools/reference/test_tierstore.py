"""The reference tier store: LRU, promotion, cascade, the seeds' G4-only path, bad block files, O_DIRECT."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvscope.agent.core.tiers import Tier
from kvscope.agent.tools.reference.blockfile import (
    PAGE,
    BlockFileError,
    BlockHeader,
    direct_io_supported,
    encode_header,
    parse_header,
)
from kvscope.agent.tools.reference.blocks import BlockId, block_stamp, chain_blocks
from kvscope.agent.tools.reference.tierstore import BlockEvent, TieredStore, TierSpec, Transfer

G1, G2, G3, G4 = Tier.G1, Tier.G2, Tier.G3, Tier.G4
BLOCK_TOKENS = 4
BLOCK_BYTES = 10_000  # not a page multiple, on purpose: slots and files are padded


class Recorder:
    def __init__(self) -> None:
        self.transfers: list[Transfer] = []
        self.events: list[BlockEvent] = []
        self.errors: list[tuple[Tier, str]] = []

    def transfer(self, t: Transfer) -> None:
        self.transfers.append(t)

    def block_event(self, e: BlockEvent) -> None:
        self.events.append(e)

    def error(self, tier: Tier, kind: str) -> None:
        self.errors.append((tier, kind))

    def links(self) -> list[tuple[Tier, Tier]]:
        return [(t.src, t.dst) for t in self.transfers]


def make(tmp_path: Path, g1: int, g2: int = 0, g3: int = 0, g4: int = 0, g1_retain: bool = True,
         g2_retain: bool = True, direct: bool = False) -> tuple[TieredStore, Recorder]:
    rec = Recorder()
    specs = {G1: TierSpec(g1, g1_retain), G2: TierSpec(g2, g2_retain),
             G3: TierSpec(g3, path=tmp_path / "g3", direct=direct),
             G4: TierSpec(g4, path=tmp_path / "g4", direct=direct)}
    return TieredStore(BLOCK_TOKENS, BLOCK_BYTES, specs, rec), rec


def blocks(n: int, seed: int = 0) -> list[BlockId]:
    tokens = np.random.default_rng(seed).integers(0, 50_000, n * BLOCK_TOKENS)
    return chain_blocks(tokens, BLOCK_TOKENS)


def serve(store: TieredStore, bs: list[BlockId]) -> list[Tier]:
    """One request: look up, fetch the hits, compute the rest, release."""
    tiers = store.lookup(bs)
    result = store.fetch(bs[:len(tiers)], tiers)
    for b in bs[result.loaded:]:
        store.put_computed(b)
    for b in bs:
        assert block_stamp(store.g1_view(b.key)) == (b.key, b.key)  # G1 holds exactly the right bytes
    store.release()
    return tiers


def test_chained_hashes_share_prefixes() -> None:
    a = chain_blocks([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    b = chain_blocks([1, 2, 3, 4, 5, 6, 7, 0], 4)
    assert len(a) == 2 and len(b) == 2  # the partial block is not hashed
    assert a[0].key == b[0].key and a[1].key != b[1].key
    assert a[1].parent == a[0].key and a[0].parent is None


def test_g1_lru_evicts_oldest_unpinned_and_cascades_to_g2(tmp_path: Path) -> None:
    store, rec = make(tmp_path, g1=3, g2=4)
    first, second = blocks(2, seed=1), blocks(2, seed=2)
    serve(store, first)
    serve(store, second)  # 4 blocks into 3 slots: first[0] (oldest) goes down to G2
    assert not store.holds(G1, first[0].key) and store.holds(G2, first[0].key)
    assert all(store.holds(G1, b.key) for b in [first[1], *second])
    assert (G1, G2) in rec.links()
    assert BlockEvent("removed", G1, first[0]) in rec.events
    assert BlockEvent("stored", G2, first[0]) in rec.events


def test_hit_in_g2_is_copied_to_g1_and_touched(tmp_path: Path) -> None:
    store, rec = make(tmp_path, g1=2, g2=4)
    a, b = blocks(2, seed=1), blocks(2, seed=2)
    serve(store, a)
    serve(store, b)  # a's blocks move to G2
    rec.transfers.clear()
    assert serve(store, a) == [G2, G2]
    assert rec.links().count((G2, G1)) == 2
    assert all(t.bytes == BLOCK_BYTES for t in rec.transfers if t.dst is G1)


def test_cascade_through_every_tier_and_promotion(tmp_path: Path) -> None:
    store, rec = make(tmp_path, g1=1, g2=1, g3=1, g4=8)
    a, b, c = blocks(1, 1), blocks(1, 2), blocks(1, 3)
    for bs in (a, b, c):
        serve(store, bs)
    # c in G1, b in G2, a pushed G1 → G2 → G3 → G4 (each hop evicts the older block)
    assert store.holds(G1, c[0].key) and store.holds(G2, b[0].key)
    assert store.holds(G3, a[0].key) or store.holds(G4, a[0].key)
    serve(store, blocks(1, 4))  # one more: a leaves G3 for G4 through host memory
    assert store.holds(G4, a[0].key) and not store.holds(G3, a[0].key)
    assert (G3, G2) in rec.links() and (G2, G4) in rec.links()
    rec.transfers.clear()
    assert serve(store, a) == [G4]
    # making room in G1 cascades the older blocks down first; then a is read into G2 and copied to G1
    assert rec.links()[-2:] == [(G4, G2), (G2, G1)]
    assert store.holds(G2, a[0].key) and store.holds(G4, a[0].key)  # inclusive: the G4 copy stays


def test_seeds_configuration_every_reuse_comes_from_g4(tmp_path: Path) -> None:
    store, rec = make(tmp_path, g1=16, g1_retain=False, g2=0, g4=100)
    prompt = blocks(5)
    assert serve(store, prompt) == []
    assert store.resident(G1) == 0 and store.resident(G2) == 0 and store.resident(G4) == 5
    # through the host staging buffer; the store out of G1 is reported once its file is written, and its time
    # covers the write (the block was not safe below G1 before)
    assert rec.links() == [(G2, G4), (G1, G2)] * 5
    for write, store_out in zip(rec.transfers[::2], rec.transfers[1::2], strict=True):
        assert store_out.start <= write.start and store_out.seconds >= write.seconds
    rec.transfers.clear()
    assert serve(store, prompt) == [G4] * 5
    assert rec.links() == [(G4, G2), (G2, G1)] * 5
    assert all(t.bytes >= PAGE + BLOCK_BYTES for t in rec.transfers if t.src is G4)
    assert store.resident(G1) == 0


def _one_block_on_disk(tmp_path: Path) -> tuple[TieredStore, Recorder, list[BlockId], Path]:
    store, rec = make(tmp_path, g1=4, g1_retain=False, g3=10)
    prompt = blocks(3)
    serve(store, prompt)
    return store, rec, prompt, store.files[G3].path(prompt[1].key)


def test_corrupted_block_is_a_miss_and_an_error(tmp_path: Path) -> None:
    store, rec, prompt, path = _one_block_on_disk(tmp_path)
    raw = bytearray(path.read_bytes())
    raw[PAGE + 5000] ^= 0xFF
    path.write_bytes(bytes(raw))
    tiers = store.lookup(prompt)
    result = store.fetch(prompt, tiers)
    assert result.failed and result.loaded == 1
    assert rec.errors == [(G3, "corrupt")]
    store.release()
    assert not path.exists() and store.lookup(prompt) == [G3]  # the bad block is gone, block 0 stays


def test_truncated_block_is_a_miss_and_an_error(tmp_path: Path) -> None:
    store, rec, prompt, path = _one_block_on_disk(tmp_path)
    path.write_bytes(path.read_bytes()[:PAGE + 100])
    result = store.fetch(prompt, store.lookup(prompt))
    assert result.loaded == 1 and rec.errors == [(G3, "truncated")]


def test_vanished_block_file_is_a_miss(tmp_path: Path) -> None:
    store, rec, prompt, path = _one_block_on_disk(tmp_path)
    path.unlink()  # another process evicted it from a shared directory
    assert store.fetch(prompt, store.lookup(prompt)).loaded == 1
    assert rec.errors == [(G3, "missing")]


def test_header_parse_is_pure_and_strict() -> None:
    raw = encode_header(BlockHeader(key=0xDEADBEEF, payload_bytes=100, algo=1, block_tokens=4, checksum=7))
    assert len(raw) == PAGE
    assert parse_header(raw, PAGE + 100) == BlockHeader(0xDEADBEEF, 100, 1, 4, 7)
    with pytest.raises(BlockFileError) as e:
        parse_header(raw, PAGE + 99)
    assert e.value.kind == "truncated"
    with pytest.raises(BlockFileError) as e:
        parse_header(b"KVSBLK02" + raw[8:], PAGE + 100)
    assert e.value.kind == "corrupt"
    with pytest.raises(BlockFileError) as e:
        parse_header(raw[:10], 10)
    assert e.value.kind == "truncated"


def test_o_direct_round_trip(tmp_path: Path) -> None:
    ok, why = direct_io_supported(tmp_path)
    if not ok:
        pytest.skip(why)
    store, rec = make(tmp_path, g1=4, g1_retain=False, g3=10, direct=True)
    assert store.files[G3].direct
    prompt = blocks(3)
    serve(store, prompt)
    rec.transfers.clear()
    assert serve(store, prompt) == [G3] * 3  # serve() checks the bytes that arrived in G1
    assert rec.errors == []


def test_clear_empties_every_tier(tmp_path: Path) -> None:
    store, _ = make(tmp_path, g1=4, g2=2, g3=4)
    serve(store, blocks(4))
    serve(store, blocks(4, seed=1))
    store.clear()
    assert [store.resident(t) for t in (G1, G2, G3, G4)] == [0, 0, 0, 0]
    assert list((tmp_path / "g3").glob("*.kvb")) == []


def test_every_use_of_a_block_already_in_g1_is_reported_as_a_reuse(tmp_path: Path) -> None:
    """What vLLM announces for a request with kv_cache_report_mode=full: the engine publishes these only then."""
    store, rec = make(tmp_path, g1=8)
    a = blocks(3, seed=1)
    serve(store, a)
    rec.events.clear()
    store.lookup(a)
    store.fetch(a[:2], [G1, G1])  # the run found in G1 is reused...
    store.put_computed(a[2])  # ...and so is a block computed while G1 still holds it
    store.release()
    assert rec.events == [BlockEvent("reused", G1, b) for b in a]
