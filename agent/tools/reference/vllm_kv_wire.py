"""vLLM's KV-event publisher structs, for writing the wire format byte-for-byte as vLLM does.

The sidecar only decodes (collectors/kv_events/schema.py); these structs are for what publishes: the
reference engine's KV-event publisher, the fixtures and test streams, and the benchmarks' load. They
mirror `vllm/distributed/kv_events.py` (shared/facts/vllm.md §2.2–2.6): `Vllm033*` the map form of
vLLM ≥ 0.24 (as 0.33 writes it), `Vllm020*` the tagged-array form of vLLM ≤ 0.23.
"""

from __future__ import annotations

from typing import Any

import msgspec

from kvscope.collectors.kv_events.schema import BlockHash


class _Vllm033Event(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class Vllm033BlockStored(_Vllm033Event, tag="BlockStored"):
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class Vllm033BlockRemoved(_Vllm033Event, tag="BlockRemoved"):
    block_hashes: list[BlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class Vllm033AllBlocksCleared(_Vllm033Event, tag="AllBlocksCleared"):
    pass


class Vllm033Batch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Vllm033BlockStored | Vllm033BlockRemoved | Vllm033AllBlocksCleared]
    data_parallel_rank: int | None = None


class _Vllm020Event(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class Vllm020BlockStored(_Vllm020Event, tag="BlockStored"):
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None


class Vllm020BlockRemoved(_Vllm020Event, tag="BlockRemoved"):
    block_hashes: list[BlockHash]
    medium: str | None
    group_idx: int | None = None


class Vllm020AllBlocksCleared(_Vllm020Event, tag="AllBlocksCleared"):
    pass


class Vllm020Batch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Vllm020BlockStored | Vllm020BlockRemoved | Vllm020AllBlocksCleared]
    data_parallel_rank: int | None = None
