"""NVIDIA GPUs over NVML: busy/idle time, PCIe and NVLink bytes, memory, per-process memory.

The NVML module is injected (``pynvml`` in production, imported lazily by the factory; a recorded
replay in tests), so every code path runs against recorded NVML answers. No GPU, no driver or no
library is not an error: the collector returns no readings (``kvscope_collector_up`` stays 1), logs
once at info and tries ``nvmlInit`` again only every ``init_retry_seconds``. A GPU that falls off
the bus (``NVML_ERROR_GPU_IS_LOST``) is reported by ``kvscope_gpu_lost`` while the others keep
reporting.

This module holds that lifecycle: nvmlInit and its backoff, opening the GPUs, marking them lost and
recovering them, and the PCIe counter thread. What each poll reads is in `kvscope.collectors.gpu.reads`;
how an NVML call's errors become data, in `kvscope.collectors.gpu.calls`; the arithmetic (sample
integration, wrap decisions), in `kvscope.collectors.gpu.samples`. docs/gpu.md says what each number means
and where it overstates.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kvscope.agent.core.pipeline import CollectorContext, CollectorSpec
from kvscope.agent.core.readings import Reading, Sample
from kvscope.agent.core.streams import GPU_INTERVALS, StreamUse
from kvscope.collectors.gpu.calls import GpuLost, NvmlCalls, missing, text
from kvscope.collectors.gpu.pod_resources import POD_INFO, GpuOwner, PodResourcesClient, pod_info
from kvscope.collectors.gpu.reads import GpuReader
from kvscope.collectors.gpu.samples import METRICS, GpuState, gpu_readings

log = logging.getLogger("kvscope.collectors.nvml")


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
    # the kubelet's pod-resources socket (the node agent): kvscope_gpu_pod_info names the pod of each GPU
    pod_resources_socket: str = ""

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


# The kubelet is asked which pod holds each GPU at most this often (a List call per collection, every second,
# would be many times dcgm-exporter's one per scrape); a GPU handed to a new pod carries it within this long.
POD_OWNERS_REFRESH_SECONDS = 10.0


class NvmlCollector:
    def __init__(self, nvml: Any | None, options: NvmlOptions, clock: Callable[[], float],
                 wall_clock: Callable[[], float], proc_root: str = "/proc",
                 owners: Callable[[], Mapping[str, GpuOwner]] | None = None) -> None:
        self._calls = NvmlCalls(nvml)
        self._owners = owners  # GPU UUID -> the container the kubelet gave it (None: not on Kubernetes)
        self._owners_asked: tuple[float, Mapping[str, GpuOwner]] | None = None  # when last asked, its answer
        self._options = options
        self._clock, self._wall = clock, wall_clock
        self._gpus: list[GpuState] | None = None
        self._next_init_at: float | None = None
        self._lock = threading.Lock()  # guards `recent` (read by the correlation engine) and PCIe totals
        self._reader = GpuReader(self._calls, self._lock, max_sample_gap_seconds=options.max_sample_gap_seconds,
                                 utilization_fallback=options.utilization == "auto",
                                 pcie_fallback=options.pcie == "auto", process_match=options.process_match,
                                 proc_root=proc_root.rstrip("/"))
        self._sampler: threading.Thread | None = None
        self._stop = threading.Event()

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
                    self._reader.poll(gpu, now, wall, pcie_counters=self._sampler is None)
                except GpuLost:
                    self._mark_lost(gpu, now)
            with self._lock:
                readings.extend(gpu_readings(gpu))
        return readings + self._pod_info()

    def _pod_info(self) -> list[Reading]:
        if self._owners is None:
            return []
        now = self._clock()
        if self._owners_asked is None or now - self._owners_asked[0] >= POD_OWNERS_REFRESH_SECONDS:
            try:
                self._owners_asked = (now, self._owners())
            except Exception as exc:  # the kubelet restarting, a socket not mounted: GPU data goes on without pods
                self._owners_asked = (now, {})  # asked again after the refresh period, not every collection
                self._calls.log_once(("pod-resources", type(exc).__name__), logging.WARNING,
                                     "nvml: the kubelet's pod-resources API does not answer (%s: %s); GPU series "
                                     "carry no pod until it does", type(exc).__name__, exc)
        owners = self._owners_asked[1]
        gpus = [(g.label, g.uuid) for g in self._gpus or []]
        return [Sample(POD_INFO.name, labels, value) for labels, value in pod_info(gpus, owners)]

    def close(self) -> None:
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join(2.0)
        if self._gpus is not None and self._calls.nvml is not None:
            self._gpus = None
            self._shutdown()
        close = getattr(self._owners, "close", None)
        if close is not None:
            close()

    def _ensure_init(self, now: float) -> bool:
        if self._gpus is not None:
            return True
        nvml = self._calls.nvml
        if nvml is None:
            self._calls.log_once("import", logging.INFO, "nvml: the pynvml module is not installed; no GPU data")
            return False
        if self._next_init_at is not None and now < self._next_init_at:
            return False
        self._next_init_at = now + self._options.init_retry_seconds
        try:
            nvml.nvmlInit()
        except self._calls.errors as exc:
            self._calls.log_once(("init", type(exc).__name__), logging.INFO,
                                 "nvml: no GPU data (nvmlInit: %s); trying again every %g s",
                                 type(exc).__name__, self._options.init_retry_seconds)
            return False
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except self._calls.errors as exc:
            count = 0
            self._calls.log_once(("count", type(exc).__name__), logging.INFO, "nvml: nvmlDeviceGetCount: %s", exc)
        gpus = [g for g in (self._open(i, now) for i in range(count)) if g is not None]
        if not gpus:
            self._calls.log_once("nogpu", logging.INFO,
                                 "nvml: the driver answers but shows no usable GPU; no GPU data")
            self._shutdown()
            return False
        self._gpus = gpus
        if self._options.pcie_poll_seconds > 0 and any(g.pcie_method == "counter" for g in gpus):
            self._sampler = threading.Thread(target=self._sample_pcie, args=(gpus,), name="nvml-pcie", daemon=True)
            self._sampler.start()
        log.info("nvml: %d GPU(s): %s", len(gpus), ", ".join(f"{g.label}={g.uuid} {g.name}" for g in gpus))
        return True

    def _shutdown(self) -> None:
        nvml: Any = self._calls.nvml
        with contextlib.suppress(*self._calls.errors):
            nvml.nvmlShutdown()

    def _open(self, index: int, now: float) -> GpuState | None:
        nvml: Any = self._calls.nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except self._calls.errors as exc:
            self._calls.log_once(("open", index), logging.INFO, "nvml: GPU %d cannot be opened (%s); skipped",
                                 index, type(exc).__name__)
            return None
        opts = self._options
        gpu = GpuState(str(index), handle, deque(maxlen=opts.recent_intervals), nvlink=opts.nvlink,
                       processes_supported=opts.processes,
                       method={"auto": "samples", "rates": "utilization_rates", "off": "none"}[opts.utilization],
                       pcie_method={"auto": "counter", "throughput": "throughput_estimate", "off": "none"}[opts.pcie])
        try:
            gpu.uuid = text(self._calls.call(gpu, "nvmlDeviceGetUUID", handle))
            gpu.name = text(self._calls.call(gpu, "nvmlDeviceGetName", handle))
            pci = self._calls.call(gpu, "nvmlDeviceGetPciInfo", handle)
            gpu.pci_bus_id = "" if missing(pci) else text(pci.busId)
            mig = self._calls.call(gpu, "nvmlDeviceGetMigMode", handle)
            if not missing(mig):
                gpu.mig = "enabled" if mig[0] == nvml.NVML_DEVICE_MIG_ENABLE else "disabled"
        except GpuLost:
            self._mark_lost(gpu, now)
        return gpu

    def _mark_lost(self, gpu: GpuState, now: float) -> None:
        gpu.lost, gpu.recover_at = True, now + self._options.init_retry_seconds
        gpu.memory, gpu.processes, gpu.anchor, gpu.anchor_pcie = None, {}, None, None
        log.warning("nvml: GPU %s (%s) is lost (fell off the bus); the other GPUs keep reporting", gpu.label, gpu.uuid)

    def _try_recover(self, gpu: GpuState, now: float) -> None:
        if now < gpu.recover_at or not gpu.uuid:
            return
        gpu.recover_at = now + self._options.init_retry_seconds
        nvml: Any = self._calls.nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
            nvml.nvmlDeviceGetMemoryInfo(handle)
        except self._calls.errors:
            return
        gpu.handle, gpu.lost = handle, False
        log.info("nvml: GPU %s (%s) answers again", gpu.label, gpu.uuid)

    def _sample_pcie(self, gpus: list[GpuState]) -> None:
        """The PCIe counter thread: read often enough that no two wraps fall between reads."""
        while not self._stop.wait(self._options.pcie_poll_seconds):
            for gpu in gpus:
                if gpu.pcie_method == "counter" and not gpu.lost:
                    try:
                        self._reader.read_pcie(gpu, self._clock())
                    except GpuLost:
                        continue  # the next collection finds it lost and reports it
                    except Exception:  # never let the thread die silently: PCIe totals would freeze
                        if self._calls.first_time(("sampler", gpu.label)):
                            log.exception("nvml: GPU %s: reading the PCIe counters failed", gpu.label)


def build(options: NvmlOptions, context: CollectorContext) -> NvmlCollector:
    try:
        nvml: Any | None = importlib.import_module("pynvml")  # lazily: the agent runs without it
    except ImportError:
        nvml = None
    owners = PodResourcesClient(options.pod_resources_socket) if options.pod_resources_socket else None
    return NvmlCollector(nvml, options, context.clock, context.wall_clock, context.proc_root, owners)


SPEC = CollectorSpec(
    name="nvml",
    description="NVIDIA GPUs over NVML: busy/idle seconds, PCIe/NVLink bytes, memory (quiet without a GPU)",
    options=NvmlOptions,
    factory=build,
    metrics=(*METRICS, POD_INFO),
    enabled_by_default=True,
    # its busy/idle samples are what fetch stall is measured against (a stand-in may be offered instead)
    streams=StreamUse(offers={GPU_INTERVALS: lambda collector: collector}),
)

