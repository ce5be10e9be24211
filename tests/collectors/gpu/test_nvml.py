"""The NVML collector on recorded NVML answers (tests/fixtures/nvml, see its README for their origin)."""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from kvscope.agent.core.catalogue import AGENT_METRICS, Catalogue
from kvscope.agent.core.readings import Reading, Sample
from kvscope.agent.core.store import Store
from kvscope.agent.runtime.scheduler import Scheduler, collector_job
from kvscope.collectors.gpu.nvml import SPEC, NvmlCollector, NvmlOptions
from kvscope.collectors.gpu.samples import METRICS, integrate_samples, split_span, wrap_modulus
from testkit import nvml_replay
from testkit.nvml_replay import NvmlRecorder, NvmlReplay, ReplayMiss
from testkit.paths import FIXTURES, ROOT

NVML = FIXTURES / "nvml"
T0 = 1754000000000000  # µs since 1970, the first sample of two_h200_constructed.json
T0_S = T0 / 1e6


class Clocks:
    """The collector's monotonic and wall clocks, stepped by the test (one reading per poll)."""

    def __init__(self, clock: float = 0.0, wall: float = 1754000000.0) -> None:
        self.clock, self.wall = clock, wall

    def set(self, poll: dict[str, float]) -> None:
        self.clock, self.wall = poll["clock"], poll["wall"]


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((NVML / name).read_text())
    return data


def make(recording: dict[str, Any] | Any, proc_root: str = "/nonexistent", **options: Any
         ) -> tuple[NvmlCollector, Any, Clocks]:
    nvml = NvmlReplay(recording) if isinstance(recording, dict) else recording
    clocks = Clocks()
    options.setdefault("pcie_poll_seconds", 0.0)  # counters read at each collect(), no thread
    collector = NvmlCollector(nvml, NvmlOptions(**options), lambda: clocks.clock, lambda: clocks.wall, proc_root)
    return collector, nvml, clocks


def by_key(readings: Iterable[Reading]) -> dict[tuple[str, tuple[str, ...]], Sample]:
    out = {}
    for r in readings:
        assert isinstance(r, Sample)
        out[(r.name, r.labels)] = r
    return out


def value(readings: Iterable[Reading], name: str, *labels: str) -> float:
    return by_key(readings)[(name, labels)].value


def flat(intervals: list[tuple[float, float, float]]) -> list[float]:
    return [x for interval in intervals for x in interval]


def store_with_gpu_metrics() -> Store:
    return Store(Catalogue([*AGENT_METRICS, *METRICS]))


# -- the pure arithmetic ---------------------------------------------------------------------------


def test_samples_integrate_over_the_interval_since_the_previous_sample() -> None:
    walk = integrate_samples(None, [(10_000_000, 30), (10_200_000, 100), (10_400_000, 50), (10_600_000, 0)], 5_000_000)
    # the first sample only anchors; then 0.2 s at 100 %, 0.2 s at 50 %, 0.2 s at 0 %
    assert walk.busy_s == pytest.approx(0.3, abs=1e-12)
    assert walk.idle_s == pytest.approx(0.3, abs=1e-12)
    assert walk.unsampled_s == 0.0
    assert walk.last_ts_us == 10_600_000
    assert [(i.start_us, i.end_us, i.busy_fraction) for i in walk.intervals] == [
        (10_000_000, 10_200_000, 1.0), (10_200_000, 10_400_000, 0.5), (10_400_000, 10_600_000, 0.0)]


def test_overlapping_and_unsorted_samples_are_counted_once() -> None:
    first = integrate_samples(None, [(1_000_000, 0), (1_200_000, 100)], 5_000_000)
    # the driver answers again with the last seen sample, out of order, and a duplicate timestamp
    second = integrate_samples(first.last_ts_us, [(1_600_000, 50), (1_200_000, 100), (1_400_000, 100),
                                                  (1_400_000, 0)], 5_000_000)
    assert first.busy_s + second.busy_s == pytest.approx(0.2 + 0.2 + 0.1, abs=1e-12)
    assert first.idle_s + second.idle_s == pytest.approx(0.1, abs=1e-12)
    assert second.last_ts_us == 1_600_000


def test_a_gap_longer_than_the_limit_is_unsampled_not_busy_or_idle() -> None:
    walk = integrate_samples(1_000_000, [(1_200_000, 100), (11_200_000, 100), (11_400_000, 0)], 5_000_000)
    assert walk.busy_s == pytest.approx(0.2)
    assert walk.idle_s == pytest.approx(0.2)
    assert walk.unsampled_s == pytest.approx(10.0)
    assert split_span(0.25, 2.0, 5.0) == (0.5, 1.5, 0.0)
    assert split_span(0.25, 6.0, 5.0) == (0.0, 0.0, 6.0)


def test_wrap_or_reset_decision() -> None:
    # a 32-bit counter going down is a wrap, however little time passed
    assert wrap_modulus(2**32 - 1000, 500, 1, 1.0) == 2**32
    assert wrap_modulus(3000, 2000, 1, 0.0) == 2**32
    # a 64-bit counter near the top of its range wrapping within a second is a wrap ...
    assert wrap_modulus(2**64 - 1000, 500, 3, 1.0) == 2**64
    # ... but one far from the top restarted (driver reload, GPU reset): no modulus, the store resets
    assert wrap_modulus(9000, 2, 3, 1.0) is None
    assert wrap_modulus(9000, 9001, 3, 1.0) is None
    assert wrap_modulus(None, 5, 3, 1.0) is None
    assert wrap_modulus(5.0, 1.0, 0, 1.0) is None  # a double has no modulus
    # KiB counters: the modulus is in bytes
    assert wrap_modulus((2**64 - 1) * 1024.0, 0.0, 3, 1.0, scale=1024) == 2**64 * 1024


# -- the replay itself ---------------------------------------------------------------------------


def test_replay_constants_and_errors_match_pynvml() -> None:
    pynvml = pytest.importorskip("pynvml")
    for name, number in nvml_replay.CONSTANTS.items():
        assert getattr(pynvml, name) == number, name
    replay = NvmlReplay(load("no_library.json"))
    for name in ("NVMLError_LibraryNotFound", "NVMLError_GpuIsLost", "NVMLError_NotSupported", "NVMLError_NotFound"):
        assert hasattr(pynvml, name) and hasattr(replay, name), name
    not_found = nvml_replay.ERROR_CLASSES["NVMLError_LibraryNotFound"]
    assert replay.NVMLError_LibraryNotFound is not_found
    with pytest.raises(not_found) as caught:
        replay.nvmlInit()
    assert caught.value.value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    assert isinstance(caught.value, replay.NVMLError)
    with pytest.raises(ReplayMiss):
        replay.nvmlDeviceGetCount()


# -- the collector on the two-GPU fixture ----------------------------------------------------------


def run_two_gpus(tmp_path: Path, polls: int
                 ) -> tuple[NvmlCollector, NvmlReplay, list[list[Reading]], Store, Clocks]:
    recording = load("two_h200_constructed.json")
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "comm").write_text("VLLM::EngineCor\n")
    collector, replay, clocks = make(recording, proc_root=str(tmp_path))
    store = store_with_gpu_metrics()
    outputs = []
    for poll in recording["polls"][:polls]:
        clocks.set(poll)
        readings = collector.collect()
        result = store.ingest("nvml", readings, poll["wall"])
        assert result.rejected == 0
        outputs.append(readings)
    return collector, replay, outputs, store, clocks


def test_identity_memory_and_processes(tmp_path: Path) -> None:
    _, _, outputs, _, _ = run_two_gpus(tmp_path, 1)
    first = by_key(outputs[0])
    info = [k for k in first if k[0] == "kvscope_gpu_info"]
    assert sorted(info) == [
        ("kvscope_gpu_info", ("0", "GPU-5f1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d", "NVIDIA H200", "00000000:19:00.0",
                              "disabled", "samples", "counter")),
        ("kvscope_gpu_info", ("1", "GPU-9a8b7c6d-5e4f-3a2b-1c0d-fedcba987654", "NVIDIA H200", "00000000:3B:00.0",
                              "disabled", "utilization_rates", "throughput_estimate")),
    ]
    assert value(outputs[0], "kvscope_gpu_memory_used_bytes", "0") == 90_000_000_000
    assert value(outputs[0], "kvscope_gpu_memory_total_bytes", "0") == 150_754_820_096
    # pid 4243 has no memory figure (skipped); pid 777 is not visible in this /proc (empty command)
    procs = {k[1]: r.value for k, r in first.items() if k[0] == "kvscope_gpu_process_memory_used_bytes"}
    assert procs == {("0", "4242", "VLLM::EngineCor"): 80_000_000_000, ("0", "777", ""): 524_288_000}


def test_busy_idle_from_samples_walks_last_seen_timestamp(tmp_path: Path) -> None:
    collector, replay, outputs, store, _ = run_two_gpus(tmp_path, 3)
    # poll 1: 0.2 s at 100 % + 0.2 s at 50 %; poll 2 (overlaps poll 1 by one sample): 0.2 s at 0 % + 0.2 s at 25 %
    assert value(outputs[0], "kvscope_gpu_busy_seconds_total", "0") == pytest.approx(0.3, abs=1e-12)
    assert value(outputs[0], "kvscope_gpu_idle_seconds_total", "0") == pytest.approx(0.1, abs=1e-12)
    for poll in (1, 2):  # poll 3: NVML_ERROR_NOT_FOUND = no new samples, nothing added
        assert value(outputs[poll], "kvscope_gpu_busy_seconds_total", "0") == pytest.approx(0.35, abs=1e-12)
        assert value(outputs[poll], "kvscope_gpu_idle_seconds_total", "0") == pytest.approx(0.45, abs=1e-12)
        assert value(outputs[poll], "kvscope_gpu_unsampled_seconds_total", "0") == 0.0
    asked = [args[2] for fn, args in replay.calls if fn == "nvmlDeviceGetSamples" and args[0] == {"handle": 0}]
    assert asked == [0, T0 + 400_000, T0 + 800_000]
    assert flat(collector.recent_samples("0")) == pytest.approx(flat([
        (T0_S, T0_S + 0.2, 1.0), (T0_S + 0.2, T0_S + 0.4, 0.5), (T0_S + 0.4, T0_S + 0.6, 0.0),
        (T0_S + 0.6, T0_S + 0.8, 0.25)]), abs=1e-6)
    assert collector.recent_samples("GPU-5f1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d") == collector.recent_samples("0")
    assert store.value("kvscope_gpu_busy_seconds_total", ("0",)) == pytest.approx(0.35, abs=1e-12)


def test_pcie_counters_exact_with_a_reset(tmp_path: Path) -> None:
    _, _, _, store, _ = run_two_gpus(tmp_path, 3)
    # TX 10000 -> 20000 -> 3000 (counter restarted: counts 3000 from zero); RX +4096 then +100000.
    # The collector unwraps these itself (they wrap faster than it collects), so totals start at 0.
    assert store.value("kvscope_gpu_pcie_transmit_bytes_total", ("0",)) == 10_000 + 3_000
    assert store.value("kvscope_gpu_pcie_receive_bytes_total", ("0",)) == 4_096 + 100_000
    assert store.value("kvscope_source_resets_total", ("nvml",)) is None
    # NVLink entries were NOT_SUPPORTED on GPU 0: not asked again, no series
    assert ("0",) not in store.values("kvscope_gpu_nvlink_transmit_bytes_total")


def test_gpu_without_samples_falls_back_and_a_lost_gpu_does_not_stop_the_others(tmp_path: Path, caplog: Any) -> None:
    caplog.set_level(logging.INFO, "kvscope.collectors.nvml")
    collector, replay, outputs, _, clocks = run_two_gpus(tmp_path, 3)
    second = outputs[1]
    # utilization rates: 80 % over the 1.0 s since the previous poll (poll 1 only anchors)
    assert value(second, "kvscope_gpu_busy_seconds_total", "1") == pytest.approx(0.8)
    assert value(second, "kvscope_gpu_idle_seconds_total", "1") == pytest.approx(0.2)
    assert flat(collector.recent_samples("1")) == pytest.approx([1754000001.0, 1754000002.0, 0.8], abs=1e-6)
    # PCIe throughput (KiB/s, 20 ms snapshots) integrated over 1.0 s, marked by pcie_method
    assert value(second, "kvscope_gpu_pcie_transmit_bytes_total", "1") == 1000 * 1024
    assert value(second, "kvscope_gpu_pcie_receive_bytes_total", "1") == 3000 * 1024
    # NVLink KiB counters in bytes
    assert value(second, "kvscope_gpu_nvlink_transmit_bytes_total", "1") == 1512 * 1024
    assert value(second, "kvscope_gpu_nvlink_receive_bytes_total", "1") == 2000 * 1024
    # poll 3: GPU 1 is lost; its totals stay, GPU 0 keeps reporting fresh data
    third = outputs[2]
    assert value(third, "kvscope_gpu_lost", "1") == 1.0
    assert value(third, "kvscope_gpu_lost", "0") == 0.0
    assert value(third, "kvscope_gpu_busy_seconds_total", "1") == pytest.approx(0.8)
    assert ("kvscope_gpu_memory_used_bytes", ("1",)) not in by_key(third)
    assert value(third, "kvscope_gpu_memory_used_bytes", "0") == 95_000_000_000
    assert sum("is lost" in r.message for r in caplog.records) == 1
    # a lost GPU is looked for again only after init_retry_seconds
    assert "nvmlDeviceGetHandleByUUID" not in [fn for fn, _ in replay.calls]
    clocks.clock = 102.0 + 300.0
    after = collector.collect()
    assert [fn for fn, _ in replay.calls].count("nvmlDeviceGetHandleByUUID") == 1
    assert value(after, "kvscope_gpu_lost", "1") == 1.0


def test_the_pcie_thread_unwraps_several_wraps_between_collections() -> None:
    recording = load("pcie_wrap_constructed.json")
    tx = [2**32 - 1000, 500, 800, 2**32 - 296, 100]  # wraps twice: more than one collection could see
    key_args = [{"handle": 0}, [197, 198]]
    recording["calls"] = [c for c in recording["calls"] if c["args"] != key_args] + [
        {"fn": "nvmlDeviceGetFieldValues", "args": key_args, "result": [
            {"fieldId": 197, "scopeId": 0, "timestamp": T0, "latencyUsec": 0, "valueType": 1, "nvmlReturn": 0,
             "value": v},
            {"fieldId": 198, "scopeId": 0, "timestamp": T0, "latencyUsec": 0, "valueType": 3, "nvmlReturn": 0,
             "value": 7000}]} for v in tx]
    collector, replay, _ = make(recording, pcie_poll_seconds=0.002)
    try:
        collector.collect()  # opens the GPU and starts the thread
        deadline = time.monotonic() + 10
        while sum(args == key_args for _, args in replay.calls) < len(tx) + 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        readings = collector.collect()
    finally:
        collector.close()
    assert value(readings, "kvscope_gpu_pcie_transmit_bytes_total", "0") == 1500 + 300 + (2**32 - 296 - 800) + 396
    assert value(readings, "kvscope_gpu_pcie_receive_bytes_total", "0") == 0


def test_uint_counter_wraps_and_a_mig_gpu_reports_no_busy_idle() -> None:
    recording = load("pcie_wrap_constructed.json")
    collector, _, clocks = make(recording)
    store = store_with_gpu_metrics()
    for poll in recording["polls"]:
        clocks.set(poll)
        readings = collector.collect()
        assert store.ingest("nvml", readings, poll["wall"]).rejected == 0
    # TX (32-bit): 2^32-1000 -> 500 is a wrap of 1500 bytes, then +300; RX (64-bit): 7000 -> 9000 -> 2 is a reset
    assert store.value("kvscope_gpu_pcie_transmit_bytes_total", ("0",)) == 1500 + 300
    assert store.value("kvscope_gpu_pcie_receive_bytes_total", ("0",)) == 2000 + 2
    info = [k for k in store.values("kvscope_gpu_info")]
    assert info == [("0", "GPU-5f1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d", "NVIDIA H200", "00000000:19:00.0", "enabled",
                     "none", "counter")]
    assert store.values("kvscope_gpu_busy_seconds_total") == {}


# -- no GPU, no driver, no library -----------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["no_library.json", "driver_not_loaded.json"])
def test_no_gpu_is_quiet_and_retries_rarely(fixture: str, caplog: Any) -> None:
    caplog.set_level(logging.INFO, "kvscope.collectors.nvml")
    collector, replay, clocks = make(load(fixture), init_retry_seconds=300.0)
    for t in (0.0, 1.0, 2.0, 299.0):
        clocks.clock = t
        assert collector.collect() == []
    assert [fn for fn, _ in replay.calls] == ["nvmlInit"]
    clocks.clock = 300.0
    assert collector.collect() == []
    assert [fn for fn, _ in replay.calls] == ["nvmlInit", "nvmlInit"]
    messages = [r for r in caplog.records if r.name == "kvscope.collectors.nvml"]
    assert len(messages) == 1 and messages[0].levelno == logging.INFO


def test_without_pynvml_and_through_the_scheduler_collector_up_stays_1(caplog: Any) -> None:
    caplog.set_level(logging.INFO, "kvscope.collectors.nvml")
    collector = NvmlCollector(None, NvmlOptions(), time.monotonic, time.time)
    store = store_with_gpu_metrics()
    scheduler = Scheduler(store, [collector_job("nvml", collector, 0.01, 1.0)])
    scheduler.start()
    try:
        deadline = time.monotonic() + 10
        while (store.value("kvscope_collector_runs_total", ("nvml",)) or 0) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        scheduler.stop()
    assert (store.value("kvscope_collector_runs_total", ("nvml",)) or 0) >= 5
    assert store.value("kvscope_collector_up", ("nvml",)) == 1.0
    assert store.value("kvscope_collector_errors_total", ("nvml",)) == 0.0
    assert sum("not installed" in r.message for r in caplog.records) == 1


# -- registration, options, recording round trip ----------------------------------------------------


def test_registered_enabled_and_catalogued() -> None:
    from kvscope.agent.app.wiring import build_catalogue
    from kvscope.collectors.registry import collector_specs

    assert collector_specs()["nvml"] is SPEC and SPEC.enabled_by_default
    catalogue = build_catalogue()
    for spec in METRICS:
        assert catalogue[spec.name] == spec


@pytest.mark.parametrize("bad", [{"init_retry_seconds": 0.0}, {"max_sample_gap_seconds": -1.0},
                                 {"pcie_poll_seconds": -1}, {"recent_intervals": 0}, {"process_match": "("}])
def test_bad_options_are_rejected(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        NvmlOptions(**bad).validate("collectors.nvml")


def test_a_recording_replays_to_the_same_readings(tmp_path: Path) -> None:
    fixture = load("two_h200_constructed.json")
    recorder = NvmlRecorder(NvmlReplay(fixture), origin="round trip")
    live, _, clocks = make(recorder)
    live_out = []
    for poll in fixture["polls"]:
        clocks.set(poll)
        recorder.mark_poll(poll["clock"], poll["wall"])
        live_out.append(live.collect())
    path = tmp_path / "recording.json"
    path.write_text(json.dumps(recorder.recording()))
    recorded = json.loads(path.read_text())
    assert recorded["polls"] == fixture["polls"]
    replayed, _, clocks = make(recorded)
    for poll, expected in zip(recorded["polls"], live_out, strict=True):
        clocks.set(poll)
        assert replayed.collect() == expected


# -- scripts/gpu_check.py (its GPU part runs on a real GPU only; here: recording, analysis, verdicts) --


def gpu_check() -> Any:
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_gpu_check_imports_nothing_beyond_its_four_packages() -> None:
    import subprocess
    import sys

    blocked = ["msgspec", "zmq", "opentelemetry", "yaml", "bcrypt", "numpy"]
    code = ("import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in blocked)
            + "import runpy; runpy.run_path('scripts/gpu_check.py', run_name='not_main')\n")
    root = ROOT
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env={"PYTHONPATH": str(root)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_gpu_check_records_in_the_fixture_format_and_judges() -> None:
    check = gpu_check()
    poller = check.Poller(NvmlReplay(load("two_h200_constructed.json")), NvmlOptions(pcie_poll_seconds=0), 1.0, "test")
    for _ in range(3):
        poller.poll()
    recording = json.loads(json.dumps(poller.recording()))
    assert [c["poll"] for c in recording["calls"] if c["fn"] == "nvmlDeviceGetSamples" and c["args"][0] == {"handle": 0}
            ] == [0, 1, 2]
    # the recording replays to the readings the live run produced
    replayed, _, clocks = make(recording)
    for poll in recording["polls"]:
        clocks.set(poll)
        out = replayed.collect()
    assert out == poller.last
    assert [r[0] for r in recording["final_readings"]] == [r.name for r in poller.last]
    facts = check.driver_facts(recording, "0")
    assert facts["max_pcie_counter"] == 5_104_096
    assert facts["pids"] == [777, 4242, 4243]
    lags = [(T0 + 400_000) / 1e6 - recording["polls"][0]["wall"], (T0 + 800_000) / 1e6 - recording["polls"][1]["wall"]]
    assert facts["sample_ts_minus_wall_s"]["median"] == pytest.approx(sum(lags) / 2)
    assert "4242" in check.facts_line(facts, 4242) and "NOT listed" in check.facts_line(facts, 1)


def test_gpu_check_arithmetic_and_verdicts() -> None:
    check = gpu_check()
    intervals = [(0.0, 1.0, 1.0), (1.0, 2.0, 0.5)]
    assert check.busy_inside(intervals, [(0.5, 1.5)]) == pytest.approx(0.5 + 0.25)
    # shifted by +0.5 s the first interval (100 % busy) exactly fills the window
    assert check.busy_inside(intervals, [(0.5, 1.5)], shift=0.5) == pytest.approx(1.0)
    assert check.busy_inside(intervals, [(0.5, 1.5)], shift=-0.5) == pytest.approx(0.5)
    good = {"method": "samples", "pcie_method": "counter", "busy_s": 15.2, "on_s": 15.0, "idle_s": 20.0,
            "unsampled_s": 0.0, "elapsed_s": 35.5, "rx_bytes": 53e9, "h2d_bytes": 50e9, "tx_bytes": 50e9,
            "d2h_bytes": 50e9}
    assert check.judge(good) == []
    assert len(check.judge({**good, "busy_s": 20.0})) == 1
    assert len(check.judge({**good, "rx_bytes": 10e9})) == 1
    assert check.judge({**good, "rx_bytes": 20e9, "pcie_method": "throughput_estimate"}) == []
    assert len(check.judge({**good, "unsampled_s": 10.0, "idle_s": 10.0})) == 1
    assert check.judge({**good, "method": "none", "busy_s": None}) == ["no busy/idle data (method 'none')"]


def test_gpu_check_without_torch_cannot_run(tmp_path: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here")
    assert gpu_check().main(["--out", str(tmp_path / "out")]) == 2


# -- real recordings (scripts/gpu_check.py on an H200, driver 580.159.04) -------------------------------


def final(recording: dict[str, Any], name: str, *labels: str) -> float:
    return float(next(v for n, ls, v, _ in recording["final_readings"] if n == name and tuple(ls) == labels))


@pytest.mark.parametrize("fixture", ["h200_real_auto.json", "h200_real_fallback.json"])
def test_real_h200_recording_replays_to_the_live_busy_idle_totals(fixture: str) -> None:
    recording = load(fixture)
    fallback = "fallback" in fixture
    options = {"utilization": "rates", "pcie": "throughput"} if fallback else {}
    collector, _, clocks = make(recording, **options)
    for poll in recording["polls"]:
        clocks.set(poll)
        readings = collector.collect()
    names = ["kvscope_gpu_busy_seconds_total", "kvscope_gpu_idle_seconds_total", "kvscope_gpu_unsampled_seconds_total"]
    if fallback:  # the throughput estimate is read at each collection, so it replays too
        names += ["kvscope_gpu_pcie_receive_bytes_total", "kvscope_gpu_pcie_transmit_bytes_total"]
    for name in names:
        assert value(readings, name, "0") == final(recording, name, "0"), name
    # the H200 kept sampling while idle, every 0.2 s, on the epoch clock
    periods = [round(end - start, 2) for start, end, _ in collector.recent_samples("0")]
    assert fallback or statistics.median(periods) == 0.2
    assert value(readings, "kvscope_gpu_unsampled_seconds_total", "0") == 0.0


def test_real_h200_pcie_counters_are_32_bit_and_unwrap_to_the_live_totals() -> None:
    from kvscope.collectors.gpu.samples import unwrap

    recording = load("h200_real_auto.json")
    last_poll = len(recording["polls"]) - 1  # reads after the last collection are not in its readings
    reads = [c for c in recording["calls"] if c["fn"] == "nvmlDeviceGetFieldValues"
             and c["args"] == [{"handle": 0}, [197, 198]] and c["poll"] <= last_poll]
    assert len(reads) > 1000  # the 20 ms thread's reads, in order
    totals = {197: 0.0, 198: 0.0}
    previous: dict[int, float] = {}
    wraps = 0
    for call in reads:
        for entry in call["result"]:
            assert entry["valueType"] == 1 and entry["nvmlReturn"] == 0  # uiVal: 32-bit
            fid, raw = entry["fieldId"], float(entry["value"])
            wraps += fid in previous and raw < previous[fid]
            totals[fid] += unwrap(previous.get(fid), raw, 1, 0.02)
            previous[fid] = raw
    assert wraps > 30  # ~40 GiB each way per 1 s poll would have been lost at 1 s reads
    assert totals[198] == final(recording, "kvscope_gpu_pcie_receive_bytes_total", "0")
    assert totals[197] == final(recording, "kvscope_gpu_pcie_transmit_bytes_total", "0")
