"""Cross-layer signals: fetch stall, noisy neighbour, saturation (correlation.md §5).

Pure functions over intervals and per-window observations; the engine feeds them and keeps the state.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvscope.agent.analyses.correlation.attribution import FetchInside
from kvscope.agent.core.records import Attribution, Interval, RequestRecord

# -- fetch stall -----------------------------------------------------------------------------------


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, merged, non-empty intervals."""
    out: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def subtract(base: Sequence[Interval], cut: Sequence[Interval]) -> list[Interval]:
    """base minus cut; both must be outputs of union()."""
    out: list[Interval] = []
    j = 0
    for start, end in base:
        while j < len(cut) and cut[j][1] <= start:
            j += 1
        k, cursor = j, start
        while k < len(cut) and cut[k][0] < end:
            if cut[k][0] > cursor:
                out.append((cursor, cut[k][0]))
            cursor = max(cursor, cut[k][1])
            k += 1
        if cursor < end:
            out.append((cursor, end))
    return out


def clip(intervals: Sequence[Interval], lo: float, hi: float) -> list[Interval]:
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


def stall_seconds(gpu_samples: Iterable[tuple[float, float, float]], fetch_only: Sequence[Interval]) -> float:
    """Σ idle fraction × overlap of each GPU sample (start, end, busy_fraction) with fetch-only time.

    NVML samples are ~1/6 s long; a sample half busy that overlaps a fetch-only stretch counts half of
    the overlap as stalled — the resolution of the GPU side, whatever the record side's.
    """
    total = 0.0
    for start, end, busy in gpu_samples:
        idle = 1.0 - min(1.0, max(0.0, busy))
        if idle <= 0 or end <= start:
            continue
        for s, e in fetch_only:
            if s >= end:
                break
            if e > start:
                total += idle * (min(e, end) - max(s, start))
    return total


def idle_seconds(gpu_samples: Iterable[Sequence[tuple[float, float, float]]], interval: Interval) -> float | None:
    """Seconds of `interval` during which every GPU was idle, as far as the samples can tell; None: no GPU.

    A sample wholly inside the interval counts its idle fraction × its length (it knows how much of it
    was idle, and all of it is inside); one reaching outside counts its overlap only when it was idle
    throughout (busy 0), since its busy time may lie inside. So the figure is exact for exact intervals
    (the reference engine's device slot) and never over-counts at NVML's ~1/6 s resolution. Several GPUs
    (tensor parallel): the least idle one bounds it, as one engine computes on all of them.
    """
    lo, hi = interval
    per_gpu: list[float] = []
    for samples in gpu_samples:
        idle = 0.0
        for start, end, busy in samples:
            if end <= lo or start >= hi or end <= start:
                continue
            free = 1.0 - min(1.0, max(0.0, busy))
            if lo <= start and end <= hi:
                idle += free * (end - start)
            elif free >= 1.0:
                idle += min(end, hi) - max(start, lo)
        per_gpu.append(idle)
    return min(per_gpu) if per_gpu else None


def phase_intervals(record: RequestRecord, attribution: Attribution,
                    fetch_inside: FetchInside) -> tuple[list[Interval], list[Interval]]:
    """(fetch intervals, compute intervals) of one request, wall-clock seconds.

    Explicit intervals from the source win. Otherwise they are placed from the phase durations: the
    first token at arrival + TTFT, compute (prefill) right before it; an async load ends when the request
    is scheduled (the start of the prefill phase), a sync load starts the step, so it opens the prefill
    phase (and, with no phase measured, sits right before the compute). The placement has the timestamps'
    resolution (ns for spans) but assumes no overlap of load and compute; whatever else the phase holds
    (offload, GPU idle moved to other) lies between them.
    """
    if record.fetch_intervals or record.compute_intervals:
        return list(record.fetch_intervals), list(record.compute_intervals)
    first_token = record.arrival + record.ttft
    compute = attribution.seconds("prefill")
    fetch = attribution.seconds("fetch")
    compute_start = first_token - compute
    if record.prefill is not None and fetch_inside == "queue":
        compute_start = first_token - record.prefill
        fetch_start = compute_start - fetch
    elif record.prefill is not None:
        fetch_start = first_token - record.prefill
    else:
        fetch_start = compute_start - fetch
    fetches = [(fetch_start, fetch_start + fetch)] if fetch > 0 else []
    computes = [(compute_start, first_token)] if compute > 0 else []
    return fetches, computes


# -- noisy neighbour and saturation ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PathWindow:
    """One window on one tier's path (its NIC/RDMA port, disk or FS mount)."""

    path_bps: float  # total traffic on the path's series, bytes/s
    kv_bps: float  # KV transfer bytes to/from the tier, bytes/s
    fetch_bandwidth: float | None  # the tier's achieved fetch bandwidth, None when it moved nothing
    fetch_share: float | None  # fetch / TTFT of the window's aggregate attribution

    @property
    def kv_share(self) -> float | None:
        return min(1.0, self.kv_bps / self.path_bps) if self.path_bps > 0 else None


@dataclass(frozen=True, slots=True)
class Thresholds:
    near_peak: float = 0.8  # path traffic ≥ this × peak counts as "near its peak"
    bandwidth_drop: float = 0.2  # fetch bandwidth ≥ this fraction below its baseline
    kv_share_fall: float = 0.25  # KV share ≥ this fraction below its baseline
    saturated: float = 0.9  # path at ≥ this × peak
    fetch_share_growth: float = 0.2  # fetch share of TTFT ≥ this fraction above its baseline
    min_baseline: int = 5  # windows of history before any signal is raised


@dataclass(frozen=True, slots=True)
class PathVerdict:
    utilisation: float | None  # path traffic / peak
    bandwidth_drop: float | None  # 1 − fetch bandwidth / baseline (≥ 0)
    non_kv_share: float | None  # 1 − KV share of the path's traffic
    noisy_neighbour: bool
    saturated: bool


def _median(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def assess_path(window: PathWindow, baseline: Sequence[PathWindow], peak: float,
                th: Thresholds = Thresholds()) -> PathVerdict:
    """Compare one window with the tier's recent quiet windows and the path's peak.

    Noisy neighbour: the path is near its peak, the tier's fetch bandwidth fell below its baseline and
    KV's share of the path's traffic fell — something else is using the storage path. Saturation: the
    path is at its peak while the fetch share of TTFT grows.
    """
    utilisation = window.path_bps / peak if peak > 0 else None
    share = window.kv_share
    non_kv = None if share is None else 1.0 - share
    base_bw = _median(w.fetch_bandwidth for w in baseline)
    drop = None
    if base_bw and window.fetch_bandwidth is not None:
        drop = max(0.0, 1.0 - window.fetch_bandwidth / base_bw)
    if len(baseline) < th.min_baseline or utilisation is None:
        return PathVerdict(utilisation, drop, non_kv, False, False)
    base_share = _median(w.kv_share for w in baseline)
    share_fell = share is not None and base_share is not None and share <= base_share * (1 - th.kv_share_fall)
    noisy = utilisation >= th.near_peak and drop is not None and drop >= th.bandwidth_drop and share_fell
    base_fetch_share = _median(w.fetch_share for w in baseline)
    grows = (window.fetch_share is not None and base_fetch_share is not None
             and window.fetch_share >= base_fetch_share * (1 + th.fetch_share_growth)
             and window.fetch_share > base_fetch_share)
    return PathVerdict(utilisation, drop, non_kv, noisy, utilisation >= th.saturated and grows)
