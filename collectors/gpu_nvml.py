"""NVIDIA GPUs over NVML: busy/idle time, PCIe and NVLink bytes, memory, per-process memory.

The NVML module is injected (``pynvml`` in production, imported lazily by the factory; a recorded
replay in tests), so every code path runs against recorded NVML answers. No GPU, no driver or no
library is not an error: the collector returns no readings (``kvscope_collector_up`` stays 1), logs
once at info and tries ``nvmlInit`` again only every ``init_retry_seconds``. A GPU that falls off
the bus (``NVML_ERROR_GPU_IS_LOST``) is reported by ``kvscope_gpu_lost`` while the others keep
reporting. The arithmetic (sample integration, wrap decisions) is in `collectors.gpu_samples`;
docs/gpu.md says what each number means and where it overstates.

Nothing here imports a third-party package at module level: scripts/gpu_check.py runs it on a GPU
machine that has only torch, nvidia-ml-py, prometheus-client and psutil.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import re
import threading
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Literal

from kvscope.agent.pipeline import CollectorContext, CollectorSpec
from kvscope.agent.readings import Reading
from kvscope.collectors.gpu_samples import (
    METRICS,
    US_PER_S,
    VALUE_ATTR,
    CounterState,
    GpuState,
    gpu_readings,
    integrate_samples,
    looks_like_epoch_us,
    percent_to_fraction,
    split_span,
    unwrap,
    wrap_modulus,
)

log = logging.getLogger("kvscope.collectors.nvml")

ALL_LINKS = 0xFFFFFFFF  # scopeId meaning "summed over every NVLink" for the NVLink throughput fields
KIB = 1024  # NVLink throughput fields count KiB; GetPcieThroughput answers "KB/s", taken as KiB/s [?]
@dataclass
class NvmlOptions:
    init_retry_seconds: float = 300.0  # how often to try nvmlInit again when there is no GPU/driver
    max_sample_gap_seconds: float = 5.0  # longer stretches without a sample count as unsampled
    recent_intervals: int = 4096  # (start, end, busy_fraction) kept per GPU for the correlation engine
    utilization: Literal["auto", "rates", "off"] = "auto"  # auto: samples, falling back to rates
    pcie: Literal["auto", "throughput", "off"] = "auto"  # auto: byte counters, falling back to throughput
    # The PCIe byte counters are 32-bit (H200, driver 580) and wrap after 4 GiB, every ~68 ms at PCIe Gen5
    # x16's 63 GB/s: a thread reads them this often (must stay below 2^32 B / link rate; one read cost
    # 0.32 ms on an H200) and unwraps them. 0 reads them only at each collection (loses wraps under load).
    pcie_poll_seconds: float = 0.05
    nvlink: bool = True
    processes: bool = True
    process_match: str = ""  # regex on the process's comm; "" reports every compute process

    def validate(self, path: str) -> None:
        for name in ("init_retry_seconds", "max_sample_gap_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.pcie_poll_seconds < 0:
            raise ValueError(f"pcie_poll_seconds must be >= 0, got {self.pcie_poll_seconds}")
        if self.recent_intervals < 1:
            raise ValueError(f"recent_intervals must be >= 1, got {self.recent_intervals}")
        try:
            re.compile(self.process_match)
        except re.error as exc:
            raise ValueError(f"process_match is not a regular expression: {exc}") from None


class _GpuLost(Exception):
    pass


_UNSUPPORTED, _FAILED, _NOT_FOUND = object(), object(), object()
_FIELD_KEYS = {
    "NVML_FI_DEV_PCIE_COUNT_TX_BYTES": "pcie_tx",
    "NVML_FI_DEV_PCIE_COUNT_RX_BYTES": "pcie_rx",
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX": "nvlink_tx",
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX": "nvlink_rx",
}


class NvmlCollector:
    def __init__(self, nvml: Any | None, options: NvmlOptions, clock: Callable[[], float],
                 wall_clock: Callable[[], float], proc_root: str = "/proc") -> None:
        self._nvml = nvml
        self._options = options
        self._clock, self._wall = clock, wall_clock
        self._proc_root = proc_root.rstrip("/")
        self._match = re.compile(options.process_match) if options.process_match else None
        self._gpus: list[GpuState] | None = None
        self._next_init_at: float | None = None
        self._logged: set[Hashable] = set()
        self._lock = threading.Lock()  # guards `recent` (read by the correlation engine) and PCIe totals
        self._sampler: threading.Thread | None = None
        self._stop = threading.Event()
        errors: list[type[BaseException]] = []
        if nvml is not None:
            errors.append(nvml.NVMLError)
            mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)  # unversioned call on an old driver
            if isinstance(mismatch, type):
                errors.append(mismatch)
        self._errors = tuple(errors)

    # -- the correlation engine's view --------------------------------------------------------------

    def gpus(self) -> dict[str, str]:
        """gpu label (NVML index) -> UUID of every GPU opened so far."""
        return {g.label: g.uuid for g in self._gpus or []}

    def recent_samples(self, gpu: str) -> list[tuple[float, float, float]]:
        """(start, end, busy_fraction) in wall-clock seconds, oldest first; ``gpu`` is the label or UUID."""
        with self._lock:
            for g in self._gpus or []:
                if gpu in (g.label, g.uuid):
                    return list(g.recent)
        return []

    # -- collection ----------------------------------------------------------------------------------

    def collect(self) -> list[Reading]:
        now, wall = self._clock(), self._wall()  # read once per poll, so a recording can replay them
        if not self._ensure_init(now):
            return []
        readings: list[Reading] = []
        for gpu in self._gpus or []:
            if gpu.lost:
                self._try_recover(gpu, now)
            if not gpu.lost:
                try:
                    self._poll(gpu, now, wall)
                except _GpuLost:
                    self._mark_lost(gpu, now)
            with self._lock:
                readings.extend(gpu_readings(gpu))
        return readings

    def close(self) -> None:
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join(2.0)
        if self._gpus is not None and self._nvml is not None:
            self._gpus = None
            self._shutdown()

    def _log_once(self, key: Hashable, level: int, message: str, *args: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.log(level, message, *args)

    def _ensure_init(self, now: float) -> bool:
        if self._gpus is not None:
            return True
        nvml = self._nvml
        if nvml is None:
            self._log_once("import", logging.INFO, "nvml: the pynvml module is not installed; no GPU data")
            return False
        if self._next_init_at is not None and now < self._next_init_at:
            return False
        self._next_init_at = now + self._options.init_retry_seconds
        try:
            nvml.nvmlInit()
        except self._errors as exc:
            self._log_once(("init", type(exc).__name__), logging.INFO,
                           "nvml: no GPU data (nvmlInit: %s); trying again every %g s",
                           type(exc).__name__, self._options.init_retry_seconds)
            return False
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except self._errors as exc:
            count = 0
            self._log_once(("count", type(exc).__name__), logging.INFO, "nvml: nvmlDeviceGetCount: %s", exc)
        gpus = [g for g in (self._open(i, now) for i in range(count)) if g is not None]
        if not gpus:
            self._log_once("nogpu", logging.INFO, "nvml: the driver answers but shows no usable GPU; no GPU data")
            self._shutdown()
            return False
        self._gpus = gpus
        if self._options.pcie_poll_seconds > 0 and any(g.pcie_method == "counter" for g in gpus):
            self._sampler = threading.Thread(target=self._sample_pcie, args=(gpus,), name="nvml-pcie", daemon=True)
            self._sampler.start()
        log.info("nvml: %d GPU(s): %s", len(gpus), ", ".join(f"{g.label}={g.uuid} {g.name}" for g in gpus))
        return True

    def _shutdown(self) -> None:
        with contextlib.suppress(*self._errors):
            self._nvml.nvmlShutdown()  # type: ignore[union-attr]

    def _open(self, index: int, now: float) -> GpuState | None:
        try:
            handle = self._nvml.nvmlDeviceGetHandleByIndex(index)  # type: ignore[union-attr]
        except self._errors as exc:
            self._log_once(("open", index), logging.INFO, "nvml: GPU %d cannot be opened (%s); skipped",
                           index, type(exc).__name__)
            return None
        opts = self._options
        gpu = GpuState(str(index), handle, deque(maxlen=opts.recent_intervals), nvlink=opts.nvlink,
                   processes_supported=opts.processes,
                   method={"auto": "samples", "rates": "utilization_rates", "off": "none"}[opts.utilization],
                   pcie_method={"auto": "counter", "throughput": "throughput_estimate", "off": "none"}[opts.pcie])
        try:
            gpu.uuid = self._text(self._call(gpu, "nvmlDeviceGetUUID", handle))
            gpu.name = self._text(self._call(gpu, "nvmlDeviceGetName", handle))
            pci = self._call(gpu, "nvmlDeviceGetPciInfo", handle)
            gpu.pci_bus_id = "" if self._missing(pci) else self._text(pci.busId)
            mig = self._call(gpu, "nvmlDeviceGetMigMode", handle)
            if not self._missing(mig):
                gpu.mig = "enabled" if mig[0] == self._nvml.NVML_DEVICE_MIG_ENABLE else "disabled"  # type: ignore[union-attr]
        except _GpuLost:
            self._mark_lost(gpu, now)
        return gpu

    @staticmethod
    def _missing(value: object) -> bool:
        return value is _UNSUPPORTED or value is _FAILED or value is _NOT_FOUND

    def _text(self, value: object) -> str:
        if self._missing(value):
            return ""
        return value.decode(errors="replace") if isinstance(value, bytes) else str(value)

    def _call(self, gpu: GpuState, fn: str, *args: Any) -> Any:
        """One NVML call; NVML errors become sentinels (GPU_IS_LOST raises _GpuLost)."""
        nvml: Any = self._nvml
        try:
            return getattr(nvml, fn)(*args)
        except self._errors as exc:
            code = getattr(exc, "value", None)
            if code == nvml.NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost from exc
            if code == nvml.NVML_ERROR_NOT_FOUND:
                return _NOT_FOUND
            if code in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND) or code is None:
                self._log_once((gpu.label, fn, "unsupported"), logging.INFO,
                               "nvml: GPU %s: %s is not supported (%s)", gpu.label, fn, type(exc).__name__)
                return _UNSUPPORTED
            gpu.errors[fn] = gpu.errors.get(fn, 0) + 1
            self._log_once((gpu.label, fn, code), logging.WARNING, "nvml: GPU %s: %s failed: %s (%s)",
                           gpu.label, fn, type(exc).__name__, exc)
            return _FAILED

    def _mark_lost(self, gpu: GpuState, now: float) -> None:
        gpu.lost, gpu.recover_at = True, now + self._options.init_retry_seconds
        gpu.memory, gpu.processes, gpu.anchor, gpu.anchor_pcie = None, {}, None, None
        log.warning("nvml: GPU %s (%s) is lost (fell off the bus); the other GPUs keep reporting", gpu.label, gpu.uuid)

    def _try_recover(self, gpu: GpuState, now: float) -> None:
        if now < gpu.recover_at or not gpu.uuid:
            return
        gpu.recover_at = now + self._options.init_retry_seconds
        nvml: Any = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
            nvml.nvmlDeviceGetMemoryInfo(handle)
        except self._errors:
            return
        gpu.handle, gpu.lost = handle, False
        log.info("nvml: GPU %s (%s) answers again", gpu.label, gpu.uuid)

    def _poll(self, gpu: GpuState, now: float, wall: float) -> None:
        self._poll_utilization(gpu, now, wall)
        mem = self._call(gpu, "nvmlDeviceGetMemoryInfo", gpu.handle)
        gpu.memory = None if self._missing(mem) else (float(mem.used), float(mem.total))
        if gpu.pcie_method == "counter" and self._sampler is None:
            self._read_pcie(gpu, now)
        self._poll_nvlink(gpu, now)
        if gpu.pcie_method == "throughput_estimate":
            self._poll_throughput(gpu, now)
        if gpu.processes_supported:
            self._poll_processes(gpu)

    def _poll_utilization(self, gpu: GpuState, now: float, wall: float) -> None:
        nvml: Any = self._nvml
        if gpu.method == "samples":
            answer = self._call(gpu, "nvmlDeviceGetSamples", gpu.handle, nvml.NVML_GPU_UTILIZATION_SAMPLES,
                                gpu.last_ts_us or 0)
            if answer is _UNSUPPORTED:  # MIG, vGPU, old GPUs
                gpu.method = "utilization_rates" if self._options.utilization == "auto" else "none"
            elif not self._missing(answer):
                value_type, samples = answer
                attr = VALUE_ATTR.get(int(value_type), "")
                pairs = [(int(s.timeStamp), float(getattr(s.sampleValue, attr))) for s in samples]
                self._add_samples(gpu, pairs, wall)
        if gpu.method == "utilization_rates":
            rates = self._call(gpu, "nvmlDeviceGetUtilizationRates", gpu.handle)
            if rates is _UNSUPPORTED:
                gpu.method = "none"
            elif not self._missing(rates):
                fraction = percent_to_fraction(float(rates.gpu))
                if gpu.anchor is not None:
                    span = now - gpu.anchor
                    busy, idle, unsampled = split_span(fraction, span, self._options.max_sample_gap_seconds)
                    gpu.busy, gpu.idle, gpu.unsampled = gpu.busy + busy, gpu.idle + idle, gpu.unsampled + unsampled
                    if busy + idle > 0:
                        with self._lock:
                            gpu.recent.append((wall - span, wall, fraction))
                gpu.anchor = now

    def _add_samples(self, gpu: GpuState, pairs: list[tuple[int, float]], wall: float) -> None:
        if not pairs:
            return
        if gpu.offset_s is None:
            newest = max(ts for ts, _ in pairs)
            gpu.offset_s = 0.0 if looks_like_epoch_us(newest, wall) else wall - newest / US_PER_S
            if gpu.offset_s:
                log.info("nvml: GPU %s sample timestamps are not epoch µs; wall time estimated", gpu.label)
        walk = integrate_samples(gpu.last_ts_us, pairs, round(self._options.max_sample_gap_seconds * US_PER_S))
        gpu.last_ts_us = walk.last_ts_us
        gpu.busy += walk.busy_s
        gpu.idle += walk.idle_s
        gpu.unsampled += walk.unsampled_s
        offset = gpu.offset_s
        with self._lock:
            gpu.recent.extend((i.start_us / US_PER_S + offset, i.end_us / US_PER_S + offset, i.busy_fraction)
                              for i in walk.intervals)

    def _sample_pcie(self, gpus: list[GpuState]) -> None:
        """The PCIe counter thread: read often enough that no two wraps fall between reads."""
        while not self._stop.wait(self._options.pcie_poll_seconds):
            for gpu in gpus:
                if gpu.pcie_method == "counter" and not gpu.lost:
                    try:
                        self._read_pcie(gpu, self._clock())
                    except _GpuLost:
                        continue  # the next collection finds it lost and reports it
                    except Exception:  # never let the thread die silently: PCIe totals would freeze
                        if ("sampler", gpu.label) not in self._logged:
                            self._logged.add(("sampler", gpu.label))
                            log.exception("nvml: GPU %s: reading the PCIe counters failed", gpu.label)

    def _read_pcie(self, gpu: GpuState, now: float) -> None:
        nvml: Any = self._nvml
        ids = [nvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, nvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES]
        answer = self._call(gpu, "nvmlDeviceGetFieldValues", gpu.handle, ids)
        if answer is _UNSUPPORTED:
            self._fields_unsupported(gpu, ("pcie_tx",))
        if self._missing(answer):
            return
        for key, value, value_type in self._field_entries(gpu, answer, "pcie"):
            with self._lock:
                previous = gpu.pcie_raw.get(key)
                if previous is not None:
                    gpu.pcie_bytes[key] += unwrap(previous.bytes, value, value_type, now - previous.at)
                gpu.pcie_raw[key] = CounterState(value, now)

    def _poll_nvlink(self, gpu: GpuState, now: float) -> None:
        if not gpu.nvlink:
            return
        nvml: Any = self._nvml
        ids = [(nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ALL_LINKS),
               (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ALL_LINKS)]
        answer = self._call(gpu, "nvmlDeviceGetFieldValues", gpu.handle, ids)
        if answer is _UNSUPPORTED:
            gpu.nvlink = False
        if self._missing(answer):
            return
        for key, value, value_type in self._field_entries(gpu, answer, "nvlink"):
            self._count(gpu, key, value * KIB, value_type, KIB, now)

    def _field_entries(self, gpu: GpuState, answer: Any, kind: str) -> list[tuple[str, float, int]]:
        """(key, raw value, value type) of the entries that succeeded; per-entry errors handled here."""
        nvml: Any = self._nvml
        keys = {getattr(nvml, name): key for name, key in _FIELD_KEYS.items()}
        good, unsupported = [], []
        for entry in answer:
            key, code = keys.get(int(entry.fieldId)), int(entry.nvmlReturn)
            if key is None:
                continue
            if code == nvml.NVML_SUCCESS:
                value_type = int(entry.valueType)
                good.append((key, float(getattr(entry.value, VALUE_ATTR.get(value_type, ""))), value_type))
            elif code == nvml.NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost
            elif code in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                unsupported.append(key)
            else:
                call = f"nvmlDeviceGetFieldValues:{key}"
                gpu.errors[call] = gpu.errors.get(call, 0) + 1
                self._log_once((gpu.label, call, code), logging.WARNING,
                               "nvml: GPU %s: field %s failed with NVML error %d", gpu.label, key, code)
        if unsupported:
            self._fields_unsupported(gpu, unsupported)
            return [] if kind == "pcie" else good
        return good

    def _fields_unsupported(self, gpu: GpuState, keys: Any) -> None:
        for key in keys:
            if key.startswith("pcie") and gpu.pcie_method == "counter":
                with self._lock:
                    gpu.pcie_method = "throughput_estimate" if self._options.pcie == "auto" else "none"
                    gpu.pcie_raw.clear()
                    gpu.pcie_bytes = {"pcie_tx": 0.0, "pcie_rx": 0.0}
                self._log_once((gpu.label, "pcie"), logging.INFO, "nvml: GPU %s: no PCIe byte counters; PCIe by %s",
                               gpu.label, gpu.pcie_method)
            elif key.startswith("nvlink"):
                gpu.nvlink = False

    def _count(self, gpu: GpuState, key: str, value: float, value_type: int, scale: float, now: float) -> None:
        previous = gpu.counters.get(key)
        modulus = None
        if previous is not None:
            modulus = wrap_modulus(previous.bytes, value, value_type, now - previous.at, scale)
        gpu.counters[key] = CounterState(value, now, modulus)

    def _poll_throughput(self, gpu: GpuState, now: float) -> None:
        nvml: Any = self._nvml
        tx = self._call(gpu, "nvmlDeviceGetPcieThroughput", gpu.handle, nvml.NVML_PCIE_UTIL_TX_BYTES)
        rx = self._call(gpu, "nvmlDeviceGetPcieThroughput", gpu.handle, nvml.NVML_PCIE_UTIL_RX_BYTES)
        if tx is _UNSUPPORTED or rx is _UNSUPPORTED:
            gpu.pcie_method = "none"
            return
        if self._missing(tx) or self._missing(rx):
            return
        if gpu.anchor_pcie is not None and 0 < now - gpu.anchor_pcie <= self._options.max_sample_gap_seconds:
            span = now - gpu.anchor_pcie
            with self._lock:
                gpu.pcie_bytes["pcie_tx"] += float(tx) * KIB * span
                gpu.pcie_bytes["pcie_rx"] += float(rx) * KIB * span
        gpu.anchor_pcie = now

    def _poll_processes(self, gpu: GpuState) -> None:
        answer = self._call(gpu, "nvmlDeviceGetComputeRunningProcesses", gpu.handle)
        if answer is _UNSUPPORTED:
            gpu.processes_supported = False
        processes: dict[tuple[str, str], float] = {}
        if not self._missing(answer):
            for proc in answer:
                used = getattr(proc, "usedGpuMemory", None)
                if used is None:  # not available (e.g. Windows WDDM, some MIG setups)
                    continue
                pid = int(proc.pid)
                command = self._command(pid)
                if self._match is not None and not self._match.search(command):
                    continue
                key = (str(pid), command)  # one pid can hold several MIG instances: sum them
                processes[key] = processes.get(key, 0.0) + float(used)
        gpu.processes = processes

    def _command(self, pid: int) -> str:
        try:
            with open(f"{self._proc_root}/{pid}/comm", encoding="utf-8", errors="replace") as fh:
                return fh.read().strip()
        except OSError:
            return ""

def build(options: NvmlOptions, context: CollectorContext) -> NvmlCollector:
    try:
        nvml: Any | None = importlib.import_module("pynvml")  # lazily: the agent runs without it
    except ImportError:
        nvml = None
    return NvmlCollector(nvml, options, context.clock, context.wall_clock, context.proc_root)


SPEC = CollectorSpec(
    name="nvml",
    description="NVIDIA GPUs over NVML: busy/idle seconds, PCIe/NVLink bytes, memory (quiet without a GPU)",
    options=NvmlOptions,
    factory=build,
    metrics=METRICS,
    enabled_by_default=True,
)
