"""The what-if analysis as the agent runs it: predicted hit shares and TTFT at other tier sizes.

Each run, for every KV-event publisher the collector hands accesses for (kvscope.agent.core.kv_access):

1. today's tier sizes: the engine's capacities (kvscope_tier_capacity_tokens/_bytes; vLLM reports G1 and
   G2), overridden or completed by `tier_sizes` (G3, G4), in blocks of the KV events' block_size;
2. the sampled accesses since the last run go through a model of the hierarchy at today's sizes and one
   per scenario (stream.py, hierarchy.py); the tokens each tier would serve are exported as counters;
3. the requests the correlation analysis attributed since the last run (RecentRequests) get a predicted
   TTFT per scenario (predict.py) from its cost model and tier fetch models, read from the store.

It serves the profile (profile.py) at GET /whatif/profile on the agent's /metrics port and writes it
to `recording`: `kvscope what-if` replays that at any sizes.
"""

from __future__ import annotations

import bisect
import logging
import math
import os
import threading
from collections.abc import Callable
from pathlib import Path

from kvscope.agent.analyses.correlation import metrics as cm
from kvscope.agent.analyses.whatif import metrics as m
from kvscope.agent.analyses.whatif.hierarchy import TIERS, Policy
from kvscope.agent.analyses.whatif.options import WhatIfOptions
from kvscope.agent.analyses.whatif.predict import offload_ratio, predict_ttft, transport
from kvscope.agent.analyses.whatif.profile import Cost, RequestSample, StreamProfile, TierFetch, dumps
from kvscope.agent.analyses.whatif.sizes import TODAY, Geometry, parse_size, scaled_scenarios, scenario
from kvscope.agent.analyses.whatif.stream import Counters, Setup, StreamState
from kvscope.agent.core import contract as c
from kvscope.agent.core.kv_access import AccessStream, KvAccessLog, Labels
from kvscope.agent.core.pipeline import AnalysisInputs, AnalysisSpec
from kvscope.agent.core.reader import StoreReader, Window
from kvscope.agent.core.readings import HistogramSample, Reading, Sample
from kvscope.agent.core.records import RecentRequests
from kvscope.agent.core.store import Store
from kvscope.agent.core.streams import ATTRIBUTED_REQUESTS, HTTP_ROUTES, KV_ACCESS, Route, StreamUse

log = logging.getLogger("kvscope.whatif")
PROFILE_ROUTE = "/whatif/profile"


# every store series it reads (through a StoreReader, once a run)
READS = (c.KV_HIT_TOKENS, c.KV_LOOKUP_TOKENS, c.TIER_CAPACITY_TOKENS, c.TIER_CAPACITY_BYTES, c.KV_TRANSFER_BYTES,
         c.KV_TRANSFER_SECONDS, cm.TOKEN_BYTES, cm.COST_A, cm.COST_B, cm.COST_CONFIDENT, cm.TIER_BANDWIDTH,
         cm.TIER_LATENCY)


class WhatIfAnalysis:
    def __init__(self, options: WhatIfOptions, store: Store, access: KvAccessLog | None,
                 recent: RecentRequests | None, wall_clock: Callable[[], float]) -> None:
        self._o = options
        self._access, self._recent, self._wall = access, recent, wall_clock
        # what it reads of the store, once a run: the engine's counters and capacities, and the cost model
        # the correlation analysis exported (a metric the catalogue lacks is left out)
        self._reader = StoreReader(store, [name for name in READS if store.catalogue.get(name) is not None])
        self._window = Window({})
        self._named = [scenario(name, sizes) for name, sizes in sorted(options.scenarios.items())]
        self._states: dict[Labels, StreamState] = {}
        self._cursor = 0
        self._lock = threading.Lock()  # run() against the profile route (HTTP thread)
        self._ttft: dict[tuple[Labels, str, str], list[float]] = {}  # bucket counts + [sum, count]
        self._counters: dict[tuple[str, tuple[str, ...]], float] = {}
        self._gauges: dict[tuple[str, tuple[str, ...]], float] = {}
        self._written: float | None = None

    # -- the analysis job --------------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        """No KV-event collector hands accesses over: the scheduler runs it once (up = 1) and not again."""
        return self._access is None

    def run(self) -> list[Reading]:
        if self._access is None:
            return []
        with self._lock:
            self._window = self._reader.window()
            requests = self._new_requests()
            for stream in self._access.streams():
                self._step(stream, requests.get(stream.labels, []))
            out = self._readings()
        self._record()
        return out

    def _new_requests(self) -> dict[Labels, list[RequestSample]]:
        if self._recent is None:
            return {}
        results, self._cursor, _ = self._recent.since(self._cursor)
        out: dict[Labels, list[RequestSample]] = {}
        for r in results:
            rec = r.record
            if rec.prompt_tokens is None or rec.prompt_tokens <= 0 or not rec.ttft > 0:
                continue
            out.setdefault((rec.engine, rec.model, rec.dp_rank), []).append(
                RequestSample(rec.ttft, rec.prompt_tokens, rec.cached_tokens, rec.offload_seconds))
        return out

    def _step(self, stream: AccessStream, requests: list[RequestSample]) -> None:
        o = self._o
        state = self._states.get(stream.labels)
        if state is None:
            state = self._states[stream.labels] = StreamState(stream, o.trace_blocks, o.max_model_blocks, o.requests)
        now = self._counters_now(stream)
        setup = self._setup(stream)
        if setup is not None and setup != state.setup:
            state.build(setup, now, stream.meta.complete and stream.dropped == 0)
        keys = stream.take(o.queue_blocks)
        rate = stream.sample_rate
        self._add(m.SIMULATED, stream.labels, state.take(keys, now) / rate)
        self._counters[(m.DROPPED, stream.labels)] = stream.dropped / rate
        state.add_requests(requests, self._wall())
        if state.setup is None:
            return
        self._export_hits(state)
        for model in state.models:
            name = model.scenario.name
            self._gauges[(m.CLAMPED, (*stream.labels, name))] = 1.0 if model.clamped else 0.0
            for tier, blocks in zip(TIERS, model.blocks, strict=True):
                tokens = blocks * state.setup.geometry.block_tokens
                self._gauges[(m.CAPACITY_TOKENS, (*stream.labels, name, tier))] = float(tokens)
                if state.setup.geometry.bytes_per_token > 0:
                    self._gauges[(m.CAPACITY_BYTES, (*stream.labels, name, tier))] = float(
                        tokens * state.setup.geometry.bytes_per_token)
        seen = self._g1_hits_seen(state, now)
        if seen is not None:
            self._gauges[(m.G1_HITS_SEEN, stream.labels)] = seen
        self._predict_ttft(state, now, requests)

    def _export_hits(self, state: StreamState) -> None:
        """Hit tokens per scenario and tier, as each model counts them (sampled counts × block tokens / R): a
        counter that only grows and equals the replay of the same accesses. `kvscope what-if` moves the
        engine's measured tokens by the models instead (predict.anchored), which leaves less sampling error."""
        setup, labels = state.setup, state.stream.labels
        assert setup is not None
        per_access = setup.geometry.block_tokens / setup.sample_rate
        for name, counts in state.new_counts().items():
            for tier, n in zip(TIERS, counts, strict=True):
                self._add(m.HIT_TOKENS, (*labels, name, tier), n * per_access)

    def _predict_ttft(self, state: StreamState, now: Counters, requests: list[RequestSample]) -> None:
        setup, labels = state.setup, state.stream.labels
        cost = self._cost(labels)
        if not requests or setup is None or cost is None:
            return
        measured = now.since(state.models_from)
        confidence = "high" if cost.confident else "low"
        today = state.models[0].outcomes
        for model in state.models:
            t = transport(model.outcomes, measured, setup.geometry.block_tokens, setup.sample_rate, model.blocks)
            predicted, _ = predict_ttft(requests, t, measured, cost, self._bytes_per_token(setup, labels),
                                        setup.geometry.block_tokens, offload_ratio(today, model.outcomes, cost.store))
            if predicted is None:
                continue
            key = (labels, model.scenario.name, confidence)
            hist = self._ttft.setdefault(key, [0.0] * (len(m.TTFT_BUCKETS) + 3))
            for weight, ttft in predicted.samples:  # a request's possible outcomes, weights adding to 1
                hist[bisect.bisect_left(m.TTFT_BUCKETS, ttft)] += weight
                hist[-2] += weight * ttft
                hist[-1] += weight
            for weight, saved in predicted.saved_samples:
                name = m.PREFILL_SAVED if saved >= 0 else m.PREFILL_LOST
                self._add(name, (*labels, model.scenario.name, confidence), weight * abs(saved))

    def _add(self, name: str, labels: tuple[str, ...], by: float) -> None:
        self._counters[(name, labels)] = self._counters.get((name, labels), 0.0) + by

    def _readings(self) -> list[Reading]:
        out: list[Reading] = [Sample(name, labels, v) for (name, labels), v in self._counters.items()]
        out.extend(Sample(name, labels, v) for (name, labels), v in self._gauges.items())
        bounds = (*m.TTFT_BUCKETS, math.inf)
        for (labels, name, confidence), hist in self._ttft.items():
            running, buckets = 0.0, []
            for bound, n in zip(bounds, hist, strict=False):
                running += n
                buckets.append((bound, running))
            out.append(HistogramSample(m.TTFT, (*labels, name, confidence), tuple(buckets), hist[-2], hist[-1]))
        return out

    # -- what the store says -------------------------------------------------------------------------------

    def _counters_now(self, stream: AccessStream) -> Counters:
        store, labels = self._window, stream.labels
        hits = {tier: store.value(c.KV_HIT_TOKENS, (*labels, tier)) or 0.0 for tier in TIERS}
        return Counters(store.value(c.KV_LOOKUP_TOKENS, labels) or 0.0, hits, stream.meta.sampled_accesses,
                        stream.meta.reannounced)

    def _today(self, labels: Labels, geometry: Geometry) -> tuple[int | None, ...]:
        out: list[int | None] = []
        for tier in TIERS:
            text = self._o.tier_sizes.get(tier)
            if text is not None:
                out.append(parse_size(text).blocks(None, geometry))
                continue
            tokens = self._window.value(c.TIER_CAPACITY_TOKENS, (*labels, tier))
            size = self._window.value(c.TIER_CAPACITY_BYTES, (*labels, tier))
            if tokens is not None:
                out.append(int(tokens // geometry.block_tokens))
            elif size is not None and geometry.bytes_per_token > 0:
                out.append(int(size // geometry.block_bytes))
            else:
                out.append(None)
        return tuple(out)

    def _setup(self, stream: AccessStream) -> Setup | None:
        """What today's models are for, once the block size and G1's size are known."""
        meta = stream.meta
        if meta.block_tokens <= 0:
            return None
        geometry = Geometry(meta.block_tokens, self._bytes_per_token_of(stream.labels, meta.bytes_per_token))
        try:
            today = self._today(stream.labels, geometry)
        except ValueError as exc:
            log.warning("what-if for %s: %s", "/".join(stream.labels), exc)
            return None
        if today[0] is None:
            return None  # G1's size: the one every prediction needs
        named = {s.name for s in self._named}  # a named scenario wins over a scaled one of the same name
        scenarios = (TODAY, *(s for s in scaled_scenarios(self._o.scales, today) if s.name not in named),
                     *self._named)
        policy: Policy = "exclusive" if self._o.policy == "exclusive" else "inclusive"
        return Setup(today, geometry, policy, stream.sample_rate, scenarios)

    def _bytes_per_token_of(self, labels: Labels, configured: int) -> int:
        if configured > 0:
            return configured
        learned = self._window.value(cm.TOKEN_BYTES, labels)
        return round(learned) if learned else 0

    def _bytes_per_token(self, setup: Setup, labels: Labels) -> float:
        return float(setup.geometry.bytes_per_token) or (self._window.value(cm.TOKEN_BYTES, labels) or 0.0)

    def _cost(self, labels: Labels) -> Cost | None:
        store = self._window
        a, b = store.value(cm.COST_A, labels), store.value(cm.COST_B, labels)
        if a is None or b is None:
            return None
        fetch = {}
        for tier in TIERS[1:]:
            bandwidth = store.value(cm.TIER_BANDWIDTH, (*labels, tier))
            latency = store.value(cm.TIER_LATENCY, (*labels, tier)) or 0.0
            fetch[tier] = TierFetch(bandwidth, latency, self._via(labels, tier))
        return Cost(a, b, (store.value(cm.COST_CONFIDENT, labels) or 0.0) >= 1.0, fetch, self._store_costs(labels))

    def _store_costs(self, labels: Labels) -> dict[str, float | None]:
        """Seconds per byte of storing a block G1 evicts into each tier: the engine's G1 -> tier store timer,
        else (a tier G1 never stored into directly) its writes into that tier from G2 (a file write either way)."""
        moved, spent = self._window.values(c.KV_TRANSFER_BYTES), self._window.values(c.KV_TRANSFER_SECONDS)
        out: dict[str, float | None] = {}
        for tier in TIERS[1:]:
            out[tier] = None
            for src in ("G1", "G2"):
                n, seconds = moved.get((*labels, src, tier), 0.0), spent.get((*labels, src, tier))
                if n > 0 and seconds is not None and tier != src:
                    out[tier] = seconds / n
                    break
        return out

    def _via(self, labels: Labels, tier: str) -> str | None:
        """G2 when the engine brings this tier's blocks to G1 through host memory (its onboard bytes go to G2)."""
        if tier == "G2":
            return None
        moved = self._window.values(c.KV_TRANSFER_BYTES)
        to_g2 = moved.get((*labels, tier, "G2"), 0.0)
        return "G2" if to_g2 > moved.get((*labels, tier, "G1"), 0.0) else None

    def _g1_hits_seen(self, state: StreamState, now: Counters) -> float | None:
        start, setup = state.models_from, state.setup
        hits = now.hit_tokens.get("G1", 0.0) - start.hit_tokens.get("G1", 0.0)
        if setup is None or hits <= 0:
            return None
        # counted exactly by the collector (a store of a block already resident), not from the sampled stores
        return (now.reannounced - start.reannounced) * setup.geometry.block_tokens / hits

    # -- the profile ---------------------------------------------------------------------------------------

    def profiles(self) -> list[StreamProfile]:
        with self._lock:
            return [self._profile(s) for s in self._states.values() if s.setup is not None]

    def _profile(self, state: StreamState) -> StreamProfile:
        setup, labels = state.setup, state.stream.labels
        assert setup is not None
        now = self._counters_now(state.stream)
        sources = {t: "config" if t in self._o.tier_sizes else "engine" for t, b in zip(TIERS, setup.today,
                                                                                        strict=True) if b is not None}
        notes = [f"{t}: size unknown, taken as off (set analyses.whatif.tier_sizes.{t})"
                 for t, b in zip(TIERS, setup.today, strict=True) if b is None]
        return StreamProfile(
            *labels, sample_rate=setup.sample_rate, block_tokens=setup.geometry.block_tokens,
            bytes_per_token=setup.geometry.bytes_per_token, policy=setup.policy, today=list(setup.today),
            size_sources=sources, trace=state.trace[:], batches=state.batches[:], warmup=state.warmup,
            measured=now.since(state.counted_from), cost=self._cost(labels), requests=list(state.requests),
            max_blocks=state.max_model_blocks, dropped=round(state.stream.dropped / setup.sample_rate),
            g1_hits_seen=self._g1_hits_seen(state, now), notes=notes,
            requests_per_hour=state.requests_per_hour(self._wall()))

    @property
    def request_receiver(self) -> RecentRequests | None:
        """Where the correlation analysis' attributed requests reach it (None while it is idle)."""
        return self._recent

    def routes(self) -> dict[str, Route]:
        return {PROFILE_ROUTE: self._serve_profile}

    def _serve_profile(self) -> tuple[bytes, str]:
        return dumps(self.profiles(), self._wall()), "application/json"

    def _record(self) -> None:
        path, now = self._o.recording, self._wall()
        if not path or (self._written is not None and now - self._written < self._o.recording_interval):
            return
        self._written = now
        target = Path(path)
        tmp = target.with_name(target.name + ".tmp")
        try:
            tmp.write_bytes(dumps(self.profiles(), now))
            os.replace(tmp, target)
        except OSError as exc:
            log.warning("cannot write the what-if recording %s: %s", path, exc)


def build(options: WhatIfOptions, inputs: AnalysisInputs) -> WhatIfAnalysis:
    access = inputs.streams.get(KV_ACCESS)
    # the latest attributed requests it reads TTFT figures from: kept only while there is something to replay
    recent = RecentRequests(options.requests) if access is not None else None
    analysis = WhatIfAnalysis(options, inputs.store, access, recent, inputs.wall_clock)
    if analysis.idle:
        log.info("what-if analysis: idle, no KV events to replay (it needs [collectors.vllm_kv_events])")
    return analysis


SPEC = AnalysisSpec(
    name="whatif",
    description="what-if tier sizing: hit shares and TTFT at other G1-G4 sizes, from the KV events' access stream "
                "(needs vllm_kv_events; TTFT needs the correlation analysis)",
    options=WhatIfOptions,
    factory=build,
    metrics=m.METRICS,
    enabled_by_default=True,
    streams=StreamUse(reads={KV_ACCESS: lambda options: options.queue_blocks},
                      offers={ATTRIBUTED_REQUESTS: lambda analysis: analysis.request_receiver,
                              HTTP_ROUTES: lambda analysis: analysis.routes()}),
)
