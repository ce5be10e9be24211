"""KV-event decoding, tier mapping, residency and reuse distance: pure functions on literal payloads."""

from __future__ import annotations

import random

import msgspec
import pytest

from kvscope.agent.app.wiring import components
from kvscope.agent.config.settings import ConfigError, load_config
from kvscope.agent.core.tiers import Tier
from kvscope.agent.tools.reference.vllm_kv_wire import (
    Vllm020AllBlocksCleared,
    Vllm020Batch,
    Vllm020BlockRemoved,
    Vllm020BlockStored,
    Vllm033AllBlocksCleared,
    Vllm033Batch,
    Vllm033BlockRemoved,
    Vllm033BlockStored,
)
from kvscope.collectors.kv_events.collector import NAME, rank_endpoint
from kvscope.collectors.kv_events.residency import Residency, tier_of
from kvscope.collectors.kv_events.reuse import ReuseTracker
from kvscope.collectors.kv_events.schema import BatchDecoder, MalformedBatch
from testkit.paths import FIXTURES
from testkit.reuse import brute_distances, slot

FIX = FIXTURES / "kv_events"


def payload(name: str) -> bytes:
    return bytes.fromhex((FIX / name).read_text().strip())


def example_033() -> Vllm033Batch:
    return Vllm033Batch(1.5, [
        Vllm033BlockStored([7], None, [1, 2], 2, None, "GPU", None, group_idx=0),
        Vllm033BlockRemoved([7], "GPU", group_idx=0),
        Vllm033AllBlocksCleared(),
    ], 0)


# -- the encoder reproduces the facts' bytes --------------------------------------------------------


def test_encoder_reproduces_facts_hex_033() -> None:
    assert msgspec.msgpack.encode(example_033()) == payload("vllm-0.33.0_map.hex")


def test_encoder_reproduces_facts_hex_020() -> None:
    batch = Vllm020Batch(1.5, [
        Vllm020BlockStored([7], None, [1, 2], 2, None, "GPU", None, group_idx=0),
        Vllm020BlockRemoved([7], "GPU", group_idx=0),
        Vllm020AllBlocksCleared(),
    ], 0)
    assert msgspec.msgpack.encode(batch) == payload("vllm-0.20.0_array.hex")


def tiers_batch() -> Vllm033Batch:
    """The recipe of vllm-0.33.0_tiers.hex (see the fixtures' README)."""
    s, r = Vllm033BlockStored, Vllm033BlockRemoved
    return Vllm033Batch(1767225600.25, [
        s([0xdeadbeefcafef00d], None, list(range(16)), 16, None, "GPU", None, group_idx=0,
          kv_cache_spec_kind="full_attention"),
        s([0xffffffffffffffff], 0xdeadbeefcafef00d, list(range(16, 32)), 16, None, "GPU", None, group_idx=0,
          session_id="s-1", lookahead_token_ids=[[1, 2]]),
        s([0x0123456789abcdef, 0xfedcba9876543210], None, [], 256, None, "cpu", None),
        s([0x1111], None, [], 16, None, "CPU", None, locality="LOCAL"),
        s([0x2222], None, [], 16, None, "STORAGE", None, locality="LOCAL", ownership="kvcr"),
        s([0x3333], None, [], 16, None, "STORAGE", None, locality="REMOTE"),
        s([0x4444], None, [], 16, None, "storage", None),
        s([bytes.fromhex("00ff" * 16)], None, [7], 1, None, "GPU", None),
        r([0xffffffffffffffff], "GPU", group_idx=0),
        r([0x3333, 0x5555], "STORAGE", locality="REMOTE"),
    ], 1)


def test_constructed_fixtures_match_their_recipe() -> None:
    assert msgspec.msgpack.encode(tiers_batch()) == payload("vllm-0.33.0_tiers.hex")
    assert b"\xcf\xde\xad\xbe\xef\xca\xfe\xf0\x0d" in payload("vllm-0.33.0_tiers.hex")  # uint64 on the wire
    old = [2.0, [["BlockStored", [0xcafebabedeadbeef], None, [5, 6, 7, 8], 4, None, "GPU"],
                 ["BlockStored", [0xcafebabedeadbef0], 0xcafebabedeadbeef, [9, 10, 11, 12], 4, None, "GPU"],
                 ["BlockRemoved", [0xcafebabedeadbeef], "GPU"], ["AllBlocksCleared"]], None]
    assert msgspec.msgpack.encode(old) == payload("vllm-0.11.0_array.hex")


# -- decoding ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "wire"), [("vllm-0.33.0_map.hex", "map"), ("vllm-0.20.0_array.hex", "array")])
def test_decode_both_formats(name: str, wire: str) -> None:
    b = BatchDecoder().decode(payload(name))
    assert (b.ts, b.data_parallel_rank, b.wire_format) == (1.5, 0, wire)
    kinds = [type(e).__name__ for e in b.events]
    assert [k.removeprefix("Legacy") for k in kinds] == ["StoredEvent", "RemovedEvent", "ClearedEvent"]
    assert b.events[0].block_hashes == [7] and b.events[0].medium == "GPU"
    assert b.events[1].block_hashes == [7] and b.events[1].medium == "GPU"


def test_decode_full_range_and_bytes_hashes() -> None:
    b = BatchDecoder().decode(payload("vllm-0.33.0_tiers.hex"))
    assert b.wire_format == "map" and b.data_parallel_rank == 1 and b.ts == 1767225600.25
    hashes = [h for e in b.events for h in e.block_hashes]
    assert 0xdeadbeefcafef00d in hashes and 2**64 - 1 in hashes
    assert bytes.fromhex("00ff" * 16) in hashes
    assert [(e.medium, e.locality) for e in b.events[3:7]] == [
        ("CPU", "LOCAL"), ("STORAGE", "LOCAL"), ("STORAGE", "REMOTE"), ("storage", None)]


def test_decode_0_11_layout() -> None:
    b = BatchDecoder().decode(payload("vllm-0.11.0_array.hex"))
    assert b.wire_format == "array" and b.data_parallel_rank is None
    assert [e.block_hashes for e in b.events[:3]] == [[0xcafebabedeadbeef], [0xcafebabedeadbef0],
                                                      [0xcafebabedeadbeef]]


def test_batch_as_map_and_unknown_event_types() -> None:
    data = msgspec.msgpack.encode({"ts": 3.0, "data_parallel_rank": 2, "events": [
        {"type": "BlockStored", "block_hashes": [1], "medium": "GPU", "future_field": [1, 2]},
        {"type": "BlockPinned", "block_hashes": [1]},
    ]})
    b = BatchDecoder().decode(data)
    assert (b.ts, b.data_parallel_rank, len(b.events), b.unknown_events) == (3.0, 2, 1, 1)


@pytest.mark.parametrize("bad", [
    b"",
    b"\xc1",
    msgspec.msgpack.encode("not a batch"),
    msgspec.msgpack.encode([1.5]),
    msgspec.msgpack.encode([1.5, 7, 0]),
    msgspec.msgpack.encode(["x", [], 0]),
    msgspec.msgpack.encode([1.5, [{"type": "BlockStored", "block_hashes": "oops"}], 0]),
    msgspec.msgpack.encode([1.5, [["BlockRemoved", [1.5], "GPU"]], 0]),
    msgspec.msgpack.encode([1.5, [42], 0]),
    payload("vllm-0.33.0_map.hex")[:-5],
])
def test_malformed_payloads_raise_malformed(bad: bytes) -> None:
    with pytest.raises(MalformedBatch):
        BatchDecoder().decode(bad)


# -- tiers ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("medium", "locality", "tier"), [
    ("GPU", None, Tier.G1), ("gpu", None, Tier.G1), ("CPU", None, Tier.G2), ("cpu", "LOCAL", Tier.G2),
    ("STORAGE", "LOCAL", Tier.G3), ("STORAGE", "remote", Tier.G4), ("STORAGE", None, Tier.G3),
    ("Storage", "REMOTE", Tier.G4), ("FS", None, Tier.G3), ("OBJ", None, Tier.G4),
    (None, None, Tier.UNATTRIBUTED), ("CXL", None, Tier.UNATTRIBUTED),
])
def test_tier_of(medium: str | None, locality: str | None, tier: Tier) -> None:
    assert tier_of(medium, locality) is tier


def test_rank_endpoint() -> None:
    assert rank_endpoint("tcp://10.0.0.5:5557", 0) == "tcp://10.0.0.5:5557"
    assert rank_endpoint("tcp://10.0.0.5:5557", 3) == "tcp://10.0.0.5:5560"
    assert rank_endpoint("tcp://[::1]:5557", 1) == "tcp://[::1]:5558"
    assert rank_endpoint("inproc://kv", 2) == "inproc://kv_dp2"
    with pytest.raises(ValueError):
        rank_endpoint("ipc:///tmp/kv", 1)


# -- residency --------------------------------------------------------------------------------------


def test_residency_from_tiers_fixture() -> None:
    res = Residency(max_tracked=64)
    b = BatchDecoder().decode(payload("vllm-0.33.0_tiers.hex"))
    res.apply(b.events)
    counts = {t: (len(s.resident), s.stored, s.removed, s.removed_unknown) for t, s in res.tiers.items()}
    assert counts == {
        Tier.G1: (2, 3, 1, 0),  # 3 GPU blocks stored (one bytes hash), 2**64-1 removed
        Tier.G2: (3, 3, 0, 0),  # two lowercase "cpu" + one "CPU"
        Tier.G3: (2, 2, 0, 0),  # STORAGE+LOCAL, storage without locality
        Tier.G4: (0, 1, 1, 1),  # 0x3333 stored and removed; 0x5555 never stored
    }
    assert res.events == [8, 2, 0]


def test_duplicate_stores_count_once_and_clear_only_g1() -> None:
    res = Residency(max_tracked=64)
    stored = [Vllm033BlockStored([h], None, [], 16, None, "GPU", None) for h in (1, 2, 1, 1, 2)]
    cpu = Vllm033BlockStored([1], None, [], 16, None, "CPU", None)
    data = msgspec.msgpack.encode(Vllm033Batch(0.0, [*stored, cpu, Vllm033AllBlocksCleared()]))
    res.apply(BatchDecoder().decode(data).events[:-1])
    g1, g2 = res.tier(Tier.G1), res.tier(Tier.G2)
    assert (len(g1.resident), g1.stored, len(g2.resident)) == (2, 2, 1)
    assert not g1.known
    res.apply(BatchDecoder().decode(data).events[-1:])
    assert (len(g1.resident), g1.removed, g1.known) == (0, 2, True)
    assert (len(g2.resident), g2.known) == (1, False)


def test_restart_clears_and_complete_marks_all_tiers() -> None:
    res = Residency(max_tracked=8)
    res.apply(BatchDecoder().decode(payload("vllm-0.33.0_tiers.hex")).events)
    res.set_complete(True)
    assert all(s.known for s in res.tiers.values())
    res.restart()
    assert all(not s.resident for s in res.tiers.values())
    assert all(s.stored - s.removed == 0 for s in res.tiers.values())


# -- reuse distance ---------------------------------------------------------------------------------

def test_reuse_distance_matches_brute_force_through_renumbering() -> None:
    rng = random.Random(7)
    seq = [rng.randrange(40) for _ in range(3000)]  # cap 64 > 40 keys: nothing evicted, many renumbers
    tracker = ReuseTracker(max_tracked=64)
    for key in seq:
        tracker.use(key)
    expected = brute_distances(seq)
    buckets, total, count = tracker.cumulative()
    assert (count, total, tracker.evicted) == (len(expected), sum(expected), 0)
    per_slot = [0] * len(buckets)
    for d in expected:
        per_slot[slot(d)] += 1
    running = 0
    for (bound, cum), n in zip(buckets, per_slot, strict=True):
        running += n
        assert cum == running, bound


def test_reuse_tracker_cap_evicts_oldest() -> None:
    tracker = ReuseTracker(max_tracked=4)  # compacts at 1.5 x 4 = 6 blocks, keeping the newest 4
    for key in [1, 2, 3, 4, 5, 6, 7]:  # inserting 7 compacts: 1 and 2 are forgotten
        tracker.use(key)
    tracker.use(3)  # distance 4 (4, 5, 6, 7)
    tracker.use(1)  # forgotten: a first use again
    assert tracker.evicted == 2 and tracker.tracked == 6
    buckets, total, count = tracker.cumulative()
    assert (total, count) == (4.0, 1.0)
    assert dict(buckets)[2.0] == 0 and dict(buckets)[4.0] == 1
    assert buckets[0] == (0.0, 0.0) and buckets[-1][0] == float("inf")


def test_reuse_tracker_under_eviction_sees_every_reuse_within_the_cap() -> None:
    rng = random.Random(11)
    seq = [rng.randrange(300) for _ in range(4000)]
    cap = 50
    tracker = ReuseTracker(max_tracked=cap)
    for key in seq:
        tracker.use(key)
    expected = brute_distances(seq)
    _, _, count = tracker.cumulative()
    assert sum(d < cap for d in expected) <= count <= sum(d < cap * 3 // 2 for d in expected)
    assert tracker.evicted > 0 and tracker.tracked <= cap * 3 // 2


def test_reuse_distance_zero_and_buckets() -> None:
    tracker = ReuseTracker(max_tracked=16)
    for key in [1, 1, 2, 3, 1]:
        tracker.use(key)  # distances 0 and 2
    buckets, total, count = tracker.cumulative()
    assert (total, count) == (2.0, 2.0)
    assert dict(buckets)[0.0] == 1 and dict(buckets)[1.0] == 1 and dict(buckets)[2.0] == 2


# -- registration and config --------------------------------------------------------------------------


def test_registered_disabled_by_default() -> None:
    specs = components()
    config = load_config(None, specs, environ={})
    settings, _ = config.collectors[NAME]
    assert not specs.collectors[NAME].enabled_by_default and not settings.enabled


@pytest.mark.parametrize(("toml", "message"), [
    ("enabled = true\nmodel = 'm'", "endpoint: required"),
    ("enabled = true\nendpoint = 'tcp://127.0.0.1:5557'", "model: required"),
    ("enabled = true\nmodel = 'm'\nendpoint = 'tcp://*:5557'", "bind address"),
    ("enabled = true\nmodel = 'm'\nendpoint = 'http://x:1'", "expected tcp://"),
    ("enabled = true\nmodel = 'm'\nendpoint = 'tcp://h:1'\nrcvhwm = 0", "rcvhwm"),
    ("enabled = true\nmodel = 'm'\nendpoint = 'ipc:///tmp/x'\ndata_parallel_size = 2", "ipc://"),
])
def test_config_errors_are_clear(toml: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        load_config(f"[collectors.{NAME}]\n{toml}\n", components(), environ={})
    assert str(info.value).startswith(f"collectors.{NAME}")


def test_config_valid() -> None:
    text = (f"[collectors.{NAME}]\nenabled = true\nmodel = 'm'\nendpoint = 'tcp://127.0.0.1:5557'\n"
            "replay_endpoint = 'tcp://127.0.0.1:5600'\ndata_parallel_size = 2\n")
    _, options = load_config(text, components(), environ={}).collectors[NAME]
    assert (options.endpoint, options.data_parallel_size, options.engine) == ("tcp://127.0.0.1:5557", 2, "vllm")


@pytest.mark.parametrize("depth", [100, 1000, 100_000])
def test_deep_nesting_is_a_malformed_batch_not_a_recursion_error(depth: int) -> None:
    """1,000 nested one-element arrays (1.5 KB) made msgspec raise RecursionError, which killed the socket
    thread; every input must give a batch or MalformedBatch."""
    decoder = BatchDecoder()
    with pytest.raises(MalformedBatch):
        decoder.decode(b"\x93" + b"\x91" * depth + b"\x01\x90\x00")
    deep_event = msgspec.msgpack.encode([1.0, [{"type": "BlockStored", "block_hashes": [1], "block_size": 0}], 0])
    deep_event = deep_event.replace(b"\xaablock_size\x00", b"\xaablock_size" + b"\x91" * depth + b"\x00")
    try:  # an odd block_size is allowed (kv_residency ignores it): a batch, or MalformedBatch when too deep
        decoder.decode(deep_event)
    except MalformedBatch:
        assert depth >= 1000
