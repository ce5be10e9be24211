"""What each NVML query adds to one GPU's state, for the NVML collector: busy/idle time (utilization
samples, else utilization rates), memory, PCIe bytes (byte counters, else throughput integrated over
time), NVLink bytes and per-process memory.

A query the GPU does not support moves that reading to its fallback (or off) for good. The arithmetic
is in `kvscope.collectors.gpu.samples`; which GPUs there are, and when they are lost, is the collector's
(`kvscope.collectors.gpu.nvml`). `lock` guards what other threads read or write: `recent` (read by the
correlation engine) and the PCIe totals (written by the PCIe counter thread).
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

from kvscope.collectors.gpu.calls import UNSUPPORTED, NvmlCalls, missing
from kvscope.collectors.gpu.samples import (
    US_PER_S,
    VALUE_ATTR,
    CounterState,
    GpuState,
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


class GpuReader:
    """`*_fallback`: on "not supported", fall back to utilization rates / PCIe throughput (else off);
    `process_match`: a regex on the process's comm ("" reports every compute process)."""

    def __init__(self, calls: NvmlCalls, lock: threading.Lock, max_sample_gap_seconds: float,
                 utilization_fallback: bool, pcie_fallback: bool, process_match: str, proc_root: str) -> None:
        self._calls = calls
        self._lock = lock
        self._max_gap = max_sample_gap_seconds
        self._utilization_fallback, self._pcie_fallback = utilization_fallback, pcie_fallback
        self._match = re.compile(process_match) if process_match else None
        self._proc_root = proc_root

    def poll(self, gpu: GpuState, now: float, wall: float, pcie_counters: bool) -> None:
        """One collection's reads; `pcie_counters`: read the PCIe counters here (no thread reads them)."""
        self._poll_utilization(gpu, now, wall)
        mem = self._calls.call(gpu, "nvmlDeviceGetMemoryInfo", gpu.handle)
        gpu.memory = None if missing(mem) else (float(mem.used), float(mem.total))
        if gpu.pcie_method == "counter" and pcie_counters:
            self.read_pcie(gpu, now)
        self._poll_nvlink(gpu, now)
        if gpu.pcie_method == "throughput_estimate":
            self._poll_throughput(gpu, now)
        if gpu.processes_supported:
            self._poll_processes(gpu)

    def _poll_utilization(self, gpu: GpuState, now: float, wall: float) -> None:
        nvml: Any = self._calls.nvml
        if gpu.method == "samples":
            answer = self._calls.call(gpu, "nvmlDeviceGetSamples", gpu.handle, nvml.NVML_GPU_UTILIZATION_SAMPLES,
                                      gpu.last_ts_us or 0)
            if answer is UNSUPPORTED:  # MIG, vGPU, old GPUs
                gpu.method = "utilization_rates" if self._utilization_fallback else "none"
            elif not missing(answer):
                value_type, samples = answer
                attr = VALUE_ATTR.get(int(value_type), "")
                pairs = [(int(s.timeStamp), float(getattr(s.sampleValue, attr))) for s in samples]
                self._add_samples(gpu, pairs, wall)
        if gpu.method == "utilization_rates":
            rates = self._calls.call(gpu, "nvmlDeviceGetUtilizationRates", gpu.handle)
            if rates is UNSUPPORTED:
                gpu.method = "none"
            elif not missing(rates):
                fraction = percent_to_fraction(float(rates.gpu))
                if gpu.anchor is not None:
                    span = now - gpu.anchor
                    busy, idle, unsampled = split_span(fraction, span, self._max_gap)
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
        walk = integrate_samples(gpu.last_ts_us, pairs, round(self._max_gap * US_PER_S))
        gpu.last_ts_us = walk.last_ts_us
        gpu.busy += walk.busy_s
        gpu.idle += walk.idle_s
        gpu.unsampled += walk.unsampled_s
        offset = gpu.offset_s
        with self._lock:
            gpu.recent.extend((i.start_us / US_PER_S + offset, i.end_us / US_PER_S + offset, i.busy_fraction)
                              for i in walk.intervals)

    def read_pcie(self, gpu: GpuState, now: float) -> None:
        """Adds what the PCIe byte counters moved since the last read (across at most one wrap)."""
        nvml: Any = self._calls.nvml
        ids = [nvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, nvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES]
        answer = self._calls.call(gpu, "nvmlDeviceGetFieldValues", gpu.handle, ids)
        if answer is UNSUPPORTED:
            self._fields_unsupported(gpu, ("pcie_tx",))
        if missing(answer):
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
        nvml: Any = self._calls.nvml
        ids = [(nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ALL_LINKS),
               (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ALL_LINKS)]
        answer = self._calls.call(gpu, "nvmlDeviceGetFieldValues", gpu.handle, ids)
        if answer is UNSUPPORTED:
            gpu.nvlink = False
        if missing(answer):
            return
        for key, value, value_type in self._field_entries(gpu, answer, "nvlink"):
            self._count(gpu, key, value * KIB, value_type, KIB, now)

    def _field_entries(self, gpu: GpuState, answer: Any, kind: str) -> list[tuple[str, float, int]]:
        """The entries that succeeded; none for PCIe once one of its fields is not supported (it falls back)."""
        good, unsupported = self._calls.field_entries(gpu, answer)
        if unsupported:
            self._fields_unsupported(gpu, unsupported)
            return [] if kind == "pcie" else good
        return good

    def _fields_unsupported(self, gpu: GpuState, keys: Any) -> None:
        for key in keys:
            if key.startswith("pcie") and gpu.pcie_method == "counter":
                with self._lock:
                    gpu.pcie_method = "throughput_estimate" if self._pcie_fallback else "none"
                    gpu.pcie_raw.clear()
                    gpu.pcie_bytes = {"pcie_tx": 0.0, "pcie_rx": 0.0}
                self._calls.log_once((gpu.label, "pcie"), logging.INFO,
                                     "nvml: GPU %s: no PCIe byte counters; PCIe by %s", gpu.label, gpu.pcie_method)
            elif key.startswith("nvlink"):
                gpu.nvlink = False

    def _count(self, gpu: GpuState, key: str, value: float, value_type: int, scale: float, now: float) -> None:
        previous = gpu.counters.get(key)
        modulus = None
        if previous is not None:
            modulus = wrap_modulus(previous.bytes, value, value_type, now - previous.at, scale)
        gpu.counters[key] = CounterState(value, now, modulus)

    def _poll_throughput(self, gpu: GpuState, now: float) -> None:
        nvml: Any = self._calls.nvml
        tx = self._calls.call(gpu, "nvmlDeviceGetPcieThroughput", gpu.handle, nvml.NVML_PCIE_UTIL_TX_BYTES)
        rx = self._calls.call(gpu, "nvmlDeviceGetPcieThroughput", gpu.handle, nvml.NVML_PCIE_UTIL_RX_BYTES)
        if tx is UNSUPPORTED or rx is UNSUPPORTED:
            gpu.pcie_method = "none"
            return
        if missing(tx) or missing(rx):
            return
        if gpu.anchor_pcie is not None and 0 < now - gpu.anchor_pcie <= self._max_gap:
            span = now - gpu.anchor_pcie
            with self._lock:
                gpu.pcie_bytes["pcie_tx"] += float(tx) * KIB * span
                gpu.pcie_bytes["pcie_rx"] += float(rx) * KIB * span
        gpu.anchor_pcie = now

    def _poll_processes(self, gpu: GpuState) -> None:
        answer = self._calls.call(gpu, "nvmlDeviceGetComputeRunningProcesses", gpu.handle)
        if answer is UNSUPPORTED:
            gpu.processes_supported = False
        processes: dict[tuple[str, str], float] = {}
        if not missing(answer):
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
