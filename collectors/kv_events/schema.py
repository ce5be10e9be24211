"""vLLM KV-event wire format: msgspec structs and a pure decoder for both historic encodings.

Source of truth: shared/facts/vllm.md §2.2–2.6 (vLLM `vllm/distributed/kv_events.py`).

- A batch is a msgpack array `[ts, events, data_parallel_rank]` in every release checked.
- vLLM ≥ 0.24 encodes each event as a map whose first key is `"type"`; unknown keys are ignored here, so
  fields added later (locality 0.26, ownership 0.30, lookahead_token_ids 0.33, ...) cost nothing.
- vLLM ≤ 0.23 encodes each event as a tagged array `["BlockStored", hashes, parent, tokens, ...]`;
  trailing fields a version adds are ignored (msgspec skips extra array elements).

The decoder picks the encoding per message, trying msgspec decoders in order until one fits:
1. a batch of GPU BlockStored only (map or array form): the usual batch while the GPU cache has room,
   and the one the aggregation can take without any per-event check (skipped for 16 batches after a
   batch that is not one, so a stream with evictions or offloading rarely pays for the failed try).
   In map form its block_size is read on the first such batch and then one in 16: reading a field
   costs ~10 ns per event, about 2 % of this path, and G1's block size does not change under a running
   engine (residency.py takes it from the batches that read it);
2. the current map form, then the legacy array form, each first with the mediums and localities vLLM
   is known to send as Literals (one shared str per value, no allocation) and then with plain str;
3. a slow path that also accepts a batch encoded as a map (a short-lived main-branch state) and skips
   event types this module does not know, counting them.
All give the same events for a payload they both accept; only the cost differs (and whether a batch
of GPU stores only had its block_size read).

Decoding declares only the fields residency needs (hashes, medium, locality, and block_size for the
bytes a tier holds): msgspec then skips the token ids, which are most of the bytes, without building
Python objects for them. That alone is about twice as fast as decoding vLLM's full schema
(bench/bench_kv_events.py).

What vLLM's publisher writes (its structs, used to encode fixtures, test streams and the reference
engine's events) is agent/tools/reference/vllm_kv_wire.py: the sidecar only decodes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

import msgspec

STORED, REMOVED, CLEARED = 0, 1, 2
EVENT_TYPES = ("BlockStored", "BlockRemoved", "AllBlocksCleared")
END_SEQ = b"\xff" * 8  # replay end marker: (-1).to_bytes(8, "big", signed=True)

BlockHash = int | bytes  # uint64 (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, the default) or raw bytes


class _Batch(msgspec.Struct, array_like=True, gc=False):
    """`[ts, events, data_parallel_rank]`, as every release sends it. Subclasses type the events; the class
    attributes make a decoded batch a DecodedBatch as it is."""

    wire_format: ClassVar[str] = "map"
    unknown_events: ClassVar[int] = 0
    gpu_stores_only: ClassVar[bool] = False
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


# -- decode side: current map-form events (vLLM >= 0.24) ------------------------------------------

# The medium and locality values vLLM and its connectors are known to send (facts §2.4). Decoding them as
# Literals returns one shared str object per value instead of a new str per event, which is cheaper to
# decode and makes grouping events by tier an identity test. A batch with any other value fails the fast
# decoder and is decoded again with plain str fields (`*AnyMedium`), with the same result.
KnownMedium = Literal["GPU", "CPU", "STORAGE", "FS", "OBJ", "cpu", "CXL"]
KnownLocality = Literal["LOCAL", "REMOTE"]


class StoredEvent(msgspec.Struct, tag="BlockStored", gc=False):
    KIND: ClassVar[int] = STORED
    block_hashes: list[BlockHash]
    block_size: int = 0  # tokens per block hash; 0 when not sent
    medium: KnownMedium | None = None
    locality: KnownLocality | None = None


class RemovedEvent(msgspec.Struct, tag="BlockRemoved", gc=False):
    KIND: ClassVar[int] = REMOVED
    block_hashes: list[BlockHash]
    medium: KnownMedium | None = None
    locality: KnownLocality | None = None


class ClearedEvent(msgspec.Struct, tag="AllBlocksCleared", gc=False):
    KIND: ClassVar[int] = CLEARED
    block_hashes: ClassVar[list[BlockHash]] = []
    medium: ClassVar[str | None] = None
    locality: ClassVar[str | None] = None


class StoredEventAnyMedium(msgspec.Struct, tag="BlockStored", gc=False):
    KIND: ClassVar[int] = STORED
    block_hashes: list[BlockHash]
    block_size: Any = 0  # anything: an odd value must not make the batch malformed (residency.py checks it)
    medium: str | None = None
    locality: str | None = None


class RemovedEventAnyMedium(msgspec.Struct, tag="BlockRemoved", gc=False):
    KIND: ClassVar[int] = REMOVED
    block_hashes: list[BlockHash]
    medium: str | None = None
    locality: str | None = None


MapEvent = StoredEvent | RemovedEvent | ClearedEvent
MapEventAnyMedium = StoredEventAnyMedium | RemovedEventAnyMedium | ClearedEvent


class GpuStoredEvent(msgspec.Struct, tag="BlockStored", gc=False):
    """A BlockStored in a batch of GPU BlockStored events only: the usual batch while the GPU prefix
    cache has room (nothing is evicted) and of kv_cache_report_mode=full re-announcements. Only
    GpuStoresBatch decodes it, so aggregating such a batch needs no per-event type or tier check."""

    KIND: ClassVar[int] = STORED
    locality: ClassVar[str | None] = None  # skipped on the wire: G1 does not depend on it
    block_size: ClassVar[None] = None  # not read here (about 2 % of this path): see GpuSizedStoredEvent
    block_hashes: list[BlockHash]
    medium: Literal["GPU"]


class GpuSizedStoredEvent(msgspec.Struct, tag="BlockStored", gc=False):
    """GpuStoredEvent with block_size read: BatchDecoder decodes one in _GPU_SIZE_EVERY batches of GPU
    stores only with it, which keeps G1's block size known at a sixteenth of the cost."""

    KIND: ClassVar[int] = STORED
    locality: ClassVar[str | None] = None
    block_hashes: list[BlockHash]
    medium: Literal["GPU"]
    block_size: int = 0


class GpuStoresBatch(_Batch):
    gpu_stores_only: ClassVar[bool] = True
    events: list[GpuStoredEvent]


class GpuSizedStoresBatch(_Batch):
    gpu_stores_only: ClassVar[bool] = True
    events: list[GpuSizedStoredEvent]


class MapBatch(_Batch):
    events: list[MapEvent]


class MapBatchAnyMedium(_Batch):
    events: list[MapEventAnyMedium]


# -- decode side: legacy tagged-array events (vLLM <= 0.23) ----------------------------------------


class LegacyStoredEvent(msgspec.Struct, tag="BlockStored", array_like=True, gc=False):
    KIND: ClassVar[int] = STORED
    locality: ClassVar[str | None] = None  # the array form predates locality (0.26)
    block_hashes: list[BlockHash]
    # Positional fields before medium. Typed where decoding is free (nil, small ints come from CPython's
    # cache) or as cheap as skipping; token_ids stays undecoded. An odd value fails over to the
    # *AnyMedium struct below, which takes anything there.
    parent_block_hash: BlockHash | None
    token_ids: msgspec.Raw
    block_size: int
    lora_id: int | None
    medium: KnownMedium | None


class LegacyRemovedEvent(msgspec.Struct, tag="BlockRemoved", array_like=True, gc=False):
    KIND: ClassVar[int] = REMOVED
    locality: ClassVar[str | None] = None
    block_hashes: list[BlockHash]
    medium: KnownMedium | None


class LegacyClearedEvent(msgspec.Struct, tag="AllBlocksCleared", array_like=True, gc=False):
    KIND: ClassVar[int] = CLEARED
    block_hashes: ClassVar[list[BlockHash]] = []
    medium: ClassVar[str | None] = None
    locality: ClassVar[str | None] = None


class LegacyStoredEventAnyMedium(msgspec.Struct, tag="BlockStored", array_like=True, gc=False):
    KIND: ClassVar[int] = STORED
    locality: ClassVar[str | None] = None
    block_hashes: list[BlockHash]
    parent_block_hash: msgspec.Raw
    token_ids: msgspec.Raw
    block_size: Any
    lora_id: msgspec.Raw
    medium: str | None


class LegacyRemovedEventAnyMedium(msgspec.Struct, tag="BlockRemoved", array_like=True, gc=False):
    KIND: ClassVar[int] = REMOVED
    locality: ClassVar[str | None] = None
    block_hashes: list[BlockHash]
    medium: str | None


LegacyEvent = LegacyStoredEvent | LegacyRemovedEvent | LegacyClearedEvent
LegacyEventAnyMedium = LegacyStoredEventAnyMedium | LegacyRemovedEventAnyMedium | LegacyClearedEvent


class LegacyGpuStoredEvent(msgspec.Struct, tag="BlockStored", array_like=True, gc=False):
    """GpuStoredEvent's array form: only LegacyGpuStoresBatch decodes it."""

    KIND: ClassVar[int] = STORED
    locality: ClassVar[str | None] = None
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: msgspec.Raw
    block_size: int
    lora_id: int | None
    medium: Literal["GPU"]


class LegacyGpuStoresBatch(_Batch):
    wire_format: ClassVar[str] = "array"
    gpu_stores_only: ClassVar[bool] = True
    events: list[LegacyGpuStoredEvent]


class LegacyBatch(_Batch):
    wire_format: ClassVar[str] = "array"
    events: list[LegacyEvent]


class LegacyBatchAnyMedium(_Batch):
    wire_format: ClassVar[str] = "array"
    events: list[LegacyEventAnyMedium]


Event = (GpuStoredEvent | GpuSizedStoredEvent | LegacyGpuStoredEvent | MapEvent | MapEventAnyMedium | LegacyEvent
         | LegacyEventAnyMedium)


class MalformedBatch(ValueError):
    """The payload is not a KV-event batch in any known encoding."""


class DecodedBatch(Protocol):
    """What BatchDecoder returns. The fast decoders' batch structs are returned as they are (their wire
    format and flags are class attributes), so the usual batch costs no second object."""

    @property
    def ts(self) -> float: ...
    @property
    def events(self) -> list[Any]: ...  # Event instances; Any so the hot loop reads .KIND without narrowing
    @property
    def data_parallel_rank(self) -> int | None: ...
    @property
    def wire_format(self) -> str: ...  # "map" (vLLM >= 0.24) or "array" (<= 0.23)
    @property
    def unknown_events(self) -> int: ...  # events of a type this decoder does not know (a newer vLLM), skipped
    @property
    def gpu_stores_only(self) -> bool: ...  # every event is a GPU BlockStored (decoded as GpuStoredEvent)


@dataclass(slots=True)
class SlowBatch:
    """A batch the slow path decoded event by event (see BatchDecoder._decode_slow)."""

    ts: float
    events: list[Any]
    data_parallel_rank: int | None
    wire_format: str
    unknown_events: int = 0
    gpu_stores_only: bool = False


# After a batch that is not GPU stores only, skip that decoder for this many batches: a stream with
# offloading or evictions then wastes at most one failed partial decode in this many + 1.
_GPU_STORES_BACKOFF = 16
# Of the map-form batches of GPU stores only, the first and then one in this many are decoded with
# block_size read (GpuSizedStoredEvent); every other decoder always reads it.
_GPU_SIZE_EVERY = 16


class BatchDecoder:
    """Decodes one msgpack payload into a DecodedBatch. No I/O; the events depend on the payload only.
    Two counters choose which decoder to try first (a back-off) and whether a batch of GPU stores only
    is read with its block_size (one in _GPU_SIZE_EVERY; otherwise its events' block_size is None)."""

    def __init__(self) -> None:
        # Batches of GPU stores only, in either wire form (a map stream fails the array one at its first
        # event, and the other way round, which costs little). Tried first unless backing off.
        self._gpu_map = msgspec.msgpack.Decoder(GpuStoresBatch).decode
        self._gpu_map_sized = msgspec.msgpack.Decoder(GpuSizedStoresBatch).decode
        self._gpu_array = msgspec.msgpack.Decoder(LegacyGpuStoresBatch).decode
        self._gpu_backoff = 0
        self._gpu_unsized = 0  # map-form GPU-stores batches to decode without block_size before the next
        # Then tried in order; the first that fits wins. Known mediums first (the common case costs one
        # decode); the plain-str structs give the same result for anything else.
        self._fast: tuple[Callable[[bytes | memoryview], DecodedBatch], ...] = (
            msgspec.msgpack.Decoder(MapBatch).decode,
            msgspec.msgpack.Decoder(MapBatchAnyMedium).decode,
            msgspec.msgpack.Decoder(LegacyBatch).decode,
            msgspec.msgpack.Decoder(LegacyBatchAnyMedium).decode,
        )
        self._outer = msgspec.msgpack.Decoder(list[msgspec.Raw] | dict[str, msgspec.Raw])
        self._raw_list = msgspec.msgpack.Decoder(list[msgspec.Raw])
        self._map_event = msgspec.msgpack.Decoder(MapEventAnyMedium)
        self._legacy_event = msgspec.msgpack.Decoder(LegacyEventAnyMedium)
        self._any = msgspec.msgpack.Decoder()

    def decode(self, payload: bytes | memoryview) -> DecodedBatch:
        """The batch in `payload`, or MalformedBatch: whatever the bytes, nothing else escapes.

        msgspec raises RecursionError for deeply nested input (1,000 one-element arrays are 1 KB) and
        could raise other errors on inputs nobody tried; the socket thread must only ever see
        MalformedBatch, which it counts and skips."""
        try:
            return self._decode(payload)
        except MalformedBatch:
            raise
        except Exception as exc:  # RecursionError, MemoryError (a subclass of Exception), anything else
            raise MalformedBatch(f"{type(exc).__name__}: {exc}") from None

    def _decode(self, payload: bytes | memoryview) -> DecodedBatch:
        if self._gpu_backoff:
            self._gpu_backoff -= 1
        else:
            try:
                if self._gpu_unsized:
                    batch = self._gpu_map(payload)
                    self._gpu_unsized -= 1
                    return batch
                sized = self._gpu_map_sized(payload)
                self._gpu_unsized = _GPU_SIZE_EVERY - 1
                return sized
            except msgspec.DecodeError:
                pass
            try:
                return self._gpu_array(payload)
            except msgspec.DecodeError:
                self._gpu_backoff = _GPU_STORES_BACKOFF
        for decode in self._fast:
            try:
                return decode(payload)
            except msgspec.DecodeError:
                continue
        return self._decode_slow(payload)

    def _decode_slow(self, payload: bytes | memoryview) -> DecodedBatch:
        try:
            outer = self._outer.decode(payload)
            if isinstance(outer, dict):
                ts_raw, events_raw, rank_raw = outer["ts"], outer["events"], outer.get("data_parallel_rank")
            elif len(outer) in (2, 3):
                ts_raw, events_raw = outer[0], outer[1]
                rank_raw = outer[2] if len(outer) == 3 else None
            else:
                raise MalformedBatch(f"batch array has {len(outer)} elements, expected 3")
            ts = self._any.decode(ts_raw)
            rank = self._any.decode(rank_raw) if rank_raw is not None else None
            if not isinstance(ts, int | float) or isinstance(ts, bool):
                raise MalformedBatch("batch ts is not a number")
            if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool)):
                raise MalformedBatch("batch data_parallel_rank is not an integer")
            events: list[Any] = []
            unknown = 0
            forms = set()
            for raw in self._raw_list.decode(events_raw):
                event, form = self._decode_event(raw)
                if event is None:
                    unknown += 1
                else:
                    events.append(event)
                    forms.add(form)
        except (msgspec.DecodeError, KeyError) as exc:
            raise MalformedBatch(str(exc)) from None
        wire = "array" if forms == {"array"} else "map"
        return SlowBatch(float(ts), events, rank, wire, unknown)

    def _decode_event(self, raw: msgspec.Raw) -> tuple[Event | None, str]:
        try:
            return self._map_event.decode(raw), "map"
        except msgspec.DecodeError:
            pass
        try:
            return self._legacy_event.decode(raw), "array"
        except msgspec.DecodeError:
            pass
        # A well-formed event of a type we do not know is skipped and counted; anything else is garbage.
        value = self._any.decode(raw)
        tag = value.get("type") if isinstance(value, dict) else (
            value[0] if isinstance(value, list) and value else None)
        if isinstance(tag, str) and tag not in EVENT_TYPES:
            return None, ""
        raise MalformedBatch(f"event does not match the {tag!r} schema")
