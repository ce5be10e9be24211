"""The typed streams that pass between stages beside the store.

Most of what stages share goes through the store. A few things do not fit a series: the request records
an OTLP receiver hands the correlation analysis, the KV block accesses the KV-event collector hands the
what-if analysis, the GPU busy/idle samples the NVML collector keeps, each window's attributed requests,
the routes an analysis serves beside /metrics. Each is a `Stream` here, and every collector, analysis and
sink spec says, in its `StreamUse`, which streams it writes, reads or offers. The wiring connects them
from those declarations alone:

- a stream with `make` is a buffer the wiring makes once, when an enabled stage writes it and one reads it
  (or, with `needs_reader=False`, whenever one writes it), sized by the largest size its readers ask for
  from their options; every writer and reader gets the same object;
- a stream without `make` is offered by a built stage (the NVML collector offers its GPU intervals, the
  what-if analysis its routes and the receiver of the attributed requests it keeps, a sink its request
  receiver); readers get the first offer (`Streams.get`) or every offer (`Streams.every`, a live list:
  a stage built later still reaches a reader built before it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from kvscope.agent.core.kv_access import KvAccessLog
from kvscope.agent.core.records import AttributedRequest, RecordBuffer

__all__ = ["ATTRIBUTED_REQUESTS", "GPU_INTERVALS", "HTTP_ROUTES", "KV_ACCESS", "REQUEST_RECORDS",
           "GpuIntervals", "RequestSink", "Route", "Stream", "StreamUse", "Streams"]

T = TypeVar("T")

Route = Callable[[], tuple[bytes, str]]  # a GET route beside /metrics: (body, content type)


class GpuIntervals(Protocol):
    """Recent busy/idle samples per GPU (the NVML collector, or the reference engine's device slot)."""

    def gpus(self) -> dict[str, str]: ...
    def recent_samples(self, gpu: str) -> list[tuple[float, float, float]]: ...


class RequestSink(Protocol):
    """Receives each window's attributed requests (called from the analysis' thread; must not block long)."""

    def write(self, results: Sequence[AttributedRequest]) -> None: ...


@dataclass(frozen=True, eq=False)
class Stream(Generic[T]):
    name: str
    description: str
    make: Callable[[int], T] | None = None  # the buffer the wiring makes, given its size; None: offered
    default_size: int = 0  # the size when no reader asks for one
    needs_reader: bool = True  # False: made whenever a stage writes it (its writer needs somewhere to put it)

    def __repr__(self) -> str:
        return f"Stream({self.name})"


REQUEST_RECORDS: Stream[RecordBuffer] = Stream(
    "request_records", "per-request records from the engine's spans, for the correlation analysis",
    RecordBuffer, RecordBuffer.capacity, needs_reader=False)
KV_ACCESS: Stream[KvAccessLog] = Stream(
    "kv_access", "the KV-event collector's sampled G1 block accesses, for the what-if analysis",
    KvAccessLog, 1 << 20)
GPU_INTERVALS: Stream[GpuIntervals] = Stream(
    "gpu_intervals", "recent busy/idle samples per GPU, for fetch stall")
ATTRIBUTED_REQUESTS: Stream[RequestSink] = Stream(
    "attributed_requests", "receivers of each window's attributed requests (JSON Lines, OTLP traces, what-if)")
HTTP_ROUTES: Stream[Mapping[str, Route]] = Stream(
    "http_routes", "GET routes served beside /metrics, behind the same TLS and auth")


@dataclass(frozen=True, slots=True)
class StreamUse:
    """What a stage does with streams. `reads` maps each stream it reads to the size it asks for, from
    its options (None: no size of its own); `offers` maps each stream it offers to what of the built stage
    is offered."""

    writes: tuple[Stream[Any], ...] = ()
    reads: Mapping[Stream[Any], Callable[[Any], int] | None] = field(default_factory=dict)
    offers: Mapping[Stream[Any], Callable[[Any], Any]] = field(default_factory=dict)


class Streams:
    """The streams of one agent: what the wiring made and what built stages offered, by stream."""

    def __init__(self) -> None:
        self._made: dict[Stream[Any], Any] = {}
        self._offered: dict[Stream[Any], list[Any]] = {}

    def make(self, stream: Stream[T], size: int) -> T:
        assert stream.make is not None, f"{stream.name} is offered by a stage, not made"
        made: T = stream.make(size)
        self._made[stream] = made
        return made

    def offer(self, stream: Stream[T], value: T) -> None:
        self._offered.setdefault(stream, []).append(value)

    def get(self, stream: Stream[T]) -> T | None:
        """The made buffer, or the first offer; None when the stream has neither."""
        if stream in self._made:
            return self._made[stream]  # type: ignore[no-any-return]
        offers = self._offered.get(stream)
        return offers[0] if offers else None

    def require(self, stream: Stream[T]) -> T:
        found = self.get(stream)
        if found is None:
            raise LookupError(f"no {stream.name} stream: {stream.description}")
        return found

    def every(self, stream: Stream[T]) -> list[T]:
        """Every offer, in the order they were made (a live list: offers made later are in it too)."""
        return self._offered.setdefault(stream, [])
