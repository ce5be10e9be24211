"""The pure side of the NVML collector: sample integration, wrap decisions, per-GPU state -> readings.

No NVML, no I/O, no clock: every function here takes numbers (or the per-GPU state) and returns
numbers (or readings), so the exact busy/idle seconds and byte totals the collector reports can be
tested on literal sample sequences.

Integration of NVML utilization samples (``nvmlDeviceGetSamples(h, NVML_GPU_UTILIZATION_SAMPLES, ts)``):
each sample ``(t_i, v_i)`` carries the percent of time one or more kernels ran during the driver's
sampling period that *ends* at ``t_i`` (µs, CPU clock). We take that period to be ``(t_{i-1}, t_i]``,
the interval since the previous sample, so

    busy  += v_i / 100 * (t_i - t_{i-1})
    idle  += (1 - v_i / 100) * (t_i - t_{i-1})

The very first sample the collector ever sees has no predecessor: it only anchors the walk. Later
polls pass the newest timestamp seen as ``lastSeenTimeStamp``, and the first new sample's predecessor
is that remembered sample, so consecutive polls tile time with no overlap and no hole. Samples at or
before the remembered timestamp (a driver that returns overlapping samples) are dropped, and of two
samples with one timestamp the first the driver listed is kept. An interval
longer than ``max_gap_us`` (the driver's ring buffer overflowed between two polls, or the driver
stopped sampling) is not attributed to either side: it is counted as *unsampled*, because the one
value at its end says nothing about the rest of it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kvscope.agent.core.catalogue import counter, gauge
from kvscope.agent.core.readings import Reading, Sample

US_PER_S = 1_000_000

# nvmlValueType_t -> the member of the c_nvmlValue_t union that holds the value (pynvml names).
VALUE_ATTR: dict[int, str] = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
# Width in bits of the unsigned integer types, the modulus of a counter that wraps (double: none).
VALUE_BITS: dict[int, int] = {1: 32, 2: 64, 3: 64, 6: 16}

# No GPU link moves more than this (NVLink 5 is 900 GB/s per direction); a counter decrease that
# would need more than this rate to be a wrap is a reset (driver reload, GPU reset) instead.
MAX_PLAUSIBLE_BYTES_PER_SECOND = 2e12


@dataclass(frozen=True, slots=True)
class Interval:
    """One sampled stretch of GPU time in µs, with the fraction of it a kernel was running."""

    start_us: int
    end_us: int
    busy_fraction: float


@dataclass(slots=True)
class Integration:
    """What one batch of samples adds, and where the walk stands afterwards."""

    last_ts_us: int | None
    busy_s: float = 0.0
    idle_s: float = 0.0
    unsampled_s: float = 0.0
    intervals: list[Interval] = field(default_factory=list)


def percent_to_fraction(percent: float) -> float:
    """NVML reports 0..100; anything outside (never seen, but the value is a raw union) is clamped."""
    return min(max(percent, 0.0), 100.0) / 100.0


def integrate_samples(last_ts_us: int | None, samples: Iterable[tuple[int, float]], max_gap_us: int) -> Integration:
    """Walk utilization samples ``(timestamp_us, percent)`` forward from ``last_ts_us`` (None: no anchor yet)."""
    result = Integration(last_ts_us)
    previous = last_ts_us
    for ts, percent in sorted(samples, key=lambda sample: sample[0]):  # stable: a duplicate keeps its first value
        if previous is not None and ts <= previous:
            continue  # already counted (overlapping answer) or a duplicate timestamp
        if previous is not None:
            span = ts - previous
            if span > max_gap_us:
                result.unsampled_s += span / US_PER_S
            else:
                fraction = percent_to_fraction(percent)
                result.busy_s += fraction * span / US_PER_S
                result.idle_s += (1.0 - fraction) * span / US_PER_S
                result.intervals.append(Interval(previous, ts, fraction))
        previous = ts
    result.last_ts_us = previous
    return result


def split_span(fraction: float, span_s: float, max_gap_s: float) -> tuple[float, float, float]:
    """(busy, idle, unsampled) seconds for a span covered by one utilization value (the fallback path)."""
    if span_s <= 0.0:
        return 0.0, 0.0, 0.0
    if span_s > max_gap_s:
        return 0.0, 0.0, span_s
    return fraction * span_s, (1.0 - fraction) * span_s, 0.0


def wrap_modulus(
    previous: float | None, raw: float, value_type: int, elapsed_s: float, scale: float = 1.0
) -> int | None:
    """The modulus to hand the store with a counter reading, or None when a decrease must be a reset.

    NVML says the PCIe byte counters "can be wrapped" without naming a width; the only width it
    gives is the value's type (an H200 reports them as 32-bit ``uiVal``). A 32-bit (or narrower)
    counter that goes down has wrapped: at PCIe speed it does so every few hundred milliseconds.
    A 64-bit counter that goes down is taken as wrapped only if the bytes that implies (up to the
    top of its range and round again) could have moved in ``elapsed_s`` at a rate no link reaches;
    otherwise it restarted (driver reload, GPU reset) and must count from zero, not add ~2^64.
    ``scale`` converts the raw unit to bytes (1024 for the NVLink KiB counters).
    """
    bits = VALUE_BITS.get(value_type)
    if bits is None or previous is None or raw >= previous:
        return None
    modulus = (1 << bits) * scale
    if bits <= 32:
        return int(modulus)  # wraps within seconds under load: a decrease is a wrap, a restart is rare
    implied_bytes = raw + modulus - previous
    if implied_bytes <= MAX_PLAUSIBLE_BYTES_PER_SECOND * max(elapsed_s, 0.0) + scale:
        return int(modulus)
    return None


def unwrap(previous: float | None, raw: float, value_type: int, elapsed_s: float) -> float:
    """Bytes a counter advanced since ``previous`` (0 for the first reading), across at most one wrap.

    Used where the collector must read faster than the store sees: the PCIe byte counters are 32-bit
    (valueType 1 on an H200, driver 5xx/NVML 13, recorded by scripts/gpu_check.py) and wrap every
    ~67 ms at PCIe Gen5 x16 speed, so several wraps between two 1 s collections would be lost.
    A decrease that cannot be a wrap is a restart: the new value is what moved since.
    """
    if previous is None:
        return 0.0
    if raw >= previous:
        return raw - previous
    modulus = wrap_modulus(previous, raw, value_type, elapsed_s)
    return raw + modulus - previous if modulus is not None else raw


def looks_like_epoch_us(ts_us: int, wall_s: float, tolerance_s: float = 86_400.0) -> bool:
    """NVML sample timestamps are µs on the CPU clock; true when they are µs since 1970 like time.time()."""
    return abs(ts_us / US_PER_S - wall_s) <= tolerance_s


# -- what the collector exports: the catalogue entries and per-GPU state -> readings -----------------

GPU = ("gpu",)

METRICS = (
    gauge("kvscope_gpu_info", "", ("gpu", "uuid", "name", "pci_bus_id", "mig", "method", "pcie_method"),
          "Always 1 per GPU NVML sees. gpu is the NVML index (not the CUDA index); method is how busy/idle "
          "time is measured (samples, utilization_rates, none); pcie_method is counter (exact) or "
          "throughput_estimate (20 ms snapshots integrated over time) or none.", "NVML"),
    counter("kvscope_gpu_busy_seconds_total", "seconds", GPU,
            "Time at least one kernel was running on the GPU (NVML utilization.gpu integrated over time); "
            "overstates SM activity.", "NVML nvmlDeviceGetSamples / nvmlDeviceGetUtilizationRates"),
    counter("kvscope_gpu_idle_seconds_total", "seconds", GPU,
            "Time no kernel was running on the GPU, from the same samples as busy.", "NVML"),
    counter("kvscope_gpu_unsampled_seconds_total", "seconds", GPU,
            "Time covered by no utilization sample (gaps longer than max_sample_gap_seconds); neither busy nor "
            "idle.", "NVML"),
    counter("kvscope_gpu_pcie_receive_bytes_total", "bytes", GPU,
            "Bytes the GPU received over PCIe (host to device: the G2->G1 wire).",
            "NVML field NVML_FI_DEV_PCIE_COUNT_RX_BYTES, else nvmlDeviceGetPcieThroughput integrated"),
    counter("kvscope_gpu_pcie_transmit_bytes_total", "bytes", GPU,
            "Bytes the GPU sent over PCIe (device to host: the G1->G2 wire).",
            "NVML field NVML_FI_DEV_PCIE_COUNT_TX_BYTES, else nvmlDeviceGetPcieThroughput integrated"),
    counter("kvscope_gpu_nvlink_receive_bytes_total", "bytes", GPU,
            "Data bytes received over all NVLinks of the GPU.", "NVML field NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX"),
    counter("kvscope_gpu_nvlink_transmit_bytes_total", "bytes", GPU,
            "Data bytes sent over all NVLinks of the GPU.", "NVML field NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX"),
    gauge("kvscope_gpu_memory_used_bytes", "bytes", GPU, "GPU memory in use (all processes and the driver).",
          "NVML nvmlDeviceGetMemoryInfo"),
    gauge("kvscope_gpu_memory_total_bytes", "bytes", GPU, "GPU memory installed.", "NVML nvmlDeviceGetMemoryInfo"),
    gauge("kvscope_gpu_process_memory_used_bytes", "bytes", ("gpu", "pid", "command"),
          "GPU memory used by one compute process (pid as NVML reports it; command from <proc_root>/<pid>/comm, "
          "empty when that pid is not visible).", "NVML nvmlDeviceGetComputeRunningProcesses"),
    gauge("kvscope_gpu_lost", "", GPU, "1 when NVML says the GPU fell off the bus (GPU_IS_LOST), else 0.", "NVML"),
    counter("kvscope_gpu_nvml_errors_total", "", ("gpu", "call"),
            "NVML calls that failed with an error other than not-supported / no-new-samples.", "NVML"),
)

COUNTER_NAMES = {"pcie_tx": "kvscope_gpu_pcie_transmit_bytes_total", "pcie_rx": "kvscope_gpu_pcie_receive_bytes_total",
                  "nvlink_tx": "kvscope_gpu_nvlink_transmit_bytes_total",
                  "nvlink_rx": "kvscope_gpu_nvlink_receive_bytes_total"}


@dataclass
class CounterState:
    bytes: float
    at: float
    modulus: int | None = None


@dataclass
class GpuState:
    label: str
    handle: Any
    recent: deque[tuple[float, float, float]]
    uuid: str = ""
    name: str = ""
    pci_bus_id: str = ""
    mig: str = ""
    method: str = "none"
    pcie_method: str = "none"
    nvlink: bool = True
    processes_supported: bool = True
    lost: bool = False
    recover_at: float = 0.0
    last_ts_us: int | None = None  # newest utilization sample counted
    offset_s: float | None = None  # added to sample time to get wall time (0 when NVML uses the epoch)
    anchor: float | None = None  # clock of the last utilization-rates reading (fallback integration)
    anchor_pcie: float | None = None  # clock of the last PCIe throughput reading (fallback integration)
    busy: float = 0.0
    idle: float = 0.0
    unsampled: float = 0.0
    counters: dict[str, CounterState] = field(default_factory=dict)  # NVLink: raw totals for the store
    pcie_raw: dict[str, CounterState] = field(default_factory=dict)  # last raw PCIe counter reads
    pcie_bytes: dict[str, float] = field(default_factory=lambda: {"pcie_tx": 0.0, "pcie_rx": 0.0})
    memory: tuple[float, float] | None = None
    processes: dict[tuple[str, str], float] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)


def gpu_readings(gpu: GpuState) -> list[Reading]:
    g = (gpu.label,)
    out: list[Reading] = [
        Sample("kvscope_gpu_info", (gpu.label, gpu.uuid, gpu.name, gpu.pci_bus_id, gpu.mig, gpu.method,
                                    gpu.pcie_method), 1.0),
        Sample("kvscope_gpu_lost", g, 1.0 if gpu.lost else 0.0),
    ]
    if gpu.method != "none":
        out += [Sample("kvscope_gpu_busy_seconds_total", g, gpu.busy),
                Sample("kvscope_gpu_idle_seconds_total", g, gpu.idle),
                Sample("kvscope_gpu_unsampled_seconds_total", g, gpu.unsampled)]
    for key, state in sorted(gpu.counters.items()):
        out.append(Sample(COUNTER_NAMES[key], g, state.bytes, state.modulus))
    if gpu.pcie_method != "none":  # unwrapped counters or integrated throughput: totals kept here
        out += [Sample(COUNTER_NAMES[key], g, value) for key, value in sorted(gpu.pcie_bytes.items())]
    if gpu.memory is not None:
        out += [Sample("kvscope_gpu_memory_used_bytes", g, gpu.memory[0]),
                Sample("kvscope_gpu_memory_total_bytes", g, gpu.memory[1])]
    out += [Sample("kvscope_gpu_process_memory_used_bytes", (gpu.label, pid, command), used)
            for (pid, command), used in sorted(gpu.processes.items())]
    out += [Sample("kvscope_gpu_nvml_errors_total", (gpu.label, call), float(n))
            for call, n in sorted(gpu.errors.items())]
    return out
