"""Memory of the store: no history, and bounded under label churn.

Each figure comes from a fresh subprocess (this file with `--child MODE`), so RSS starts clean.

(a) 1,000 series (counters, gauges and 24 histograms with vLLM's TTFT buckets, labelled like the
    host and vLLM series kvscope exports, label values decoded anew each collection as a collector
    does) ingested for 600 collections and rendered once by the exporter (as a scraped agent holds
    them, with the render cache):
    - tracemalloc: the store's bytes after 60 and after 600 collections (equal: nothing grows with
      time), and in the same run, by the same method, what the old design kept beside it: per series
      a deque of the 600 latest (time, value) tuples, a new value float per point and one time float
      per collection (the review measured 51.8 MiB of history against 2.0 MiB for 1,000 series);
    - RSS growth of the same ingest without tracemalloc, for the store and for the store plus that
      history (the reference).
(b) 60 collections of label churn, 1,010 series per collection, scraped after each: as the review
    ran it (10 stable series and 1,000 new label values each collection, which reproduces its 60,010
    held against 1,010 exported; RSS 34 -> 120 MB there), and the milder 1,000 stable + 10 new.
    Each beside the same store told never to forget (stale_after above the number of collections):
    the old behaviour without its history, in the same run.

Verdict: PASS when (a) the store is flat from 60 to 600 collections (within 2 %) and smaller than
the old design's history alone, and (b) every collection exports and renders exactly its 1,010
series while the store holds at most those plus stale_after collections' worth of churned series.
Exit 1 on FAIL. About 15 s.

Run: .venv/bin/python bench/bench_store_memory.py
"""

from __future__ import annotations

import gc
import json
import math
import subprocess
import sys
import time
import tracemalloc
from collections import deque
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "lib"))  # testkit; kvscope itself is installed

sys.path.insert(0, str(ROOT / "bench"))
from goals import verdict as goal_verdict  # noqa: E402

from kvscope.agent.core.catalogue import AGENT_METRICS, Catalogue, MetricSpec  # noqa: E402
from kvscope.agent.core.contract import CONTRACT_METRICS  # noqa: E402
from kvscope.agent.core.readings import HistogramSample, Reading, Sample  # noqa: E402
from kvscope.agent.core.store import Store  # noqa: E402
from kvscope.collectors.gpu import nvml as gpu_nvml  # noqa: E402
from kvscope.collectors.host import disk, network, rdma  # noqa: E402
from kvscope.collectors.sharedfs import nfs  # noqa: E402
from kvscope.exporters.prometheus.exposition import TextRenderer  # noqa: E402

SERIES = 1000
COLLECTIONS = 600
EARLY = 60
CHURN_COLLECTIONS = 60
STALE_AFTER = 5  # the default the agent runs with
MIB = 1024 * 1024
# vLLM's time_to_first_token_seconds edges
TTFT_EDGES = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
              20.0, 40.0, 80.0, 160.0, 640.0, 2560.0, math.inf)
REVIEW = {"history_mib": 51.8, "current_mib": 2.0, "held": 60_010, "exported": 1_010, "rss_before_mb": 34,
          "rss_after_mb": 120}

SPECS: tuple[MetricSpec, ...] = (*AGENT_METRICS, *CONTRACT_METRICS,
                                 *(s for m in (disk, network, rdma, gpu_nvml, nfs) for s in m.METRICS))
LABEL_VALUE: dict[str, Callable[[int], str]] = {
    "device": lambda i: f"nvme{i}n1", "interface": lambda i: f"ens{i}f0np0", "port": lambda i: "1",
    "gpu": lambda i: str(i), "uuid": lambda i: f"GPU-8f1c2d3e-{i:04x}-4b5a-9c6d-7e8f9a0b1c2d",
    "name": lambda i: "NVIDIA H200", "pci_bus_id": lambda i: f"00000000:{i:02X}:00.0",
    "mount": lambda i: f"/gpfs/kv{i}", "fstype": lambda i: "gpfs", "source": lambda i: f"fs{i}:/kv",
    "engine": lambda i: "vllm", "model": lambda i: "meta-llama/Llama-3.1-8B-Instruct",
    "dp_rank": lambda i: str(i), "tier": lambda i: "G4", "src": lambda i: "G4", "dst": lambda i: "G2",
}


def labels_of(spec: MetricSpec, i: int) -> tuple[str, ...]:
    return tuple(LABEL_VALUE.get(label, lambda i, label=label: f"{label}-{i}")(i) for label in spec.labels)


def series_mix() -> list[tuple[MetricSpec, tuple[str, ...]]]:
    """1,000 series: 3 histograms x 8 DP ranks, the rest round-robin over the host and engine specs."""
    hists = [s for s in CONTRACT_METRICS if s.type == "histogram"]
    out = {(s, labels_of(s, rank)): None for s in hists for rank in range(8)}
    scalars = [s for s in SPECS if s.type != "histogram" and s not in AGENT_METRICS]
    for i in range(SERIES):
        for s in scalars:
            if len(out) == SERIES:
                return list(out)
            out[s, labels_of(s, i)] = None  # an unlabelled spec gives one series only
    raise AssertionError("too few specs")


def collection(mix: list[tuple[MetricSpec, tuple[str, ...]]], k: int) -> list[Reading]:
    """The readings of collection k: counters grow, gauges move, histograms fill."""
    out: list[Reading] = []
    for n, (spec, known) in enumerate(mix):
        # label values as a collector makes them, decoded anew from its source's text each time:
        # the store's figure then includes the labels it keeps
        labels = tuple(v.encode().decode() for v in known)
        if spec.type == "counter":
            out.append(Sample(spec.name, labels, 1e9 + 4096.0 * k * (n + 1)))
        elif spec.type == "gauge":
            out.append(Sample(spec.name, labels, float((k * 7 + n) % 1000)))
        else:
            counts = tuple(float(k * (j + 1)) for j in range(len(TTFT_EDGES)))
            out.append(HistogramSample(spec.name, labels, tuple(zip(TTFT_EDGES, counts, strict=True)),
                                       0.35 * counts[-1], counts[-1]))
    return out


def rss_bytes() -> int:
    gc.collect()
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


# -- children ------------------------------------------------------------------------------------


def child_steady(mode: str) -> dict[str, float]:
    """(a): 600 collections of the same 1,000 series; `mode` is tracemalloc, rss or rss-history."""
    mix = series_mix()
    keys = [(spec.name, labels) for spec, labels in mix]
    catalogue = Catalogue(SPECS)
    traced = mode == "tracemalloc"
    with_history = mode == "rss-history"
    gc.collect()
    if traced:
        tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0] if traced else rss_bytes()
    store = Store(catalogue, stale_after=STALE_AFTER)
    renderer = TextRenderer(store)
    history = [deque[tuple[float, float | None]](maxlen=COLLECTIONS) for _ in keys] if with_history else []
    out: dict[str, float] = {}
    for k in range(COLLECTIONS):
        now = time.time()
        store.ingest("bench", collection(mix, k), now)
        if k == 0:
            # the store as a scraped agent holds it: with the exporter's pre-rendered labels
            gc.collect()
            unrendered = tracemalloc.get_traced_memory()[0] if traced else 0
            renderer.render()
            gc.collect()
            out["render_cache"] = tracemalloc.get_traced_memory()[0] - unrendered if traced else 0
        if with_history:
            for points, (name, labels) in zip(history, keys, strict=True):
                points.append((now, store.value(name, labels)))
        if traced and k + 1 == EARLY:
            gc.collect()
            out["store_early"] = tracemalloc.get_traced_memory()[0] - before
    assert store.size() == (SERIES, SERIES)
    if not traced:
        out["rss_growth"] = rss_bytes() - before
        return out
    gc.collect()
    out["store"] = tracemalloc.get_traced_memory()[0] - before
    # the reference, by the same method: what the old design kept beside this store, a float per
    # point for the value (each collection made a new one) and one time float per collection
    values = [store.value(name, labels) or 0.0 for name, labels in keys]
    mark = tracemalloc.get_traced_memory()[0]
    old = [deque[tuple[float, float]](maxlen=COLLECTIONS) for _ in keys]
    for k in range(COLLECTIONS):
        now = float(k)
        for points, value in zip(old, values, strict=True):
            points.append((now, value + k))
    gc.collect()
    out["history"] = tracemalloc.get_traced_memory()[0] - mark
    return out


def child_churn(mode: str) -> dict[str, float]:
    """(b): 60 collections of 1,010 series, `churning` of them under new label values each time."""
    kind, forget = mode.split("-")
    churning = 1000 if kind == "review" else 10
    stale_after = STALE_AFTER if forget == "forgets" else CHURN_COLLECTIONS + 1
    spec = next(s for s in CONTRACT_METRICS if s.name == "kvscope_kv_hit_tokens_total")
    catalogue = Catalogue(SPECS)
    before = rss_bytes()
    store = Store(catalogue, stale_after=stale_after)
    renderer = TextRenderer(store)
    worst_held, exported_each, rendered_each = 0, set(), set()
    for k in range(CHURN_COLLECTIONS):
        readings = [Sample(spec.name, ("vllm", "m", str(n), "G4"), 1e6 + k) for n in range(1010 - churning)]
        readings += [Sample(spec.name, ("vllm", f"req-{k}-{n}", "0", "G4"), float(n)) for n in range(churning)]
        store.ingest("churn", readings, float(k))
        held, exported = store.size()
        worst_held = max(worst_held, held)
        exported_each.add(exported)
        page = renderer.render()  # scraped every collection, as a sidecar is
        rendered_each.add(page.count(b"\n") - page.count(b"\n#") - page.startswith(b"#"))
    held, exported = store.size()
    return {"churning": churning, "stale_after": stale_after, "held": held, "exported": exported,
            "worst_held": worst_held, "exported_always": exported_each == rendered_each == {1010},
            "rss_before": before, "rss_after": rss_bytes()}


def run_child(mode: str) -> dict[str, float]:
    done = subprocess.run([sys.executable, __file__, "--child", mode], capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return result


# -- the report ----------------------------------------------------------------------------------


def main() -> int:
    start = time.perf_counter()
    traced = run_child("tracemalloc")
    rss = run_child("rss")
    rss_history = run_child("rss-history")
    per = SERIES
    print(f"(a) {SERIES} series ({sum(s.type == 'histogram' for s, _ in series_mix())} histograms of "
          f"{len(TTFT_EDGES)} buckets), {COLLECTIONS} collections, stale_after={STALE_AFTER}")
    print(f"    store, tracemalloc, after {EARLY:3d} collections: {traced['store_early'] / MIB:7.2f} MiB")
    print(f"    store, tracemalloc, after {COLLECTIONS} collections: {traced['store'] / MIB:7.2f} MiB "
          f"({traced['store'] / per:,.0f} B per series)   review: {REVIEW['current_mib']} MiB current values")
    print(f"      of which the exporter's render cache:  {traced['render_cache'] / MIB:7.2f} MiB "
          f"({traced['render_cache'] / per:,.0f} B per series)")
    print(f"    old design's history, same run:         {traced['history'] / MIB:7.2f} MiB "
          f"({traced['history'] / per:,.0f} B per series)   review: {REVIEW['history_mib']} MiB")
    print(f"    old design in all (store + history):    {(traced['store'] + traced['history']) / MIB:7.2f} MiB "
          f"-> now {traced['store'] / (traced['store'] + traced['history']):.1%} of it")
    print(f"    RSS growth, store:                      {rss['rss_growth'] / MIB:7.2f} MiB")
    print(f"    RSS growth, store + old history:        {rss_history['rss_growth'] / MIB:7.2f} MiB   (reference)")
    grows = abs(traced["store"] - traced["store_early"]) > 0.02 * traced["store_early"]
    a_ok = not grows and traced["store"] < traced["history"]

    print(f"(b) {CHURN_COLLECTIONS} collections of 1,010 series with label churn        "
          f"review: {REVIEW['held']:,} held, {REVIEW['exported']:,} exported, "
          f"RSS {REVIEW['rss_before_mb']} -> {REVIEW['rss_after_mb']} MB")
    b_ok = True
    for kind in ("review", "mild"):
        for forget in ("forgets", "never"):
            r = run_child(f"{kind}-{forget}")
            bound = 1010 + STALE_AFTER * r["churning"]
            label = (f"{1010 - r['churning']:4.0f} stable + {r['churning']:4.0f} new, "
                     + (f"stale_after={STALE_AFTER}" if forget == "forgets" else "never forgets (reference)"))
            print(f"    {label:58s} held {r['held']:6,.0f} (most {r['worst_held']:6,.0f}"
                  + (f", bound {bound:,}" if forget == "forgets" else "") + f"), exported {r['exported']:5,.0f}, "
                  f"RSS {r['rss_before'] / 1e6:5.1f} -> {r['rss_after'] / 1e6:5.1f} MB")
            if forget == "forgets":
                b_ok = b_ok and bool(r["exported_always"]) and r["worst_held"] <= bound
    elapsed = time.perf_counter() - start
    history = (traced["store"] + traced["history"]) / per
    goal_verdict("store: flat in time, churn bounded", f"{traced['store'] / per:,.0f} B/series, held at most "
                 "exported + stale_after x churn", f"history design {history:,.0f} B/series",
                 f"x{traced['store'] / per / history:.2f}", a_ok and b_ok)
    if a_ok and b_ok:
        print(f"VERDICT: PASS store {traced['store'] / per:,.0f} B/series, flat from {EARLY} to {COLLECTIONS} "
              f"collections, vs {(traced['store'] + traced['history']) / per:,.0f} B/series with history; "
              f"churn held within exported + stale_after x churn ({elapsed:.0f} s)")
        return 0
    print(f"VERDICT: FAIL (a) {'ok' if a_ok else 'store grows or costs more than history'}, "
          f"(b) {'ok' if b_ok else 'churn not bounded or exposition wrong'}")
    return 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        mode = sys.argv[2]
        result = child_steady(mode) if mode in ("tracemalloc", "rss", "rss-history") else child_churn(mode)
        print(json.dumps(result))
        sys.exit(0)
    sys.exit(main())
