"""KV events as Dynamo 1.6.1's mocker workers published them (tests/fixtures/dynamo/live-1.6.1/, captured from a
live run; README there): decoded as they are, and replayed over real ZMQ into the collector, whose counts must
equal the workers' own counters on the pages captured at the same moment."""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvscope.collectors.kv_events.collector import NAME, VllmKvEventsOptions
from kvscope.collectors.kv_events.schema import BatchDecoder
from testkit.kv_zmq import Publisher, Subscribers, subscribers, values, wait_for
from testkit.paths import FIXTURES

LIVE = FIXTURES / "dynamo" / "live-1.6.1"
WORKERS = (1, 2)
BLOCK_TOKENS = 32  # the mocker's --block-size
G1_BLOCKS = 64  # its --num-gpu-blocks-override


def messages(worker: int) -> list[list[bytes]]:
    """[topic, seq, payload] of each message the worker published, in order (hex frames, one message a line)."""
    text = (LIVE / f"kv-events-worker-{worker}.txt").read_text()
    return [[bytes.fromhex(frame) for frame in line.split(" ")] for line in text.splitlines()]


def worker_counted(worker: int) -> Counter[str]:
    """The worker's own count of the events its publisher accepted, by type, off its captured /metrics."""
    counted: Counter[str] = Counter()
    for family in text_string_to_metric_families((LIVE / f"worker-{worker}.prom").read_text()):
        for s in family.samples:
            if s.name == "dynamo_component_kv_publisher_zmq_events_total" and s.labels["stage"] == "accepted":
                counted[{"stored": "BlockStored", "removed": "BlockRemoved"}[s.labels["event_type"]]] += int(s.value)
    return counted


def blocks(worker: int, kind: str) -> int:
    return sum(len(e["block_hashes"]) for m in messages(worker) for e in msgspec.msgpack.decode(m[2])[1]
               if e["type"] == kind)


@pytest.mark.parametrize("worker", WORKERS)
def test_the_capture_is_whole_and_in_vllms_map_form_without_a_medium(worker: int) -> None:
    captured = messages(worker)
    assert [int.from_bytes(m[1], "big") for m in captured] == list(range(len(captured)))  # from seq 0, no gap
    assert {m[0] for m in captured} == {b""}  # empty topic
    fields = {e["type"]: set(e) for m in captured for e in msgspec.msgpack.decode(m[2])[1]}
    assert fields.pop("BlockStored") == {"type", "block_hashes", "parent_block_hash", "token_ids", "block_size",
                                         "group_idx"}
    assert fields in ({}, {"BlockRemoved": {"type", "block_hashes", "group_idx"}})
    decoder = BatchDecoder()
    for m in captured:
        batch = decoder.decode(m[2])
        assert batch.data_parallel_rank == 0 and batch.unknown_events == 0
        assert all(e.medium is None and e.block_size in (None, BLOCK_TOKENS) for e in batch.events
                   if hasattr(e, "block_size"))


@pytest.fixture
def make_sub() -> Iterator[Subscribers]:
    with subscribers() as made:
        yield made


def replay_both(make_sub: Subscribers, **options: Any) -> dict[tuple[str, tuple[str, ...]], float]:
    """Both workers' captures published on two consecutive ports, as the e2e stack does (ranks 0 and 1 of one
    collector); the collector's values once every captured event has arrived."""
    ctx = make_sub.ctx
    while True:  # a port whose next one is free too
        first = Publisher(ctx)
        port = int(first.endpoint.rsplit(":", 1)[1])
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                first.close()
                continue
        break
    second = Publisher(ctx, f"tcp://127.0.0.1:{port + 1}")
    sub = make_sub(first.endpoint, data_parallel_size=2, **options)
    for worker, pub in zip(WORKERS, (first, second), strict=True):
        pub.wait_subscribed()
        for topic, seq, payload in messages(worker):
            assert topic == b""
            pub.send(int.from_bytes(seq, "big"), payload)
    for rank, worker in enumerate(WORKERS):
        counted = worker_counted(worker)
        wait_for(sub, "kvscope_kv_events_total", ("vllm", "test-model", str(rank), "BlockStored"),
                 counted["BlockStored"])
    return values(sub)


@pytest.mark.parametrize("bytes_per_token", [512, 36_864])  # the mocker's tiny model; the seeds' gpt-oss-120b
def test_replayed_events_equal_the_workers_own_counts_and_fill_g1(make_sub: Subscribers, bytes_per_token: int) -> None:
    v = replay_both(make_sub, default_medium="GPU", kv_bytes_per_token=bytes_per_token)
    for rank, worker in enumerate(WORKERS):
        lab = ("vllm", "test-model", str(rank))
        counted = worker_counted(worker)
        assert counted["BlockStored"] > 0
        for kind in ("BlockStored", "BlockRemoved"):
            assert v[("kvscope_kv_events_total", (*lab, kind))] == counted[kind], (worker, kind)
        for fault in ("missed", "malformed", "dropped"):
            assert v[(f"kvscope_kv_events_{fault}_total", lab)] == 0
        resident = blocks(worker, "BlockStored") - blocks(worker, "BlockRemoved")
        assert 0 < resident <= G1_BLOCKS
        assert v[("kvscope_kv_resident_blocks", (*lab, "G1"))] == resident
        assert v[("kvscope_kv_residency_known", (*lab, "G1"))] == 1
        assert v[("kvscope_tier_used_bytes", (*lab, "G1"))] == resident * BLOCK_TOKENS * bytes_per_token
        assert ("kvscope_kv_resident_blocks", (*lab, "unattributed")) not in v


def test_without_default_medium_they_stay_unattributed(make_sub: Subscribers) -> None:
    v = replay_both(make_sub)
    lab = ("vllm", "test-model", "0")
    resident = blocks(1, "BlockStored") - blocks(1, "BlockRemoved")
    assert v[("kvscope_kv_resident_blocks", (*lab, "unattributed"))] == resident
    assert v[("kvscope_kv_resident_blocks", (*lab, "G1"))] == 0


@pytest.mark.parametrize("medium", ["HBM", "CXL", "gpu0"])
def test_a_default_medium_kvscope_cannot_place_is_refused(medium: str) -> None:
    options = VllmKvEventsOptions(endpoint="tcp://127.0.0.1:5557", model="m", default_medium=medium)
    with pytest.raises(ValueError, match="default_medium: must be GPU, CPU, STORAGE"):
        options.validate(NAME)
