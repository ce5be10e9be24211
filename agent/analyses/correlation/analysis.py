"""The correlation analysis as the agent runs it: one window per `run()`.

Each window, in order: one snapshot of the store's engine series (and the tier paths' series) is taken
through a StoreReader (agent/core/reader.py), and their growth since the previous window is attributed
(aggregate.py); the request records the sources left in the buffer are attributed one by one
and handed to the request sinks (per_request.py); the break-even bandwidths are recomputed from the
fitted models; the tier paths are assessed (paths.py) and fetch stall counted (stall.py). It returns
readings of its own catalogued metrics only (metrics.py); with no inputs it returns nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvscope.agent.analyses.correlation import metrics as m
from kvscope.agent.analyses.correlation.aggregate import METRICS as AGGREGATE_METRICS
from kvscope.agent.analyses.correlation.aggregate import WindowAttribution, WindowSummary
from kvscope.agent.analyses.correlation.attribution import FetchInside, OffloadInside
from kvscope.agent.analyses.correlation.counterfactuals import breakeven_bandwidth
from kvscope.agent.analyses.correlation.options import CorrelationOptions
from kvscope.agent.analyses.correlation.paths import PathWatch
from kvscope.agent.analyses.correlation.per_request import RequestAttribution
from kvscope.agent.analyses.correlation.stall import StallTracker
from kvscope.agent.analyses.correlation.state import Models, Outputs
from kvscope.agent.core.pipeline import AnalysisInputs, AnalysisSpec, GpuIntervals, RequestSink
from kvscope.agent.core.reader import StoreReader
from kvscope.agent.core.readings import Reading
from kvscope.agent.core.records import RecordBuffer
from kvscope.agent.core.store import Store
from kvscope.agent.core.streams import ATTRIBUTED_REQUESTS, GPU_INTERVALS, REQUEST_RECORDS, StreamUse


class CorrelationEngine:
    def __init__(self, options: CorrelationOptions, store: Store | None, records: RecordBuffer | None,
                 gpu_intervals: GpuIntervals | None, wall_clock: Callable[[], float],
                 sinks: Sequence[RequestSink] = ()) -> None:
        self._o = options
        self._records, self._wall = records, wall_clock
        self._models, self._out = Models(options), Outputs()
        self._window = WindowAttribution(self._models, self._out, self._fetch_inside, self._offload_inside,
                                         lambda: records is not None and gpu_intervals is not None
                                         and bool(gpu_intervals.gpus()))
        self._paths = PathWatch(options, self._out)
        # one snapshot of what both read, each window (no store: records only)
        self._reader = (StoreReader(store, (*AGGREGATE_METRICS, *self._paths.metrics(store.catalogue)))
                        if store is not None else None)
        self._requests = RequestAttribution(self._models, self._out, self._fetch_inside,
                                            options.fit_ttft_when_no_prefill, sinks, gpu_intervals, wall_clock)
        self._stall = StallTracker(gpu_intervals, options.stall_settle_seconds, self._out)
        self._last_now: float | None = None

    @property
    def reads_host_series(self) -> bool:
        """Its tier paths read host collectors' series: the scheduler refreshes them before each window."""
        return self._reader is not None and bool(self._o.paths)

    def run(self) -> list[Reading]:
        now = self._wall()
        dt = None if self._last_now is None else now - self._last_now
        self._last_now = now
        if self._records is not None:  # first: the window takes the records' GPU idle out of its prefill
            self._stall.add(self._requests.step(self._records.drain()))
            if self._records.received:
                self._out.counters[(m.RECORDS_DROPPED, ())] = float(self._records.dropped)
            r = self._requests
            self._window.add_idle(r.idle_by_key, r.idle_records, r.offload_by_key)
            for taken in (r.idle_by_key, r.idle_records, r.offload_by_key):
                taken.clear()
        snapshot = self._reader.window() if self._reader is not None else None
        window = self._window.step(snapshot, now) if snapshot is not None else WindowSummary()
        self._requests.settle_tiers()  # after the window: its hits are in the tier mix's pool
        self._breakeven()
        if snapshot is not None and dt and dt > 0:
            self._paths.step(snapshot, window, dt)
        self._stall.step(now)
        return self._out.readings()

    def _fetch_inside(self, engine: str) -> FetchInside:
        where = self._o.fetch_inside_by_engine.get(engine, self._o.fetch_inside)
        return "prefill" if where == "prefill" else "queue"

    def _offload_inside(self, engine: str) -> OffloadInside:
        where = self._o.offload_inside_by_engine.get(engine, self._o.offload_inside)
        return "prefill" if where == "prefill" else "none"

    def _breakeven(self) -> None:
        """BW*_t at the typical reused prefix: the records' median, else the engine counters' mean."""
        models, gauges = self._models, self._out.gauges
        for key in models.reused_per_request:
            models.model(key)
        for key, model in models.prefill.items():
            tokens_key = (m.BREAKEVEN_TOKENS, key)
            if tokens_key not in gauges and models.reused_per_request.get(key):
                gauges[tokens_key] = models.reused_per_request[key]
            n, per_token = gauges.get(tokens_key), models.bytes_per_token(key)
            if per_token is not None:
                gauges[(m.TOKEN_BYTES, key)] = per_token
            if model.fit is not None:
                fit = model.fit
                gauges.update({(m.FIT_R2, key): fit.r2, (m.FIT_RMSE, key): fit.rmse,
                               (m.FIT_SAMPLES, key): float(len(model))})
            if model.known:
                gauges[(m.COST_A, key)] = model.a
                gauges[(m.COST_B, key)] = model.b
                gauges[(m.COST_CONFIDENT, key)] = 1.0 if model.confident else 0.0
            if model.fit is not None:
                gauges[(m.COST_UNCERTAINTY, key)] = model.uncertainty
                gauges[(m.COST_SPREAD, key)] = model.spread
            for (tier_key, tier), tier_model in models.tiers.items():
                if tier_key != key:
                    continue
                bandwidth = tier_model.effective_bandwidth
                if bandwidth is not None:
                    gauges[(m.TIER_BANDWIDTH, (*key, tier))] = bandwidth
                    gauges[(m.TIER_LATENCY, (*key, tier))] = tier_model.latency
                if n and per_token is not None and model.known:
                    gauges[(m.BREAKEVEN, (*key, tier))] = breakeven_bandwidth(
                        n, model.a, model.b, tier_model.latency, per_token)


def build(options: CorrelationOptions, inputs: AnalysisInputs) -> CorrelationEngine:
    streams = inputs.streams
    return CorrelationEngine(options, inputs.store, streams.get(REQUEST_RECORDS), streams.get(GPU_INTERVALS),
                             inputs.wall_clock, streams.every(ATTRIBUTED_REQUESTS))


SPEC = AnalysisSpec(
    name="correlation",
    description="TTFT attribution (frontend/queue/fetch/offload/prefill/other), cost model, counterfactuals, "
                "fetch stall, noisy neighbour (reports nothing without engine series or request records)",
    options=CorrelationOptions,
    factory=build,
    metrics=m.METRICS,
    enabled_by_default=True,
    streams=StreamUse(reads={REQUEST_RECORDS: lambda options: options.record_buffer, GPU_INTERVALS: None},
                      writes=(ATTRIBUTED_REQUESTS,)),
)
