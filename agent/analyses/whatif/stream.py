"""One publisher's part of the what-if analysis: its models, its trace and what it has exported.

The models (one hierarchy at today's sizes, one per scenario) are fed every sampled access as it comes,
one engine step at a time, so the exported counters cover everything since they were built. The trace
keeps the latest accesses for `kvscope what-if`, which replays them at any sizes: when it is full its
older half is dropped and what is left becomes the warm-up of the next replay (the counted period, and
the engine counters measured over it, start again then).
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvscope.agent.analyses.whatif.hierarchy import MISS, Chains, Hierarchy, Policy, scaled_capacities
from kvscope.agent.analyses.whatif.predict import Outcomes, feed
from kvscope.agent.analyses.whatif.profile import Measured, RequestSample, batches_of
from kvscope.agent.analyses.whatif.sizes import Geometry, Scenario
from kvscope.agent.core.kv_access import RESET, AccessStream, Entry, Marker, block_key


@dataclass
class Model:
    scenario: Scenario
    blocks: list[int]
    clamped: bool
    hierarchy: Hierarchy
    outcomes: Outcomes = field(default_factory=Outcomes)


@dataclass(frozen=True, slots=True)
class Setup:
    """What the models are built for; a change rebuilds them."""

    today: tuple[int | None, ...]
    geometry: Geometry
    policy: Policy
    sample_rate: float
    scenarios: tuple[Scenario, ...]


@dataclass
class Counters:
    """Engine and collector totals at the start of a counted period (growth since then is `measured`)."""

    lookup_tokens: float = 0.0
    hit_tokens: dict[str, float] = field(default_factory=dict)
    sampled_accesses: int = 0
    reannounced: int = 0

    def since(self, start: Counters) -> Measured:
        return Measured(max(0.0, self.lookup_tokens - start.lookup_tokens),
                        {t: max(0.0, v - start.hit_tokens.get(t, 0.0)) for t, v in self.hit_tokens.items()})


class StreamState:
    def __init__(self, stream: AccessStream, trace_limit: int, max_model_blocks: int, requests: int) -> None:
        self.stream = stream
        self.trace_limit = max(2, trace_limit)
        self.max_model_blocks = max_model_blocks
        self.trace = array("Q")  # sampled accesses, in order
        self.batches = array("I")  # the number of them in each engine step, in order
        self.warmup = 0
        self.whole = True  # the trace holds every access since the stream began
        self.setup: Setup | None = None
        self.models: list[Model] = []
        self.chains = Chains(2 * max_model_blocks)
        self.counted_from = Counters()  # the trace's counted period starts here
        self.models_from = Counters()  # the models' counting starts here
        self.requests: deque[RequestSample] = deque(maxlen=requests)
        self.request_clock: tuple[float, int] | None = None  # (wall time of the first delivery, requests since)

    def add_requests(self, requests: list[RequestSample], now: float) -> None:
        self.requests.extend(requests)
        if requests:
            self.request_clock = ((now, 0) if self.request_clock is None
                                  else (self.request_clock[0], self.request_clock[1] + len(requests)))

    def requests_per_hour(self, now: float) -> float | None:
        """Requests delivered per hour since the first delivery (whose own requests came before it began)."""
        if self.request_clock is None or now <= self.request_clock[0] or not self.request_clock[1]:
            return None
        return self.request_clock[1] / (now - self.request_clock[0]) * 3600.0
        self.exported: dict[str, list[int]] = {}  # scenario -> its model's counts already exported, per tier

    def build(self, setup: Setup, now: Counters, complete: bool) -> None:
        """(Re)builds the models for `setup` and replays the trace into them. When the trace holds every
        access since the publisher started (`complete`: the collector applied every batch from seq 0; nothing
        dropped, truncated or reset since), it is counted and so is every engine counter from 0: the counted
        period is the publisher's whole life. Otherwise it only warms the models up and counting starts now."""
        self.setup = setup
        self.models = []
        for s in setup.scenarios:
            blocks = s.blocks(setup.today, setup.geometry)
            caps, clamped = scaled_capacities(blocks, setup.sample_rate, self.max_model_blocks)
            self.models.append(Model(s, blocks, clamped, Hierarchy(caps, setup.policy)))
        self.exported = {}
        replayed = batches_of(self.trace, self.batches)
        self.chains = Chains(2 * self.max_model_blocks)
        if complete and self.whole:
            self.warmup = 0
            self.counted_from = self.models_from = Counters()
            for batch in replayed:
                self._feed(batch)
            return
        for batch in replayed:
            chained = self.chains.links(batch)
            for m in self.models:
                m.hierarchy.access_batch(batch, chained)
        self.warmup = len(self.trace)
        self.counted_from = self.models_from = now
        self.whole = False

    def take(self, entries: Sequence[Entry], now: Counters) -> int:
        """Feeds accesses to the models and the trace, one engine step (BATCH marker) at a time; returns how
        many keys it took. A RESET marker (the publisher restarted) empties both."""
        taken = 0
        batch: list[int] = []
        for entry in entries:
            if not isinstance(entry, Marker):
                batch.append(block_key(entry))
                continue
            self._take_batch(batch, now)
            taken += len(batch)
            batch = []
            if entry is RESET:
                self.trace, self.batches = array("Q"), array("I")
                self.warmup = 0
                self.whole = False
                if self.setup is not None:
                    self.build(self.setup, now, False)
        self._take_batch(batch, now)  # keys after the last marker (their step may go on in the next run)
        return taken + len(batch)

    def _take_batch(self, keys: list[int], now: Counters) -> None:
        if not keys:
            return
        self._feed(keys)
        self.trace.extend(keys)
        self.batches.append(len(keys))
        if len(self.trace) >= self.trace_limit:
            self._truncate(now)

    def _truncate(self, now: Counters) -> None:
        """Drops the oldest whole batches until at most half the limit is left; what is left is warm-up."""
        drop, dropped_batches = len(self.trace) - self.trace_limit // 2, 0
        cut = 0
        while cut < drop and dropped_batches < len(self.batches):
            cut += self.batches[dropped_batches]
            dropped_batches += 1
        del self.trace[:cut]
        del self.batches[:dropped_batches]
        self.warmup = len(self.trace)
        self.counted_from = now
        self.whole = False

    def _feed(self, keys: list[int]) -> None:
        chained = self.chains.links(keys)
        models = self.models
        if models:
            feed(models[0].hierarchy, models[0].outcomes, [(m.hierarchy, m.outcomes) for m in models[1:]], keys,
                 chained)

    def new_counts(self) -> dict[str, list[int]]:
        """Accesses each model served from each tier since the last call, by scenario."""
        out = {}
        for m in self.models:
            counts = m.outcomes.counts[:MISS]
            done = self.exported.get(m.scenario.name, [0] * MISS)
            out[m.scenario.name] = [now - then for now, then in zip(counts, done, strict=True)]
            self.exported[m.scenario.name] = counts
        return out
