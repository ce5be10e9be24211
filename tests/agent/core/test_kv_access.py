"""The KV access stream: what the KV-event collector hands the what-if analysis, and what it costs it."""

from __future__ import annotations

from typing import Any

import msgspec
import zmq

from kvscope.agent.core.kv_access import BATCH, RESET, AccessStream, KvAccessLog, Marker, block_key
from kvscope.agent.tools.reference.vllm_kv_wire import Vllm033Batch, Vllm033BlockRemoved, Vllm033BlockStored
from kvscope.collectors.kv_events.collector import VllmKvEventsCollector, VllmKvEventsOptions
from kvscope.collectors.kv_events.residency import Residency
from kvscope.collectors.kv_events.schema import GpuStoredEvent, RemovedEvent, StoredEventAnyMedium

LABELS = ("vllm", "m", "0")


def stored(*hashes: int, medium: str = "GPU") -> list[Any]:
    return [StoredEventAnyMedium(block_hashes=[h], medium=medium, locality=None, block_size=16) for h in hashes]


def test_g1_stores_reach_the_stream_in_order_with_a_mark_before_each_batch() -> None:
    access = AccessStream(LABELS, 1.0)
    res = Residency(1024, 1.0, access)
    res.apply([GpuStoredEvent(block_hashes=[h], medium="GPU") for h in (1, 2, 3)], gpu_stores_only=True)
    res.apply(stored(9, medium="CPU") + stored(2, 4))  # a G2 store is no access; 2 is re-announced: it is
    res.apply([RemovedEvent(block_hashes=[1], medium="GPU")])
    assert access.take() == [BATCH, 1, 2, 3, BATCH, 2, 4, BATCH]


def test_only_the_sampled_blocks_go_and_a_restart_is_marked() -> None:
    threshold = 2**60  # rate 1/16
    access = AccessStream(LABELS, 1 / 16)
    res = Residency(1024, 1 / 16, access)
    keys = [5, 2**61, 7, 2**63, 2**60 - 1]
    res.apply([GpuStoredEvent(block_hashes=[h], medium="GPU") for h in keys], gpu_stores_only=True)
    res.restart()
    assert access.take() == [BATCH, *(k for k in keys if k < threshold), RESET]


def test_bytes_hashes_become_the_same_uint64() -> None:
    digest = bytes(range(32))
    assert block_key(digest) == int.from_bytes(digest[-8:], "big")
    assert block_key(12345) == 12345


def test_a_full_queue_drops_the_oldest_and_counts_them() -> None:
    log = KvAccessLog(queue_limit=4)
    access = log.stream(LABELS, 1.0)
    res = Residency(1024, 1.0, access)
    res.apply([GpuStoredEvent(block_hashes=[h], medium="GPU") for h in range(1, 7)], gpu_stores_only=True)
    access.meta.sampled_accesses = 6  # what the collector copies from G1's tracker at collection
    taken = access.take()
    assert taken == [3, 4, 5, 6]  # the marker and the first two keys fell out
    assert access.dropped == 2
    assert not any(isinstance(k, Marker) for k in taken)


def test_without_the_analysis_nothing_is_forwarded() -> None:
    res = Residency(1024, 1.0)
    res.apply([GpuStoredEvent(block_hashes=[h], medium="GPU") for h in (1, 2)], gpu_stores_only=True)
    assert res.access is None and all(t.reuse.forward is None for t in res.tiers.values())


def test_the_collector_fills_the_stream_of_each_rank_and_its_metadata() -> None:
    log = KvAccessLog()
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        collector = VllmKvEventsCollector(VllmKvEventsOptions(endpoint="tcp://127.0.0.1:1", model="m",
                                                              data_parallel_size=2, kv_bytes_per_token=36864,
                                                              reuse_sample_rate=1.0), ctx, access_log=log)
        stream = collector.streams[1]
        # 12 twice: the second store re-announces a resident block (kv_cache_report_mode=full), counted exactly
        events: list[Any] = [Vllm033BlockStored([h], None, [1] * 16, 16, None, "GPU", None) for h in (11, 12, 12)]
        events.append(Vllm033BlockRemoved([11], "GPU"))
        payload = msgspec.msgpack.encode(Vllm033Batch(1.0, events, 1))
        collector.handle(stream, [b"", (0).to_bytes(8, "big"), payload])
        collector.collect()
        (rank0, rank1) = log.streams()
        assert rank0.labels == ("vllm", "m", "0") and rank1.labels == ("vllm", "m", "1")
        assert rank1.take() == [BATCH, 11, 12, 12] and rank0.take() == []
        assert (rank1.meta.block_tokens, rank1.meta.bytes_per_token, rank1.meta.sampled_accesses,
                rank1.meta.reannounced, rank1.meta.complete) == (16, 36864, 3, 1, True)
    finally:
        ctx.term()
