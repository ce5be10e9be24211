"""The what-if profile: everything a prediction needs about one KV-event publisher, as one document.

The agent builds it from what it holds (the sampled access trace, today's tier sizes, the engine's
counters, the correlation analysis' cost model and the recent requests); it serves it to `kvscope
what-if --url` (GET /whatif/profile) and writes it to a file (`[analyses.whatif] recording`), which is
what `kvscope what-if --recording FILE` reads. JSON, one object:

    {"format": "kvscope.whatif.profile", "version": 1, "written": <unix seconds>, "streams": [<stream>...]}

A stream (StreamProfile below) carries its sampled access trace as base64 of little-endian uint64 block
hashes, and how many of them each engine step (KV-event batch) made, as base64 of little-endian uint32;
the first `warmup` accesses only warm the models up (their counts are not in `measured`).
"""

from __future__ import annotations

import base64
import json
import math
import time
from array import array
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kvscope.agent.analyses.whatif.hierarchy import POLICIES, TIERS, Policy
from kvscope.agent.analyses.whatif.sizes import Geometry

FORMAT = "kvscope.whatif.profile"
VERSION = 1


# Spatial sampling keeps a block with probability `rate`, so the sampled working set (and every size the
# replay stands for) has a relative standard error of about 1/sqrt(distinct sampled blocks): 400 keeps it
# near 5 %. With fewer, a prediction printed at the default rate can be confidently wrong: on a live vLLM
# with a small working set, 1/16 predicted a G1 share of 58 % at 2x G1 where a re-run measured 72 %.
MIN_DISTINCT_SAMPLED = 400


@dataclass(frozen=True, slots=True)
class TierFetch:
    """How fast a tier's blocks reach G1, as the correlation analysis measured it."""

    bandwidth: float | None  # bytes/s over the onboard link leaving the tier (None: never measured)
    latency: float = 0.0  # seconds per fetch (the intercept of per-fetch samples; 0 without them)
    via: str | None = None  # the tier its blocks pass through on their way to G1 ("G2": host memory), if any


@dataclass(frozen=True, slots=True)
class Cost:
    """The correlation analysis' prefill cost model and fetch models for this engine."""

    a: float  # s/token
    b: float  # s/token²
    confident: bool  # False: the model kept its prior's shape (kvscope_prefill_cost_confident 0)
    fetch: dict[str, TierFetch] = field(default_factory=dict)
    # seconds per byte of storing a block evicted from G1 into each tier, from the engine's transfer counters
    store: dict[str, float | None] = field(default_factory=dict)

    def compute(self, new: float, ctx: float) -> float:
        return self.a * new + self.b * new * (2.0 * ctx + new)


@dataclass(frozen=True, slots=True)
class RequestSample:
    """One recent request as the correlation analysis attributed it."""

    ttft: float
    prompt_tokens: int
    cached_tokens: int | None  # reused from any tier; None: the source does not say (vLLM's span)
    offload: float | None = None  # eviction and store work inside its TTFT, where measured (reference engine)


@dataclass(frozen=True, slots=True)
class Measured:
    """The engine's own counters over the counted part of the trace."""

    lookup_tokens: float = 0.0
    hit_tokens: dict[str, float] = field(default_factory=dict)  # G1..G4 (and unattributed)

    def share(self, tier: str) -> float:
        return self.hit_tokens.get(tier, 0.0) / self.lookup_tokens if self.lookup_tokens > 0 else math.nan


@dataclass
class StreamProfile:
    engine: str
    model: str
    dp_rank: str
    sample_rate: float
    block_tokens: int
    bytes_per_token: int
    policy: Policy
    today: list[int | None]  # blocks per tier G1..G4 today (None: unknown, taken as off)
    size_sources: dict[str, str] = field(default_factory=dict)  # tier -> "engine" | "config"
    trace: array[int] = field(default_factory=lambda: array("Q"))  # sampled G1 accesses, in order
    batches: array[int] = field(default_factory=lambda: array("I"))  # accesses per engine step, in order
    warmup: int = 0  # leading accesses of the trace not counted in `measured`
    measured: Measured = field(default_factory=Measured)
    cost: Cost | None = None
    requests: list[RequestSample] = field(default_factory=list)
    max_blocks: int = 1 << 17  # what one model may hold (sampled blocks)
    dropped: int = 0  # sampled accesses lost before the analysis read them
    g1_hits_seen: float | None = None  # re-announced G1 blocks' tokens / the engine's G1 hit tokens (None: no hits)
    notes: list[str] = field(default_factory=list)
    requests_per_hour: float | None = None  # attributed requests delivered per hour (None: not measured yet)

    @property
    def geometry(self) -> Geometry | None:
        return Geometry(self.block_tokens, self.bytes_per_token) if self.block_tokens > 0 else None

    @property
    def counted(self) -> int:
        return max(0, len(self.trace) - self.warmup)

    @property
    def distinct_sampled(self) -> int:
        """Distinct blocks the sample holds: what the sizes it predicts for stand on."""
        return len(set(self.trace))

    @property
    def sample_too_small(self) -> bool:
        """Sampled (rate < 1) with fewer than MIN_DISTINCT_SAMPLED distinct blocks: too few to trust."""
        return self.sample_rate < 1.0 and self.distinct_sampled < MIN_DISTINCT_SAMPLED

    def rate_to_trust(self) -> float:
        """The sample rate that would hold MIN_DISTINCT_SAMPLED distinct blocks of this working set (≤ 1)."""
        seen = max(1, self.distinct_sampled)
        return min(1.0, self.sample_rate * MIN_DISTINCT_SAMPLED / seen)

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items()
               if k not in ("trace", "batches", "measured", "cost", "requests")}
        out["trace"] = _encode(self.trace)
        out["batches"] = _encode(self.batches)
        out["measured"] = asdict(self.measured)
        out["cost"] = None if self.cost is None else {**asdict(self.cost), "fetch": {
            t: asdict(f) for t, f in self.cost.fetch.items()}}
        out["requests"] = [[r.ttft, r.prompt_tokens, r.cached_tokens, r.offload] for r in self.requests]
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StreamProfile:
        policy = d.get("policy", "inclusive")
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}")
        trace, batches = _decode(d.get("trace", ""), "Q"), _decode(d.get("batches", ""), "I")
        if sum(batches) != len(trace):
            raise ValueError("the trace's batches do not add up to its accesses")
        today = list(d["today"])
        if len(today) != len(TIERS):
            raise ValueError(f"today: expected {len(TIERS)} tier sizes")
        cost = d.get("cost")
        return cls(
            engine=str(d["engine"]), model=str(d["model"]), dp_rank=str(d["dp_rank"]),
            sample_rate=float(d["sample_rate"]), block_tokens=int(d["block_tokens"]),
            bytes_per_token=int(d["bytes_per_token"]), policy=policy,
            today=[None if t is None else int(t) for t in today], size_sources=dict(d.get("size_sources", {})),
            trace=trace, batches=batches, warmup=int(d.get("warmup", 0)),
            measured=Measured(float(d["measured"]["lookup_tokens"]),
                              {str(k): float(v) for k, v in d["measured"]["hit_tokens"].items()}),
            cost=None if cost is None else Cost(float(cost["a"]), float(cost["b"]), bool(cost["confident"]), {
                str(t): TierFetch(None if f["bandwidth"] is None else float(f["bandwidth"]), float(f["latency"]),
                                  f.get("via")) for t, f in cost["fetch"].items()},
                {str(t): None if v is None else float(v) for t, v in cost.get("store", {}).items()}),
            requests=[RequestSample(float(r[0]), int(r[1]), None if r[2] is None else int(r[2]),
                                    None if len(r) < 4 or r[3] is None else float(r[3])) for r in d["requests"]],
            max_blocks=int(d.get("max_blocks", 1 << 17)), dropped=int(d.get("dropped", 0)),
            g1_hits_seen=None if d.get("g1_hits_seen") is None else float(d["g1_hits_seen"]),
            notes=[str(n) for n in d.get("notes", [])],
            requests_per_hour=None if d.get("requests_per_hour") is None else float(d["requests_per_hour"]),
        )


def _little_endian() -> bool:
    return array("H", [1]).tobytes() == b"\x01\x00"


def _encode(values: array[int]) -> str:
    out = array(values.typecode, values)
    if not _little_endian():
        out.byteswap()
    return base64.b64encode(out.tobytes()).decode("ascii")


def _decode(text: str, typecode: str) -> array[int]:
    out = array(typecode)
    raw = base64.b64decode(text, validate=True)
    if len(raw) % out.itemsize:
        raise ValueError(f"not a whole number of {out.itemsize}-byte values")
    out.frombytes(raw)
    if not _little_endian():
        out.byteswap()
    return out


def batches_of(trace: array[int], batches: array[int], start: int = 0) -> list[list[int]]:
    """The trace cut into its engine steps (a list of keys each), from access `start` on (a batch that
    starts before it is cut at it)."""
    keys = trace.tolist()  # one int object per access, shared by every model
    out, at = [], 0
    for n in batches:
        end = at + n
        if end > start:
            out.append(keys[max(at, start):end])
        at = end
    return out


def dumps(streams: Sequence[StreamProfile], written: float | None = None) -> bytes:
    doc = {"format": FORMAT, "version": VERSION, "written": time.time() if written is None else written,
           "streams": [s.to_json() for s in streams]}
    return json.dumps(doc, separators=(",", ":")).encode()


def loads(data: bytes | str) -> list[StreamProfile]:
    doc = json.loads(data)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"not a kvscope what-if profile (expected format {FORMAT!r})")
    if doc.get("version") != VERSION:
        raise ValueError(f"profile version {doc.get('version')!r}: this kvscope reads version {VERSION}")
    return [StreamProfile.from_json(s) for s in doc["streams"]]
