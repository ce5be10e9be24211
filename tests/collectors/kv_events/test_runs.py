"""Runs of messages (collectors/kv_events: the socket thread hands the collector the messages of one rank that
came together, `handle_many`; the sequencer applies a run in order at once, `Sequencer.accept_many` and
`Residency.apply_batches`): whatever the runs, the collector ends exactly where handling the same messages
one at a time leaves it: every reading, and the sampled G1 stores (with a marker before each batch) that
the what-if analysis reads.

The stream mixes what a run must not blur: batches of GPU stores only (the merged path, block_size read on
one batch in 16 and changing once), re-announced blocks, an empty batch, offload stores and removals, an
AllBlocksCleared, a malformed message, a gap, a repeat, a jump held back and confirmed, and a publisher
restart. Payloads are in vLLM 0.33's wire format (agent/tools/reference/vllm_kv_wire.py)."""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pytest
import zmq

from kvscope.agent.core.kv_access import BATCH, KvAccessLog
from kvscope.agent.core.readings import HistogramSample, Sample
from kvscope.agent.tools.reference.vllm_kv_wire import (
    Vllm033AllBlocksCleared,
    Vllm033Batch,
    Vllm033BlockRemoved,
    Vllm033BlockStored,
)
from kvscope.collectors.kv_events.collector import NAME, VllmKvEventsCollector, VllmKvEventsOptions

TS = 1767225600.0
Message = list[bytes]


def stored(hashes: list[int], medium: str = "GPU", block_size: int = 16) -> Vllm033BlockStored:
    return Vllm033BlockStored(hashes, None, [7] * block_size, block_size, None, medium, None)


def message(seq: int, ts: float, events: list[Any]) -> Message:
    return [b"kv", seq.to_bytes(8, "big"), msgspec.msgpack.encode(Vllm033Batch(ts, events, 0))]


def stream() -> list[Message]:
    """About 200 messages: mostly runs of GPU stores, with every case a run must keep apart."""
    rng = random.Random(20261206)
    out: list[Message] = []
    seq, ts, fresh = 0, TS, 1 << 40

    def add(events: list[Any], at: int | None = None) -> None:
        nonlocal seq, ts
        ts += 0.01
        out.append(message(seq if at is None else at, ts, events))
        seq = (seq if at is None else at) + 1

    def gpu(n: int, block_size: int = 16) -> list[Any]:
        nonlocal fresh
        events = []
        for _ in range(n):
            if fresh > (1 << 40) + 8 and rng.random() < 0.3:  # a block already stored: re-announced, a reuse
                events.append(stored([rng.randrange(1 << 40, fresh)], block_size=block_size))
            else:
                fresh += 1
                events.append(stored([fresh], block_size=block_size))
        return events

    for _ in range(40):
        add(gpu(rng.randint(1, 16)))
    add([])  # an empty batch: still a marker for the what-if
    for _ in range(20):
        add(gpu(8, block_size=32))  # G1's block size changes: mixed from here on
    add([stored([fresh + 1, fresh + 2], medium="CPU"), Vllm033BlockRemoved([1 << 40 | 1], "GPU")])
    for _ in range(20):
        add(gpu(4))
    out.append([b"kv", b"\x00" * 3, b"garbage"])  # malformed: a short seq frame
    add([Vllm033BlockRemoved([fresh], "GPU"), Vllm033AllBlocksCleared()])
    for _ in range(30):
        add(gpu(16))
    seq += 3  # a gap of three batches (no replay endpoint: missed)
    for _ in range(20):
        add(gpu(2))
    out.append(out[-5])  # a repeat
    add(gpu(3), at=seq + 50_000)  # a jump beyond max_seq_gap, confirmed by the next batch
    for _ in range(20):
        add(gpu(5))
    add(gpu(6), at=0)  # a restart: seq 0 with a newer ts
    for _ in range(30):
        add(gpu(rng.randint(1, 16)))
    return out


def collector(tenants: bool, rate: float) -> tuple[VllmKvEventsCollector, KvAccessLog]:
    options = VllmKvEventsOptions(endpoint="tcp://127.0.0.1:1", model="m", reuse_sample_rate=rate,
                                  tenants_top_n=4 if tenants else 0, kv_bytes_per_token=36_864)
    options.validate(NAME)
    access = KvAccessLog(1 << 16)
    return VllmKvEventsCollector(options, zmq.Context(), access_log=access), access


def outcome(c: VllmKvEventsCollector, access: KvAccessLog) -> tuple[dict[Any, Any], list[Any]]:
    readings: dict[Any, Any] = {}
    for r in c.collect():
        if isinstance(r, Sample):
            readings[(r.name, r.labels)] = r.value
        elif isinstance(r, HistogramSample):
            readings[(r.name, r.labels)] = (r.buckets, r.sum, r.count)
    (queue,) = access.streams()
    return readings, list(queue.queue)


@pytest.mark.parametrize(("tenants", "rate"), [(False, 1.0), (False, 1 / 16), (True, 1.0)])
def test_runs_of_messages_end_where_one_at_a_time_does(tenants: bool, rate: float) -> None:
    messages = stream()
    alone, alone_access = collector(tenants, rate)
    for m in messages:
        alone.handle(alone.streams[0], m)
    expected = outcome(alone, alone_access)
    readings, queued = expected
    # the stream is what it says: merged runs, a loss, a restart, a malformed message, re-announcements
    events = ("vllm", "m", "0")
    assert readings[("kvscope_kv_events_missed_total", events)] == 3 + 50_000  # the gap, then the jump
    assert readings[("kvscope_kv_publisher_restarts_total", events)] == 1
    assert readings[("kvscope_kv_events_malformed_total", events)] == 1
    assert readings[("kvscope_kv_events_repeated_total", events)] == 1
    assert readings[("kvscope_kv_blocks_reannounced_total", (*events, "G1"))] > 0
    assert queued[0] is BATCH and queued.count(queued[0]) > 100  # one marker per batch, the first entry one
    rng = random.Random(7)
    for sizes in ([len(messages)], [16], [2, 3, 5, 7], None):
        together, access = collector(tenants, rate)
        at = 0
        while at < len(messages):
            n = rng.randint(1, 40) if sizes is None else sizes[at % len(sizes)]
            together.handle_many(together.streams[0], messages[at:at + n])
            at += n
        assert outcome(together, access) == expected, sizes
