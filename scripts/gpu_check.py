"""Check the NVML collector against a GPU load of known duty cycle and known PCIe bytes.

    PYTHONPATH=. python3 scripts/gpu_check.py --out DIR

On an NVIDIA machine (needs only torch, nvidia-ml-py; no other kvscope dependency) it runs the
collector twice side by side — as deployed (utilization samples, PCIe byte counters, polled every
1 s) and forced onto the fallbacks (utilization rates, PCIe throughput, polled every 0.2 s) — while
the main thread alternates ON phases (back-to-back matmuls, with host->device and device->host copies
of known size on a second stream) with OFF phases (sleep). It prints measured busy/idle seconds
against the ON/OFF time, PCIe RX/TX bytes against the bytes copied, and what it learned about the
driver (sample period, timestamp base, counter width, pid namespace), and exits 1 on a gross
disagreement (2 when it cannot run at all). Under DIR it writes the raw NVML answers it saw in the
fixture format of tests/fixtures/nvml (nvml_auto.json, nvml_fallback.json) and summary.json.
Total runtime stays under 60 s.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "lib"))  # testkit; kvscope itself is installed

from kvscope.agent.core.catalogue import AGENT_METRICS, Catalogue
from kvscope.agent.core.readings import Reading
from kvscope.agent.core.store import Store
from kvscope.collectors.gpu.nvml import NvmlCollector, NvmlOptions
from kvscope.collectors.gpu.samples import METRICS
from testkit.nvml_replay import NvmlRecorder

GIB = 1 << 30
TOTALS = ("kvscope_gpu_busy_seconds_total", "kvscope_gpu_idle_seconds_total", "kvscope_gpu_unsampled_seconds_total",
          "kvscope_gpu_pcie_receive_bytes_total", "kvscope_gpu_pcie_transmit_bytes_total",
          "kvscope_gpu_nvlink_receive_bytes_total", "kvscope_gpu_nvlink_transmit_bytes_total")


class Poller:
    """One collector on its own thread, recording every NVML answer and feeding a real Store."""

    def __init__(self, nvml: Any, options: NvmlOptions, interval: float, origin: str) -> None:
        self.recorder = NvmlRecorder(nvml, origin)
        self.interval = interval
        self._now = {"clock": 0.0, "wall": 0.0}
        self.collector = NvmlCollector(self.recorder, options, self._clock, self._wall)
        self.store = Store(Catalogue([*AGENT_METRICS, *METRICS]))
        self.last: list[Reading] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _clock(self) -> float:
        self._now["clock"] = time.monotonic()
        return self._now["clock"]

    def _wall(self) -> float:
        self._now["wall"] = time.time()
        return self._now["wall"]

    def poll(self) -> None:
        try:
            readings = self.collector.collect()
        except Exception as exc:  # reported in the summary; the check goes on
            self.errors.append(repr(exc))
            return
        self.recorder.mark_poll(self._now["clock"], self._now["wall"])
        self.store.ingest("nvml", readings, self._now["wall"])
        self.last = readings

    def totals(self, gpu: str) -> dict[str, float | None]:
        return {name: self.store.value(name, (gpu,)) for name in TOTALS}

    def start(self) -> None:
        self.poll()
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.poll()
        self.collector.close()  # stops its PCIe thread: no reads after the final readings

    def recording(self) -> dict[str, Any]:
        data = self.recorder.recording()
        data["final_readings"] = [[r.name, list(r.labels), getattr(r, "value", None), getattr(r, "wrap_modulus", None)]
                                  for r in self.last]
        return data


@dataclass
class Load:
    on: list[tuple[float, float]] = field(default_factory=list)  # wall-clock ON windows
    off: list[tuple[float, float]] = field(default_factory=list)
    h2d_bytes: int = 0
    d2h_bytes: int = 0


def run_load(torch: Any, device: Any, seconds: float, on_s: float, off_s: float, chunk_mib: int,
             deadline: float) -> Load:
    """Alternate ON (matmuls on the default stream, copies on a side stream) and OFF (sleep) phases."""
    n = 4096
    a = torch.randn(n, n, device=device, dtype=torch.float16)
    b = torch.randn(n, n, device=device, dtype=torch.float16)
    chunk = chunk_mib << 20
    host_in = torch.empty(chunk, dtype=torch.uint8, pin_memory=True)
    host_out = torch.empty(chunk, dtype=torch.uint8, pin_memory=True)
    dev_in = torch.empty(chunk, dtype=torch.uint8, device=device)
    dev_out = torch.zeros(chunk, dtype=torch.uint8, device=device)
    copies = torch.cuda.Stream(device=device)
    torch.cuda.synchronize(device)
    load = Load()
    end_all = min(time.time() + seconds, deadline)
    while time.time() + on_s <= end_all:
        start = time.time()
        while time.time() - start < on_s:
            for _ in range(32):  # ~5 ms of kernels on an H100/H200: longer than the copies beside them
                torch.mm(a, b)
            with torch.cuda.stream(copies):
                dev_in.copy_(host_in, non_blocking=True)
                host_out.copy_(dev_out, non_blocking=True)
            load.h2d_bytes += chunk
            load.d2h_bytes += chunk
            torch.cuda.synchronize(device)
        stop = time.time()
        load.on.append((start, stop))
        time.sleep(off_s)
        load.off.append((stop, time.time()))
    return load


def busy_inside(intervals: list[tuple[float, float, float]], windows: list[tuple[float, float]],
                shift: float = 0.0) -> float:
    """Busy seconds of the sampled intervals (shifted by `shift`) that fall inside the windows."""
    total = 0.0
    for start, end, fraction in intervals:
        for w0, w1 in windows:
            overlap = min(end + shift, w1) - max(start + shift, w0)
            if overlap > 0:
                total += overlap * fraction
    return total


def delta(before: dict[str, float | None], after: dict[str, float | None], name: str) -> float | None:
    a, b = after.get(name), before.get(name)
    return None if a is None or b is None else a - b


def analyse(poller: Poller, gpu: str, load: Load, before: dict[str, float | None], elapsed: float) -> dict[str, Any]:
    """The figures of one collector for the GPU under test."""
    after = poller.totals(gpu)
    info = next((r.labels for r in poller.last if r.name == "kvscope_gpu_info" and r.labels[0] == gpu), ())
    intervals = [i for i in poller.collector.recent_samples(gpu) if i[1] > (load.on[0][0] if load.on else 0) - 2]
    on_total = sum(b - a for a, b in load.on)
    off_total = sum(b - a for a, b in load.off)
    shifts = [round(s * 0.05, 2) for s in range(-20, 21)]
    best_shift = max(shifts, key=lambda s: busy_inside(intervals, load.on, s) - busy_inside(intervals, load.off, s))
    periods = [b - a for a, b, _ in intervals]
    return {
        "gpu": gpu, "info": list(info), "method": info[5] if info else "", "pcie_method": info[6] if info else "",
        "elapsed_s": elapsed, "on_s": on_total, "off_s": off_total,
        "busy_s": delta(before, after, TOTALS[0]), "idle_s": delta(before, after, TOTALS[1]),
        "unsampled_s": delta(before, after, TOTALS[2]),
        "busy_in_on_s": busy_inside(intervals, load.on), "busy_in_off_s": busy_inside(intervals, load.off),
        "best_shift_s": best_shift, "sample_period_median_s": statistics.median(periods) if periods else None,
        "rx_bytes": delta(before, after, TOTALS[3]), "tx_bytes": delta(before, after, TOTALS[4]),
        "nvlink_rx_bytes": delta(before, after, TOTALS[5]), "nvlink_tx_bytes": delta(before, after, TOTALS[6]),
        "h2d_bytes": load.h2d_bytes, "d2h_bytes": load.d2h_bytes, "collector_errors": poller.errors,
    }


def judge(fig: dict[str, Any]) -> list[str]:
    """Gross disagreements for one collector's figures (empty: agrees)."""
    problems = []
    # exact counters may add protocol overhead; 20 ms throughput snapshots integrated are only an estimate
    pcie_bounds = (0.9, 1.5) if fig["pcie_method"] == "counter" else (0.3, 3.0)
    if fig["method"] not in ("samples", "utilization_rates") or fig["busy_s"] is None:
        return [f"no busy/idle data (method {fig['method']!r})"]
    busy, on = fig["busy_s"], fig["on_s"]
    if abs(busy - on) > max(0.15 * on, 1.0):
        problems.append(f"busy {busy:.2f} s vs {on:.2f} s of ON phases")
    covered = busy + (fig["idle_s"] or 0.0) + (fig["unsampled_s"] or 0.0)
    if not 0.85 * fig["elapsed_s"] <= covered <= 1.15 * fig["elapsed_s"]:
        problems.append(f"busy+idle+unsampled {covered:.2f} s vs {fig['elapsed_s']:.2f} s elapsed")
    if (fig["unsampled_s"] or 0.0) > 0.1 * fig["elapsed_s"]:
        problems.append(f"{fig['unsampled_s']:.2f} s unsampled: the driver left gaps in its samples")
    lo, hi = pcie_bounds
    for key, copied in (("rx_bytes", "h2d_bytes"), ("tx_bytes", "d2h_bytes")):
        measured = fig[key]
        if measured is None:
            problems.append(f"no PCIe {key[:2].upper()} data (pcie_method {fig['pcie_method']!r})")
        elif fig[copied] and not lo <= measured / fig[copied] <= hi:
            problems.append(f"PCIe {key[:2].upper()} {measured / GIB:.2f} GiB vs {fig[copied] / GIB:.2f} GiB copied")
    return problems


def report(title: str, fig: dict[str, Any], problems: list[str]) -> str:
    def ratio(a: float | None, b: float) -> str:
        return "n/a" if a is None or not b else f"{a / b:.3f}"

    def gib(x: float | None) -> str:
        return "n/a" if x is None else f"{x / GIB:.3f} GiB"

    def sec(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.3f} s"

    lines = [f"== {title}: GPU {fig['gpu']} {fig['info']}",
             f"  busy {sec(fig['busy_s'])} vs ON phases {sec(fig['on_s'])}, ratio {ratio(fig['busy_s'], fig['on_s'])}",
             f"  idle {sec(fig['idle_s'])}, unsampled {sec(fig['unsampled_s'])}, elapsed {sec(fig['elapsed_s'])}",
             f"  timing busy inside ON {fig['busy_in_on_s']:.3f} s of {fig['on_s']:.3f}; inside OFF "
             f"{fig['busy_in_off_s']:.3f} s of {fig['off_s']:.3f}; best alignment shift {fig['best_shift_s']:+.2f} s; "
             f"median sample period {fig['sample_period_median_s']}",
             f"  PCIe RX {gib(fig['rx_bytes'])} vs H2D copied {gib(fig['h2d_bytes'])} ratio "
             f"{ratio(fig['rx_bytes'], fig['h2d_bytes'])}; TX {gib(fig['tx_bytes'])} vs D2H copied "
             f"{gib(fig['d2h_bytes'])} ratio {ratio(fig['tx_bytes'], fig['d2h_bytes'])}",
             f"  NVLink RX {gib(fig['nvlink_rx_bytes'])} TX {gib(fig['nvlink_tx_bytes'])}"]
    if fig["collector_errors"]:
        lines.append(f"  collector raised: {fig['collector_errors'][:3]}")
    lines.append("  " + ("; ".join(problems) if problems else "agrees"))
    return "\n".join(lines)


def driver_facts(recording: dict[str, Any], gpu: str) -> dict[str, Any]:
    """What the raw answers say: timestamp base and lag, counter width, process pids."""
    facts: dict[str, Any] = {"max_pcie_counter": None, "sample_ts_minus_wall_s": None, "pids": [],
                             "pcie_value_types": [], "pcie_reads": 0}
    polls = recording["polls"]
    lags = []
    for call in recording["calls"]:
        if call["fn"] == "nvmlDeviceGetSamples" and call["args"][0] == {"handle": int(gpu)} and "result" in call:
            ts = [s[0] for s in call["result"]["samples"]]
            if ts and call.get("poll", len(polls)) < len(polls):
                lags.append(max(ts) / 1e6 - polls[call["poll"]]["wall"])
        if lags:
            facts["sample_ts_minus_wall_s"] = {"median": statistics.median(lags), "min": min(lags), "max": max(lags)}
        if call["fn"] == "nvmlDeviceGetFieldValues" and "result" in call:
            for entry in call["result"]:
                if entry["fieldId"] in (197, 198) and entry["value"] is not None:
                    facts["max_pcie_counter"] = max(facts["max_pcie_counter"] or 0, entry["value"])
                    facts["pcie_value_types"] = sorted({*facts["pcie_value_types"], entry["valueType"]})
                    facts["pcie_reads"] += entry["fieldId"] == 197
        if call["fn"] == "nvmlDeviceGetComputeRunningProcesses" and "result" in call:
            facts["pids"] = sorted({p["pid"] for p in call["result"]} | set(facts["pids"]))
    return facts


def facts_line(facts: dict[str, Any], own_pid: int) -> str:
    largest = facts["max_pcie_counter"]
    listed = "listed" if own_pid in facts["pids"] else "NOT listed (pid namespace?)"
    return (f"  driver: newest sample timestamp - wall clock at poll {facts['sample_ts_minus_wall_s']} s; "
            f"PCIe counters: {facts['pcie_reads']} reads, value types {facts['pcie_value_types']}, largest {largest} "
            f"(> 2^32: {(largest or 0) > 2**32}); "
            f"compute pids {facts['pids']}, this process {own_pid} {listed}")


def nvml_index_of(torch: Any, nvml: Any, device_index: int) -> str:
    """The NVML index of torch's cuda:N (CUDA order and CUDA_VISIBLE_DEVICES differ from NVML's), by UUID or PCI id."""
    props = torch.cuda.get_device_properties(device_index)
    uuid = str(getattr(props, "uuid", "")).lower().removeprefix("gpu-")
    bus = (getattr(props, "pci_domain_id", None), getattr(props, "pci_bus_id", None),
           getattr(props, "pci_device_id", None))
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        nvml_uuid = str(nvml.nvmlDeviceGetUUID(handle)).lower().removeprefix("gpu-")
        pci = nvml.nvmlDeviceGetPciInfo(handle)
        if (uuid and uuid == nvml_uuid) or (None not in bus and (pci.domain, pci.bus, pci.device) == bus):
            return str(i)
    print(f"warning: cuda:{device_index} not matched to an NVML GPU by UUID or PCI id; assuming NVML index 0")
    return "0"


def package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu-check-out", help="folder for the recordings and summary.json")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the ON/OFF load")
    parser.add_argument("--on", type=float, default=1.0, help="seconds of each ON phase")
    parser.add_argument("--off", type=float, default=1.0, help="seconds of each OFF phase")
    parser.add_argument("--chunk-mib", type=int, default=64, help="MiB copied each way per ON iteration")
    parser.add_argument("--device", type=int, default=0, help="torch CUDA device index")
    args = parser.parse_args(argv)
    began = time.time()
    deadline = began + 52.0  # leaves room for setup, settle and writing inside 60 s
    try:
        import pynvml
        import torch
    except ImportError as exc:
        print(f"cannot run: {exc}")
        return 2
    if not torch.cuda.is_available():
        print("cannot run: torch sees no CUDA device")
        return 2
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        print(f"cannot run: nvmlInit: {exc}")
        return 2
    device = torch.device("cuda", args.device)
    gpu = nvml_index_of(torch, pynvml, args.device)
    origin = (f"scripts/gpu_check.py {time.strftime('%Y-%m-%d')}: {torch.cuda.get_device_name(device)}, driver "
              f"{pynvml.nvmlSystemGetDriverVersion()}, nvidia-ml-py {package_version('nvidia-ml-py')}, torch "
              f"{torch.__version__}; load {args.on:g} s on / {args.off:g} s off on NVML GPU {gpu}")
    handle = pynvml.nvmlDeviceGetHandleByIndex(int(gpu))
    reads = 200
    t = time.perf_counter()
    for _ in range(reads):
        pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
                                                 pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES])
    field_read_us = (time.perf_counter() - t) / reads * 1e6
    print(f"one PCIe counter read (nvmlDeviceGetFieldValues, 2 fields): {field_read_us:.1f} µs")
    torch.mm(torch.ones(64, 64, device=device), torch.ones(64, 64, device=device))  # CUDA context, kernels loaded
    torch.cuda.synchronize(device)
    time.sleep(1.0)
    auto = Poller(pynvml, NvmlOptions(), 1.0, origin + "; collector as deployed, polled every 1 s")
    fallback = Poller(pynvml, NvmlOptions(utilization="rates", pcie="throughput"), 0.2,
                      origin + "; collector forced onto the fallbacks, polled every 0.2 s")
    pollers = {"as deployed (samples, counters, 1 s)": auto, "fallbacks (rates, throughput, 0.2 s)": fallback}
    for p in pollers.values():
        p.start()
    before = {name: p.totals(gpu) for name, p in pollers.items()}
    t0 = time.time()
    time.sleep(1.0)
    load = run_load(torch, device, min(args.seconds, deadline - time.time() - 4.0), args.on, args.off,
                    args.chunk_mib, deadline - 4.0)
    time.sleep(max(0.0, min(3.0, deadline - time.time())))  # idle tail: the last samples arrive
    for p in pollers.values():
        p.stop()
    elapsed = time.time() - t0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"origin": origin, "own_pid": os.getpid(), "field_read_us": field_read_us,
                               "collectors": {}}
    failed = False
    for (title, p), name in zip(pollers.items(), ("nvml_auto", "nvml_fallback"), strict=True):
        fig = analyse(p, gpu, load, before[title], elapsed)
        problems = judge(fig)
        recording = p.recording()
        (out / f"{name}.json").write_text(json.dumps(recording) + "\n")
        facts = driver_facts(recording, gpu)
        print(report(title, fig, problems))
        print(facts_line(facts, os.getpid()))
        summary["collectors"][name] = {"figures": fig, "problems": problems, "driver": facts}
        failed = failed or (bool(problems) and name == "nvml_auto")
    summary["verdict"] = "FAIL" if failed else "PASS"
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    print(f"{summary['verdict']} ({time.time() - began:.1f} s); recordings in {out}/ "
          "(only the as-deployed collector is judged; the fallback figures are informational)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
