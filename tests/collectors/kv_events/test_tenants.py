"""G1 lookups and hits per tenant (vLLM's lora_name) over a real ZMQ socket, and the cardinality cap: 1,000
LoRA adapters make at most tenants_top_n + 1 tenant series per collection, the busiest ones have their own,
and every block counted shows in exactly one series."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from kvscope.agent.app.wiring import build_catalogue
from kvscope.agent.core.readings import Sample
from kvscope.agent.core.store import Store
from kvscope.agent.core.tenants import TenantCap
from kvscope.agent.tools.reference.kv_publisher import BlockStored, KVEventBatch
from kvscope.collectors.kv_events.collector import NAME, VllmKvEventsCollector
from kvscope.collectors.kv_events.tenants import TenantAccounting, TenantBatchDecoder, tenant_of
from testkit.kv_zmq import LAB, Publisher, Subscribers, subscribers

pytestmark = pytest.mark.integration

TENANTS = 1000
TOP_N = 10
LOOKUPS, HITS = "kvscope_tenant_kv_lookup_blocks_total", "kvscope_tenant_kv_hit_blocks_total"


@pytest.fixture
def make_sub() -> Iterator[Subscribers]:
    with subscribers() as made:
        yield made


def blocks_of(tenant: int) -> int:
    return 1 + 1000 // (tenant + 1)  # lora-0 the busiest (1,001 blocks), the long tail 1 or 2


def store(block: int, lora: str | None) -> Any:
    return BlockStored([block], None, [1] * 16, 16, None, "GPU", lora)


def events() -> list[Any]:
    out, block = [], 1
    for tenant in range(TENANTS):
        for _ in range(blocks_of(tenant)):
            out.append(store(block, f"lora-{tenant}"))
            block += 1
    out += [store(block + i, None) for i in range(5)]  # requests without an adapter: tenant "base"
    return out


def send_round(pub: Publisher, first_seq: int, stores: list[Any]) -> int:
    seq = first_seq
    for i in range(0, len(stores), 500):
        pub.send(seq, msgspec.msgpack.encode(KVEventBatch(time.time(), stores[i:i + 500], 0)))
        seq += 1
    return seq


def applied(sub: VllmKvEventsCollector, batches: int) -> None:
    """Waits for the batches without collecting: each collection ranks the tenants, and this test ranks
    exactly once per round."""
    deadline = time.monotonic() + 30
    while sub.streams[0].expected != batches:
        assert time.monotonic() < deadline, f"applied {sub.streams[0].expected} of {batches} batches"
        time.sleep(0.01)


def collect(sub: VllmKvEventsCollector) -> dict[tuple[str, tuple[str, ...]], float]:
    readings = list(sub.collect())
    assert Store(build_catalogue()).ingest(NAME, readings, time.time()).rejected == 0
    return {(r.name, r.labels): r.value for r in readings if isinstance(r, Sample)}


def tenant_series(values: dict[tuple[str, tuple[str, ...]], float]) -> dict[tuple[str, tuple[str, ...]], float]:
    return {key: value for key, value in values.items() if key[0] in (LOOKUPS, HITS)}


def test_a_thousand_lora_tenants_make_top_n_plus_other_series(make_sub: Any) -> None:
    pub = Publisher(make_sub.ctx)
    sub = make_sub(pub.endpoint, tenants_top_n=TOP_N, tenants_max_tracked=100)
    pub.wait_subscribed()
    stores = events()
    total = len(stores)
    last: dict[tuple[str, tuple[str, ...]], float] = {}  # every tenant series ever exported: its last value

    seq = send_round(pub, 0, stores)  # first round: every block new (lookups, no hits)
    applied(sub, seq)
    first = tenant_series(collect(sub))
    last.update(first)
    seq = send_round(pub, seq, stores)  # the same blocks again: re-announced reuses, all G1 hits
    applied(sub, seq)
    v = collect(sub)
    second = tenant_series(v)
    last.update(second)

    for series in (first, second):
        tenants = {labels[3] for _, labels in series}
        assert len(tenants) <= TOP_N + 1 and "other" in tenants
        assert len(series) <= 2 * (TOP_N + 1)  # lookups and G1 hits per tenant shown
    assert {labels[3] for _, labels in second} == {f"lora-{i}" for i in range(TOP_N)} | {"other"}
    # the busiest tenant's second round is its own: 1,001 lookups, all hits
    assert second[(LOOKUPS, (*LAB, "lora-0"))] - first.get((LOOKUPS, (*LAB, "lora-0")), 0.0) == blocks_of(0)
    assert second[(HITS, (*LAB, "lora-0", "G1"))] == blocks_of(0)
    # nothing lost, nothing counted twice: the last values of all series add up to what was sent
    assert sum(value for (name, _), value in last.items() if name == LOOKUPS) == 2 * total
    assert sum(value for (name, _), value in last.items() if name == HITS) == total
    # memory: 100 tenants remembered at each collection and 100 more taken in between two; the other names
    # (lora-200 on, and base, in both rounds) counted for "other" without being kept
    assert v[("kvscope_tenants_forgotten_total", LAB)] == 2 * 100
    late = sum(blocks_of(t) for t in range(200, TENANTS)) + 5
    assert v[("kvscope_tenant_unranked_lookup_blocks_total", LAB)] == 2 * late
    assert v[("kvscope_tenants_folded", LAB)] == 100 - TOP_N
    pub.close()


def test_tenant_mode_off_exports_no_tenant_series(make_sub: Any) -> None:
    pub = Publisher(make_sub.ctx)
    sub = make_sub(pub.endpoint)
    pub.wait_subscribed()
    applied(sub, send_round(pub, 0, [store(1, "lora-a"), store(2, None)]))
    assert not tenant_series(collect(sub))
    pub.close()


@pytest.mark.parametrize("event", [
    # vLLM 0.20-0.23 array form: tag, hashes, parent, tokens, block_size, lora_id, medium, lora_name, extra_keys,
    # group_idx (facts/vllm.md §2.5)
    ["BlockStored", [7], None, [1, 2], 2, 3, "GPU", "lora-x", None, 0],
    # vLLM >= 0.24 map form
    {"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None, "token_ids": [1, 2], "block_size": 2,
     "lora_id": 3, "medium": "GPU", "lora_name": "lora-x", "group_idx": 0},
])
def test_lora_name_is_read_in_both_wire_forms(event: Any) -> None:
    batch = TenantBatchDecoder().decode(msgspec.msgpack.encode([1.5, [event], 0]))
    assert [tenant_of(e) for e in batch.events] == ["lora-x"]
    assert batch.events[0].block_hashes == [7] and batch.events[0].medium == "GPU"


def test_a_batch_from_before_lora_name_counts_for_base() -> None:
    """vLLM 0.11's BlockStored has no lora_name (7 fields)."""
    event = ["BlockStored", [7], None, [1, 2], 2, None, "GPU"]
    batch = TenantBatchDecoder().decode(msgspec.msgpack.encode([1.5, [event], 0]))
    assert [tenant_of(e) for e in batch.events] == ["base"]


def test_stores_without_a_medium_count_in_g1_under_default_medium() -> None:
    """Dynamo's mocker workers send no medium; with default_medium = "GPU" residency puts those stores in G1,
    and so does the tenant count."""
    event = {"type": "BlockStored", "block_hashes": [7, 8], "parent_block_hash": None, "token_ids": [1, 2],
             "block_size": 1, "lora_id": None, "medium": None, "lora_name": "lora-x"}
    batch = TenantBatchDecoder().decode(msgspec.msgpack.encode([1.5, [event], 0]))
    counted, ignored = TenantCap(5, 10), TenantCap(5, 10)
    TenantAccounting(counted, "GPU").account(None, batch.events)
    TenantAccounting(ignored).account(None, batch.events)
    counted.rank()
    ignored.rank()
    assert counted.shown() == [("lora-x", {"lookups": 2, "hits": 0})]
    assert ignored.shown() == []
