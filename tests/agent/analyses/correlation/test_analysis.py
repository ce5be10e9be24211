"""The correlation analysis: synthetic store windows and records in, catalogued readings and attributed requests out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvscope.agent.analyses.correlation import metrics as m
from kvscope.agent.analyses.correlation.aggregate import HOLD_WINDOWS, PHASE_HOLD_SECONDS, RECORD_HOLD_SECONDS
from kvscope.agent.analyses.correlation.analysis import SPEC, CorrelationEngine, build
from kvscope.agent.analyses.correlation.options import CorrelationOptions
from kvscope.agent.core import contract
from kvscope.agent.core.catalogue import AGENT_METRICS, Catalogue
from kvscope.agent.core.pipeline import AnalysisInputs
from kvscope.agent.core.readings import HistogramSample, Reading, Sample
from kvscope.agent.core.records import RecordBuffer, RequestRecord, TierFetch
from kvscope.agent.core.store import Store
from kvscope.agent.core.streams import ATTRIBUTED_REQUESTS, REQUEST_RECORDS, Streams
from kvscope.exporters.jsonl import JsonlSink

E = ("vllm", "llama", "0")


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make_store() -> Store:
    return Store(Catalogue([*AGENT_METRICS, *contract.CONTRACT_METRICS, *m.METRICS]))


def hist(name: str, total: float, count: float) -> HistogramSample:
    return HistogramSample(name, E, ((1.0, count), (float("inf"), count)), total, count)


def engine_readings(ttft: float, queue: float, prefill: float, load_s: float, load_b: float,
                    n: float, hits: float = 0.0, fs_bytes: float = 0.0) -> list[Reading]:
    return [hist(contract.TTFT_SECONDS, ttft, n), hist(contract.QUEUE_SECONDS, queue, n),
            hist(contract.PREFILL_SECONDS, prefill, n),
            Sample(contract.KV_TRANSFER_SECONDS, (*E, "G2", "G1"), load_s),
            Sample(contract.KV_TRANSFER_BYTES, (*E, "G2", "G1"), load_b),
            Sample(contract.KV_TRANSFER_BYTES, (*E, "G1", "G2"), 5e9),  # offload: not a fetch
            Sample(contract.KV_HIT_TOKENS, (*E, "G2"), hits)]


def by_key(readings: list[Reading]) -> dict[tuple[str, tuple[str, ...]], Reading]:
    return {(r.name, r.labels): r for r in readings}


def value(readings: list[Reading], name: str, labels: tuple[str, ...]) -> float:
    reading = by_key(readings)[(name, labels)]
    assert isinstance(reading, Sample)
    return reading.value


def test_no_inputs_no_readings() -> None:
    engine = CorrelationEngine(CorrelationOptions(), make_store(), RecordBuffer(), None, Clock())
    assert engine.run() == []
    assert CorrelationEngine(CorrelationOptions(), None, None, None, Clock()).run() == []


def test_aggregate_windows_add_up_to_the_ttft_sum() -> None:
    store, clock = make_store(), Clock()
    engine = CorrelationEngine(CorrelationOptions(fetch_inside="queue"), store, RecordBuffer(), None, clock)
    store.ingest("vllm", engine_readings(10.0, 3.0, 5.0, 1.0, 2e9, 10, hits=10_000), clock.t)
    first = engine.run()
    clock.t += 1
    # second window: +6 s TTFT, +1 s queue, +6 s prefill: measured parts exceed TTFT by 1 s
    store.ingest("vllm", engine_readings(16.0, 4.0, 11.0, 1.5, 3e9, 15, hits=15_000), clock.t)
    second = engine.run()
    attributed = {lab[3:]: r.value for (name, lab), r in by_key(second).items()
                  if name == m.TTFT_ATTRIBUTED and isinstance(r, Sample)}
    assert attributed == {("queue", "derived"): pytest.approx(3.0 - 1.0 + 1.0 - 0.5),
                          ("fetch", "measured"): pytest.approx(1.5),
                          ("prefill", "measured"): pytest.approx(11.0),
                          ("frontend", "derived"): pytest.approx(2.0), ("other", "derived"): 0.0}
    error = value(second, m.ATTRIBUTION_ERROR, (*E, "aggregate", "negative_remainder"))
    assert error == pytest.approx(1.0)
    assert sum(attributed.values()) == pytest.approx(16.0 + error)
    assert value(first, m.TIER_BANDWIDTH, (*E, "G2")) == pytest.approx(2e9)
    assert value(second, m.TIER_BANDWIDTH, (*E, "G2")) == pytest.approx(1e9 / 0.5)
    assert value(second, m.TOKEN_BYTES, E) == pytest.approx(3e9 / 15_000)
    # everything emitted is catalogued, with the catalogue's label count
    result = store.ingest("correlation", second, clock.t)
    assert result.rejected == 0 and result.accepted == len(second)


def test_sync_engine_takes_fetch_out_of_prefill() -> None:
    store, clock = make_store(), Clock()
    options = CorrelationOptions(fetch_inside="queue", fetch_inside_by_engine={"vllm": "prefill"})
    engine = CorrelationEngine(options, store, RecordBuffer(), None, clock)
    store.ingest("vllm", engine_readings(10.0, 3.0, 5.0, 1.0, 2e9, 10), clock.t)
    out = engine.run()
    assert value(out, m.TTFT_ATTRIBUTED, (*E, "prefill", "derived")) == pytest.approx(4.0)
    assert value(out, m.TTFT_ATTRIBUTED, (*E, "queue", "measured")) == pytest.approx(3.0)


def record(i: int, **kw: object) -> RequestRecord:
    base: dict[str, object] = dict(request_id=f"r{i}", engine="vllm", model="llama", dp_rank="0",
                                   arrival=900.0 + i, ttft=1.0, source="reference")
    base.update(kw)
    return RequestRecord(**base)  # type: ignore[arg-type]


def test_records_fit_the_model_and_feed_counterfactuals(tmp_path: Path) -> None:
    a, b = 4.14e-5, 1.58e-9
    buffer, clock = RecordBuffer(), Clock()
    out_path = tmp_path / "requests.jsonl"
    engine = CorrelationEngine(CorrelationOptions(fetch_inside="prefill", fit_min_samples=4, bytes_per_token=36_864),
                               None, buffer, None, clock, [JsonlSink(str(out_path))])
    cold = [record(i, prompt_tokens=n, cached_tokens=0, queue=0.01, prefill=a * n + b * n * n,
                   ttft=0.02 + a * n + b * n * n) for i, n in enumerate((2000, 5000, 10_000, 20_000, 40_000))]
    warm_prefill = 0.2 + a * 1000 + b * 1000 * (2 * 9000 + 1000)  # 0.2 s of G4 fetch inside the step
    warm = record(9, prompt_tokens=10_000, cached_tokens=9000, queue=0.01, prefill=warm_prefill, ttft=0.35,
                  fetches=(TierFetch("G4", 9000, 9000 * 36_864.0, 0.2),))
    buffer.put([*cold, warm])
    out = engine.run()
    assert value(out, m.COST_A, E) == pytest.approx(a, rel=1e-6)
    assert value(out, m.COST_B, E) == pytest.approx(b, rel=1e-6)
    assert value(out, m.FIT_SAMPLES, E) == 6  # the warm request too: its fetch was measured
    assert value(out, m.COST_CONFIDENT, E) == 1.0  # prompts of 2k-40k tokens: a and b pinned down
    recompute = a * 10_000 + b * 1e8
    assert value(out, m.PREFILL_SAVED, (*E, "high")) == pytest.approx(recompute - warm_prefill)
    assert value(out, m.PREFILL_LOST, (*E, "high")) == 0.0
    assert value(out, m.BREAKEVEN_TOKENS, E) == 9000
    assert value(out, m.REQUESTS_ATTRIBUTED, (*E, "reference")) == 6
    share = by_key(out)[(m.FETCH_SHARE, E)]
    assert isinstance(share, HistogramSample) and share.count == 6
    lines = [json.loads(line) for line in out_path.read_text().splitlines()]
    assert [line["request_id"] for line in lines] == [f"r{i}" for i in (0, 1, 2, 3, 4, 9)]
    assert lines[-1]["components"]["fetch"] == {"seconds": 0.2, "method": "measured"}
    assert lines[-1]["prefill_saved"] == pytest.approx(recompute - warm_prefill)
    assert lines[-1]["confidence"] == "high"


def test_narrow_prompts_fall_back_to_the_prior_shape_and_say_so(tmp_path: Path) -> None:
    """Prompts of 1,650-1,800 tokens with a little noise: the free fit trades a for b; the model keeps the
    seeds' shape scaled to the data (here the engine's cost at 2x the seeds'), and marks its counterfactuals
    low-confidence in the metrics and the JSONL."""
    a, b = 2 * 4.136e-5, 2 * 1.584e-9
    buffer, clock = RecordBuffer(), Clock()
    out_path = tmp_path / "requests.jsonl"
    engine = CorrelationEngine(CorrelationOptions(fit_min_samples=8), None, buffer, None, clock,
                               [JsonlSink(str(out_path))])
    lengths = [1650 + 10 * i for i in range(16)]
    noise = [0.002 * ((i * 7) % 5 - 2) for i in range(16)]  # ±4 ms, deterministic
    cold = [record(i, prompt_tokens=n, cached_tokens=0, queue=0.0, prefill=a * n + b * n * n + e,
                   ttft=0.01 + a * n + b * n * n + e) for i, (n, e) in enumerate(zip(lengths, noise, strict=True))]
    warm = record(99, prompt_tokens=1800, cached_tokens=1536, queue=0.0, prefill=0.02, ttft=0.03)
    buffer.put([*cold, warm])
    out = engine.run()
    assert value(out, m.COST_CONFIDENT, E) == 0.0
    assert value(out, m.COST_SPREAD, E) == pytest.approx(1800 / 1650)
    # the scaled prior recovers the engine's cost; the free fit would not have
    assert value(out, m.COST_A, E) == pytest.approx(a, rel=0.02)
    assert value(out, m.COST_B, E) == pytest.approx(b, rel=0.02)
    saved = value(out, m.PREFILL_SAVED, (*E, "low"))
    assert saved == pytest.approx(a * 1800 + b * 1800 * 1800 - 0.02, rel=0.03)
    assert (m.PREFILL_SAVED, (*E, "high")) not in by_key(out)
    lines = [json.loads(line) for line in out_path.read_text().splitlines()]
    assert {line["confidence"] for line in lines} == {"low"}


def test_reference_engine_stores_inside_prefill_are_offload_vllm_stores_are_not() -> None:
    """The same window twice: for the reference engine (offload_inside prefill) the G1 -> G2 store seconds are
    carved out of its prefill phase as measured offload; for vLLM (stores deferred, asynchronous) they are not
    part of the TTFT split at all."""
    readings = [*engine_readings(10.0, 3.0, 5.0, 1.0, 2e9, 10),
                Sample(contract.KV_TRANSFER_SECONDS, (*E, "G1", "G2"), 0.75)]
    for engine_kind, offload in (("reference", 0.75), ("vllm", None)):
        store, clock = make_store(), Clock()
        options = CorrelationOptions(fetch_inside_by_engine={engine_kind: "prefill"})
        engine = CorrelationEngine(options, store, RecordBuffer(), None, clock)
        labels = (engine_kind, *E[1:])
        relabelled = [HistogramSample(r.name, labels, r.buckets, r.sum, r.count) if isinstance(r, HistogramSample)
                      else Sample(r.name, (*labels, *r.labels[3:]), r.value) for r in readings]
        store.ingest("vllm", relabelled, clock.t)
        out = by_key(engine.run())
        attributed = {lab[3]: r.value for (name, lab), r in out.items()
                      if name == m.TTFT_ATTRIBUTED and isinstance(r, Sample)}
        if offload is None:
            assert "offload" not in attributed and attributed["prefill"] == pytest.approx(5.0 - 1.0)
        else:
            assert attributed["offload"] == pytest.approx(offload)
            assert attributed["prefill"] == pytest.approx(5.0 - 1.0 - offload)
        assert sum(attributed.values()) == pytest.approx(10.0)


def test_untimed_stores_are_estimated_at_the_reverse_links_bandwidth() -> None:
    """An engine that counts store bytes but no store time: offload = bytes / the G2 -> G1 bandwidth, labelled
    estimated."""
    store, clock = make_store(), Clock()
    options = CorrelationOptions(offload_inside="prefill", fetch_inside="prefill")
    engine = CorrelationEngine(options, store, RecordBuffer(), None, clock)
    # G2 -> G1: 2e9 B in 1 s = 2 GB/s; G1 -> G2: 5e9 B, no seconds series -> 2.5 s estimated
    store.ingest("vllm", engine_readings(10.0, 3.0, 5.0, 1.0, 2e9, 10), clock.t)
    out = by_key(engine.run())
    assert value(list(out.values()), m.TTFT_ATTRIBUTED, (*E, "offload", "estimated")) == pytest.approx(2.5)
    assert value(list(out.values()), m.TTFT_ATTRIBUTED, (*E, "prefill", "derived")) == pytest.approx(5.0 - 1 - 2.5)


def test_a_records_measured_offload_comes_out_of_its_prefill() -> None:
    buffer, clock = RecordBuffer(), Clock()
    engine = CorrelationEngine(CorrelationOptions(fetch_inside="prefill"), None, buffer, None, clock)
    buffer.put([record(1, prompt_tokens=4096, cached_tokens=3840, queue=0.01, prefill=0.5, ttft=0.53,
                       fetch_seconds=0.1, offload_seconds=0.3)])
    out = engine.run()
    assert value(out, m.REQUEST_ATTRIBUTED, (*E, "offload", "measured")) == pytest.approx(0.3)
    assert value(out, m.REQUEST_ATTRIBUTED, (*E, "fetch", "measured")) == pytest.approx(0.1)
    assert value(out, m.REQUEST_ATTRIBUTED, (*E, "prefill", "derived")) == pytest.approx(0.1)
    assert value(out, m.REQUEST_ATTRIBUTED, (*E, "frontend", "derived")) == pytest.approx(0.02)
    assert value(out, m.REQUEST_ATTRIBUTED, (*E, "other", "derived")) == 0.0


class FakeGpus:
    def __init__(self, samples: list[tuple[float, float, float]]) -> None:
        self.samples = samples

    def gpus(self) -> dict[str, str]:
        return {"0": "GPU-abc"}

    def recent_samples(self, gpu: str) -> list[tuple[float, float, float]]:
        return self.samples if gpu == "0" else []


def test_fetch_stall_counted_once_records_have_settled() -> None:
    clock, buffer = Clock(100.0), RecordBuffer()
    gpus = FakeGpus([(t / 2, t / 2 + 0.5, 0.0) for t in range(200, 260)])  # idle from 100 s to 130 s
    engine = CorrelationEngine(CorrelationOptions(stall_settle_seconds=10.0), None, buffer, gpus, clock)
    engine.run()  # counts from now − settle on
    buffer.put([RequestRecord("a", "vllm", "m", "0", arrival=100.0, ttft=10.0,
                              fetch_intervals=((101.0, 106.0),), compute_intervals=((104.0, 110.0),))])
    clock.t = 112.0  # settled up to 102: 1 s of fetch-only time (101..102)
    first = value(engine.run(), m.FETCH_STALL, ("0",))
    assert first == pytest.approx(1.0)
    clock.t = 130.0  # the rest: 102..104 fetch only; 104..106 computing too
    assert value(engine.run(), m.FETCH_STALL, ("0",)) == pytest.approx(3.0)


def test_noisy_neighbour_from_store_paths() -> None:
    store, clock = make_store(), Clock()
    options = CorrelationOptions(paths={"G4": ['kvscope_fs_read_bytes_total{mount="/gpfs"}']},
                                 path_capacity_bytes_per_second={"G4": 100e9})
    path_spec = Catalogue([*AGENT_METRICS, *contract.CONTRACT_METRICS, *m.METRICS])
    from kvscope.agent.core.catalogue import counter
    store = Store(Catalogue([*path_spec, counter("kvscope_fs_read_bytes_total", "bytes", ("mount", "fstype"),
                                                 "FS reads.", "test")]))
    engine = CorrelationEngine(options, store, RecordBuffer(), None, clock)
    fs = kv = secs = 0.0

    def window(fs_rate: float, kv_rate: float, bandwidth: float) -> list[Reading]:
        nonlocal fs, kv, secs
        fs, kv, secs = fs + fs_rate, kv + kv_rate, secs + kv_rate / bandwidth
        store.ingest("fs", [Sample("kvscope_fs_read_bytes_total", ("/gpfs", "gpfs"), fs)], clock.t)
        store.ingest("vllm", [Sample(contract.KV_TRANSFER_BYTES, (*E, "G4", "G2"), kv),
                              Sample(contract.KV_TRANSFER_SECONDS, (*E, "G4", "G2"), secs)], clock.t)
        out = engine.run()
        clock.t += 1.0
        return out

    for _ in range(8):
        quiet = window(40e9, 35e9, 10e9)
    assert value(quiet, m.NOISY_NEIGHBOUR, ("G4",)) == 0.0
    noisy = window(95e9, 20e9, 6e9)  # 75 GB/s of somebody else's traffic, fetch slowed to 6 GB/s
    assert value(noisy, m.NOISY_NEIGHBOUR, ("G4",)) == 1.0
    assert value(noisy, m.BANDWIDTH_DROP, ("G4",)) == pytest.approx(0.4)
    assert value(noisy, m.NON_KV_SHARE, ("G4",)) == pytest.approx(1 - 20 / 95)
    assert value(noisy, m.PATH_UTILISATION, ("G4",)) == pytest.approx(0.95)
    assert value(window(40e9, 35e9, 10e9), m.NOISY_NEIGHBOUR, ("G4",)) == 0.0


def test_a_path_the_agent_cannot_see_exports_no_verdict(caplog: pytest.LogCaptureFixture) -> None:
    """A sidecar whose node agent reads the host: the path's collector is off, so its series never come.
    No noisy-neighbour or saturation gauge (a 0 would read as "the path is quiet"), and the operator is told
    once; when the series come, the verdicts do."""
    from kvscope.agent.core.catalogue import counter
    clock = Clock()
    fs_reads = counter("kvscope_fs_read_bytes_total", "bytes", ("mount", "fstype"), "FS reads.", "test")
    store = Store(Catalogue([*AGENT_METRICS, *contract.CONTRACT_METRICS, *m.METRICS, fs_reads]))
    options = CorrelationOptions(paths={"G4": ['kvscope_fs_read_bytes_total{mount="/gpfs"}']},
                                 path_capacity_bytes_per_second={"G4": 100e9})
    engine = CorrelationEngine(options, store, RecordBuffer(), None, clock)
    path_gauges = (m.NOISY_NEIGHBOUR, m.SATURATED, m.PATH_UTILISATION)
    for kv in (1e9, 2e9, 3e9):
        store.ingest("vllm", [Sample(contract.KV_TRANSFER_BYTES, (*E, "G4", "G2"), kv),
                              Sample(contract.KV_TRANSFER_SECONDS, (*E, "G4", "G2"), kv / 10e9)], clock.t)
        with caplog.at_level("INFO", logger="kvscope.analyses.correlation"):
            out = engine.run()
        clock.t += 1.0
        assert not [r for r in out if r.name in path_gauges], out
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "paths.G4" in warnings[0] and "kvscope_fs_read_bytes_total" in warnings[0]
    store.ingest("fs", [Sample("kvscope_fs_read_bytes_total", ("/gpfs", "gpfs"), 0.0)], clock.t)
    store.ingest("vllm", [Sample(contract.KV_TRANSFER_BYTES, (*E, "G4", "G2"), 4e9)], clock.t)
    engine.run()
    clock.t += 1.0
    store.ingest("fs", [Sample("kvscope_fs_read_bytes_total", ("/gpfs", "gpfs"), 2e9)], clock.t)
    store.ingest("vllm", [Sample(contract.KV_TRANSFER_BYTES, (*E, "G4", "G2"), 5e9)], clock.t)
    assert value(engine.run(), m.NOISY_NEIGHBOUR, ("G4",)) == 0.0  # seen: a verdict again


class ListSink:
    def __init__(self) -> None:
        self.results: list[object] = []

    def write(self, results: object) -> None:
        self.results.extend(results)  # type: ignore[call-overload]


def test_factory_uses_the_inputs_it_is_given() -> None:
    store, sink, streams = make_store(), ListSink(), Streams()
    records = streams.make(REQUEST_RECORDS, 1024)
    streams.offer(ATTRIBUTED_REQUESTS, sink)
    store.ingest("vllm", engine_readings(10.0, 3.0, 5.0, 1.0, 2e9, 10), 0.0)
    engine = build(CorrelationOptions(), AnalysisInputs(store, streams, Clock()))
    records.put([record(1, prompt_tokens=100, cached_tokens=0, prefill=0.1, queue=0.0)])
    out = by_key(engine.run())
    assert (m.REQUESTS_ATTRIBUTED, (*E, "reference")) in out  # the records it was handed
    assert (m.TTFT_ATTRIBUTED, (*E, "queue", "derived")) in out  # the store it was handed
    assert len(records) == 0 and len(sink.results) == 1  # drained, and the result went to the sink
    assert SPEC.name == "correlation" and SPEC.enabled_by_default


def test_options_validation() -> None:
    from kvscope.agent.config.binding import ConfigError, bind
    with pytest.raises(ConfigError, match="fetch_inside_by_engine"):
        bind(CorrelationOptions, {"fetch_inside_by_engine": {"vllm": "decode"}}, "analyses.correlation")
    with pytest.raises(ConfigError, match="selector"):
        bind(CorrelationOptions, {"paths": {"G4": ["not a selector!"]}}, "analyses.correlation")
    ok = bind(CorrelationOptions, {"paths": {"G4": ['kvscope_rdma_receive_bytes_total{device="mlx5_0",port="1"}']}},
              "analyses.correlation")
    assert ok.paths["G4"][0].startswith("kvscope_rdma")


def test_fetch_and_offload_before_the_first_ttft_are_carried_not_lost() -> None:
    """A reference engine's first request fetches and evicts before it finishes: the window that sees the
    transfer seconds has no TTFT series yet. The seconds wait for the first window that has one."""
    store, clock = make_store(), Clock()
    engine = CorrelationEngine(CorrelationOptions(), store, RecordBuffer(), None, clock)
    labels = ("reference", *E[1:])
    transfers = [Sample(contract.KV_TRANSFER_SECONDS, (*labels, "G2", "G1"), 0.2),
                 Sample(contract.KV_TRANSFER_BYTES, (*labels, "G2", "G1"), 4e8),
                 Sample(contract.KV_TRANSFER_SECONDS, (*labels, "G1", "G2"), 0.3),
                 Sample(contract.KV_TRANSFER_BYTES, (*labels, "G1", "G2"), 6e8)]
    store.ingest("vllm", transfers, clock.t)
    first = engine.run()
    assert not [r for r in first if r.name == m.TTFT_ATTRIBUTED]
    clock.t += 1
    store.ingest("vllm", [*transfers, *(HistogramSample(n, labels, ((1.0, 1.0), (float("inf"), 1.0)), v, 1.0)
                                        for n, v in ((contract.TTFT_SECONDS, 1.0), (contract.QUEUE_SECONDS, 0.1),
                                                     (contract.PREFILL_SECONDS, 0.9)))], clock.t)
    out = by_key(engine.run())
    parts = {lab[3]: r.value for (name, lab), r in out.items() if name == m.TTFT_ATTRIBUTED and isinstance(r, Sample)}
    assert parts["fetch"] == pytest.approx(0.2) and parts["offload"] == pytest.approx(0.3)
    assert parts["prefill"] == pytest.approx(0.9 - 0.2 - 0.3)


def attributed(readings: list[Reading]) -> dict[str, float]:
    out: dict[str, float] = {}
    for (name, labels), reading in by_key(readings).items():
        if name == m.TTFT_ATTRIBUTED and isinstance(reading, Sample):
            out[labels[3]] = out.get(labels[3], 0.0) + reading.value
    return out


def test_a_window_ending_between_first_tokens_and_finishes_is_held_until_they_finish() -> None:
    """Three requests of 1 s TTFT each (0.6 s queue, 0.4 s prefill): all three first tokens fall in window
    one, but only one request finishes there (queue and prefill time are observed when it finishes); the
    other two finish in window two, which has no TTFT of its own."""
    store, clock = make_store(), Clock()
    engine = CorrelationEngine(CorrelationOptions(), store, RecordBuffer(), None, clock)

    def observe(ttft: tuple[float, float], queue: tuple[float, float], prefill: tuple[float, float]) -> None:
        store.ingest("vllm", [hist(contract.TTFT_SECONDS, *ttft), hist(contract.QUEUE_SECONDS, *queue),
                              hist(contract.PREFILL_SECONDS, *prefill)], clock.t)

    observe((3.0, 3), (0.6, 1), (0.4, 1))
    first = attributed(engine.run())
    assert sum(first.values()) == 0.0  # held: two TTFTs have no queue or prefill time yet
    clock.t += 1
    observe((3.0, 3), (1.8, 3), (1.2, 3))
    readings = engine.run()
    assert attributed(readings) == {"queue": pytest.approx(1.8), "prefill": pytest.approx(1.2), "frontend": 0.0,
                                     "other": 0.0}
    assert value(readings, m.ATTRIBUTION_ERROR, (*E, "aggregate", "negative_remainder")) == 0.0


def test_a_held_window_is_attributed_after_hold_windows_however_its_requests_end() -> None:
    """Requests that never finish (hung, or their finish is not on the page) do not hold attribution back for
    more than HOLD_WINDOWS windows and PHASE_HOLD_SECONDS, whichever ends later: their missing phases then
    count as `frontend` (the remainder). Windows of 10 s: HOLD_WINDOWS of them outlast the seconds."""
    store, clock = make_store(), Clock()
    engine = CorrelationEngine(CorrelationOptions(), store, RecordBuffer(), None, clock)
    step = max(10.0, PHASE_HOLD_SECONDS / (HOLD_WINDOWS - 1))
    seen: dict[str, float] = {}
    for window in range(HOLD_WINDOWS):
        store.ingest("vllm", [hist(contract.TTFT_SECONDS, 2.0 + window, 2 + window),
                              hist(contract.QUEUE_SECONDS, 0.6, 1), hist(contract.PREFILL_SECONDS, 0.4, 1)], clock.t)
        seen = attributed(engine.run())
        assert (sum(seen.values()) == 0.0) == (window < HOLD_WINDOWS - 1), window
        clock.t += step
    assert seen == {"queue": pytest.approx(0.6), "prefill": pytest.approx(0.4),
                    "frontend": pytest.approx(2.0 + HOLD_WINDOWS - 1 - 1.0), "other": 0.0}


def test_short_windows_hold_a_window_for_its_phases_for_seconds_not_only_windows() -> None:
    """Windows that tick fast (an agent collecting on every scrape) do not release a window before its
    requests had PHASE_HOLD_SECONDS to finish: two first tokens in window one, their finishes 20 windows of
    50 ms later, attributed together with nothing put in `frontend` or a negative remainder. Released after
    HOLD_WINDOWS windows, as before, queue and prefill read 0 % and frontend 100 % of that window's TTFT."""
    store, clock = make_store(), Clock()
    engine = CorrelationEngine(CorrelationOptions(), store, RecordBuffer(), None, clock)
    readings: list[Reading] = []
    for window in range(21):
        done = window == 20
        store.ingest("vllm", [hist(contract.TTFT_SECONDS, 2.0, 2), hist(contract.QUEUE_SECONDS, 1.2 if done else 0.0,
                                                                      2 if done else 0),
                              hist(contract.PREFILL_SECONDS, 0.8 if done else 0.0, 2 if done else 0)], clock.t)
        readings = engine.run()
        assert (sum(attributed(readings).values()) == 0.0) == (not done), window
        clock.t += 0.05
    assert attributed(readings) == {"queue": pytest.approx(1.2), "prefill": pytest.approx(0.8), "frontend": 0.0,
                                    "other": 0.0}
    assert value(readings, m.ATTRIBUTION_ERROR, (*E, "aggregate", "negative_remainder")) == 0.0


def test_a_window_waits_for_its_records_and_loses_their_gpu_idle_from_prefill() -> None:
    """One request (1 s TTFT: 0.1 s queue, 0.8 s prefill) on an engine that sends records and has a GPU.
    Its window waits for the record; the GPU idled 0.5 s of the prefill phase, 0.2 s of it the request's
    own measured offload: the other 0.3 s leave prefill for other, in the record and in the aggregate (the
0.1 s outside the two phases is frontend), and
    the aggregate's offload is the record's 0.2 s, not the 0.3 s the links leaving G1 were busy."""
    store, buffer, clock = make_store(), RecordBuffer(), Clock(901.0)
    gpus = FakeGpus([(900.0, 900.2, 1.0), (900.2, 900.7, 0.0), (900.7, 901.0, 1.0)])
    engine = CorrelationEngine(CorrelationOptions(offload_inside="prefill"), store, buffer, gpus, clock)

    def observe() -> None:
        store.ingest("vllm", [hist(contract.TTFT_SECONDS, 1.0, 1), hist(contract.QUEUE_SECONDS, 0.1, 1),
                              hist(contract.PREFILL_SECONDS, 0.8, 1),
                              Sample(contract.KV_TRANSFER_SECONDS, (*E, "G1", "G2"), 0.3)], clock.t)

    observe()
    assert sum(attributed(engine.run()).values()) == 0.0  # held: its record has not come
    buffer.put([record(0, arrival=900.0, ttft=1.0, queue=0.1, prefill=0.8, offload_seconds=0.2)])
    clock.t += 1
    observe()
    readings = engine.run()
    split = {"queue": pytest.approx(0.1), "offload": pytest.approx(0.2), "prefill": pytest.approx(0.3),
             "frontend": pytest.approx(0.1), "other": pytest.approx(0.3)}
    assert attributed(readings) == split
    per_request = {lab[3]: r.value for (name, lab), r in by_key(readings).items()
                   if name == m.REQUEST_ATTRIBUTED and isinstance(r, Sample)}
    assert per_request == split


def test_a_record_no_gpu_sample_covers_still_releases_its_window() -> None:
    """The GPU sampler's oldest sample is after the request's prefill began (it started late, or a busy host
    descheduled it): the record's GPU idle is unknown, but the record has come. Its window is attributed at
    once, with the record's offload; it was held for RECORD_HOLD_SECONDS before (a demo run beside a CPU hog
    read its aggregate in that time: prefill 13 % of TTFT against a truth of 59 %)."""
    store, buffer, clock = make_store(), RecordBuffer(), Clock(901.0)
    gpus = FakeGpus([(900.5, 901.0, 1.0)])  # samples from 900.5 s only: the prefill began at 900.1 s
    engine = CorrelationEngine(CorrelationOptions(offload_inside="prefill"), store, buffer, gpus, clock)

    def observe() -> None:
        store.ingest("vllm", [hist(contract.TTFT_SECONDS, 1.0, 1), hist(contract.QUEUE_SECONDS, 0.1, 1),
                              hist(contract.PREFILL_SECONDS, 0.8, 1)], clock.t)

    observe()
    assert sum(attributed(engine.run()).values()) == 0.0  # held: its record has not come
    buffer.put([record(0, arrival=900.0, ttft=1.0, queue=0.1, prefill=0.8, offload_seconds=0.2)])
    clock.t += 1
    observe()
    assert attributed(engine.run()) == {"queue": pytest.approx(0.1), "offload": pytest.approx(0.2),
                                        "prefill": pytest.approx(0.6), "frontend": pytest.approx(0.1),
                                        "other": 0.0}


def test_a_record_that_comes_before_its_first_token_is_scraped_counts_for_that_window() -> None:
    """The request's span (its record) reaches the agent while its fetch is already on the page but its first
    token is not yet (the next scrape shows it). The record is taken with the fetch-only window; the window
    that then brings the TTFT must not wait RECORD_HOLD_SECONDS for a record that has already come."""
    store, buffer, clock = make_store(), RecordBuffer(), Clock(901.0)
    gpus = FakeGpus([(899.0, 903.0, 1.0)])  # busy throughout: no idle to move
    engine = CorrelationEngine(CorrelationOptions(fetch_inside="prefill"), store, buffer, gpus, clock)
    store.ingest("vllm", [hist(contract.TTFT_SECONDS, 0.0, 0), hist(contract.QUEUE_SECONDS, 0.0, 0),
                          hist(contract.PREFILL_SECONDS, 0.0, 0)], clock.t)
    engine.run()
    clock.t += 1
    store.ingest("vllm", [hist(contract.TTFT_SECONDS, 0.0, 0), hist(contract.QUEUE_SECONDS, 0.0, 0),
                          hist(contract.PREFILL_SECONDS, 0.0, 0),
                          Sample(contract.KV_TRANSFER_BYTES, (*E, "G4", "G1"), 1e9),
                          Sample(contract.KV_TRANSFER_SECONDS, (*E, "G4", "G1"), 0.2)], clock.t)
    buffer.put([record(0, arrival=900.5, ttft=1.0, queue=0.1, prefill=0.8)])
    assert sum(attributed(engine.run()).values()) == 0.0  # the fetch waits for its request's phase
    clock.t += 1
    store.ingest("vllm", [hist(contract.TTFT_SECONDS, 1.0, 1), hist(contract.QUEUE_SECONDS, 0.1, 1),
                          hist(contract.PREFILL_SECONDS, 0.8, 1),
                          Sample(contract.KV_TRANSFER_BYTES, (*E, "G4", "G1"), 1e9),
                          Sample(contract.KV_TRANSFER_SECONDS, (*E, "G4", "G1"), 0.2)], clock.t)
    assert attributed(engine.run()) == {"queue": pytest.approx(0.1), "fetch": pytest.approx(0.2),
                                        "prefill": pytest.approx(0.6), "frontend": pytest.approx(0.1),
                                        "other": 0.0}


def test_an_engine_that_sends_no_records_is_waited_for_once() -> None:
    store, clock = make_store(), Clock()
    gpus = FakeGpus([(990.0, 2000.0, 0.0)])
    engine = CorrelationEngine(CorrelationOptions(), store, RecordBuffer(), gpus, clock)
    start, n = clock.t, 0
    while True:
        n += 1
        store.ingest("vllm", [hist(contract.TTFT_SECONDS, 1.0 * n, n), hist(contract.QUEUE_SECONDS, 0.1 * n, n),
                              hist(contract.PREFILL_SECONDS, 0.8 * n, n)], clock.t)
        seen = attributed(engine.run())
        if sum(seen.values()):
            break
        clock.t += 1
    assert clock.t - start == RECORD_HOLD_SECONDS  # held for its records, then attributed whole
    assert seen == {"queue": pytest.approx(0.1 * n), "prefill": pytest.approx(0.8 * n),
                    "frontend": pytest.approx(0.1 * n), "other": 0.0}
    clock.t += 1
    store.ingest("vllm", [hist(contract.TTFT_SECONDS, 1.0 * n + 1, n + 1),
                          hist(contract.QUEUE_SECONDS, 0.1 * n + 0.1, n + 1),
                          hist(contract.PREFILL_SECONDS, 0.8 * n + 0.8, n + 1)], clock.t)
    assert sum(attributed(engine.run()).values()) == pytest.approx(n + 1.0)  # counters: the next 1 s, not held
