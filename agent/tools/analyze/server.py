"""Server-side figures of `kvscope analyze`: the engine's /metrics as AIPerf scraped it, normalised by the same
vLLM tables as the `vllm` collector (collectors/engines/vllm_map.py).

Each figure is the growth over the run — from the last scrape before the first request (AIPerf's baseline) to
the last one — counting a decrease as a restart from zero; a series that appears during the run (the engine
creates its histogram children on first use) grew from zero. The TTFT split is the correlation analysis's own
window attribution (agent/analyses/correlation/attribution.py) over those growths, with the analysis's defaults for
where an engine's fetch and offload sit (the reference engine: both inside prefill time; vLLM: fetch in the
queue, stores in no phase).
"""

from __future__ import annotations

import itertools
from collections import defaultdict

from kvscope.agent.analyses.correlation.attribution import WindowTotals, attribute_window
from kvscope.agent.analyses.correlation.options import CorrelationOptions
from kvscope.agent.core import contract as c
from kvscope.agent.core.readings import HistogramSample, Sample
from kvscope.agent.tools.analyze.inputs import Scrapes
from kvscope.agent.tools.analyze.report import Report, Split
from kvscope.collectors.engines.vllm_map import DEFAULT_SOURCE_TIERS, DEFAULT_TIERING_TIERS, Normaliser

ORDER = ("G1", "G2", "G3", "G4")


def increase(values: list[float]) -> float:
    """Growth of a cumulative series over consecutive scrapes; a decrease is a restart from zero."""
    total = 0.0
    for prev, cur in itertools.pairwise(values):
        total += cur - prev if cur >= prev else cur
    return total


def _onboard(src: str, dst: str) -> bool:
    return src in ORDER and dst in ORDER and ORDER.index(dst) < ORDER.index(src)


def _normaliser(engine: str) -> Normaliser:
    sources = DEFAULT_SOURCE_TIERS | {"external_unspecified": "G4"} if engine == "reference" else DEFAULT_SOURCE_TIERS
    return Normaliser(engine, sources, DEFAULT_TIERING_TIERS)


def server_figures(report: Report, scrapes: Scrapes, start_ns: int, engine: str) -> None:
    """Hits, tokens, links, the link timeline and the aggregate split into `report`."""
    normaliser = _normaliser(engine)
    before = [s for s in scrapes.scrapes if s.timestamp_ns <= start_ns]
    run = before[-1:] + [s for s in scrapes.scrapes if s.timestamp_ns > start_ns]
    if len(run) < 2:
        report.notes.append("server metrics: fewer than two scrapes over the run; no server-side figures")
        return
    series: dict[tuple[str, tuple[str, ...]], list[float]] = defaultdict(list)
    hist: dict[tuple[str, tuple[str, ...]], list[tuple[float, float]]] = defaultdict(list)
    times: list[float] = []
    per_scrape_links: list[dict[str, float]] = []
    dropped = 0
    for i, scrape in enumerate(run):
        normal = normaliser.normalise(scrape.scan)
        dropped += normal.dropped
        times.append((scrape.timestamp_ns - start_ns) / 1e9)
        links: dict[str, float] = {}
        for reading in normal.readings:
            # a series that appears after the baseline scrape was created during the run: it grew from 0
            if isinstance(reading, HistogramSample):
                points = hist[(reading.name, reading.labels)]
                if not points and i > 0:
                    points.append((0.0, 0.0))
                points.append((reading.sum, reading.count))
            elif isinstance(reading, Sample):
                values = series[(reading.name, reading.labels)]
                if not values and i > 0:
                    values.append(0.0)
                values.append(reading.value)
                if reading.name == c.KV_TRANSFER_BYTES:
                    links[f"{reading.labels[3]}->{reading.labels[4]}"] = reading.value
        per_scrape_links.append(links)
    if dropped:
        report.notes.append(f"server metrics: {dropped} samples the contract cannot take were skipped")
    grown = {key: increase(values) for key, values in series.items()}
    _tokens_and_links(report, grown)
    if len(run) > 2:  # a time series (the JSONL); the JSON summary has only the run's two ends
        first = per_scrape_links[0]
        report.timeline = [(t, {k: v - first.get(k, 0.0) for k, v in links.items()})
                           for t, links in zip(times, per_scrape_links, strict=True)]
    _split(report, grown, hist, engine)


def _tokens_and_links(report: Report, grown: dict[tuple[str, tuple[str, ...]], float]) -> None:
    for (name, labels), value in grown.items():
        if name == c.KV_HIT_TOKENS:
            report.hits[labels[3]] = report.hits.get(labels[3], 0.0) + value
        elif name == c.KV_LOOKUP_TOKENS:
            report.lookup_tokens = (report.lookup_tokens or 0.0) + value
        elif name == c.KV_COMPUTED_TOKENS:
            report.computed_tokens = (report.computed_tokens or 0.0) + value
        elif name in (c.KV_TRANSFER_BYTES, c.KV_TRANSFER_SECONDS):
            link = report.links.setdefault(f"{labels[3]}->{labels[4]}", {"bytes": 0.0, "seconds": 0.0})
            link["bytes" if name == c.KV_TRANSFER_BYTES else "seconds"] += value
    for link in report.links.values():
        link["bytes_per_second"] = link["bytes"] / link["seconds"] if link["seconds"] > 0 else 0.0


def _split(report: Report, grown: dict[tuple[str, tuple[str, ...]], float],
           hist: dict[tuple[str, tuple[str, ...]], list[tuple[float, float]]], engine: str) -> None:
    sums = {name: [0.0, 0.0] for name in (c.TTFT_SECONDS, c.QUEUE_SECONDS, c.PREFILL_SECONDS)}
    for (name, _labels), points in hist.items():
        if name in sums:
            sums[name][0] += increase([p[0] for p in points])
            sums[name][1] += increase([p[1] for p in points])
    if sums[c.TTFT_SECONDS][1] <= 0:
        return
    timed = [(labels[3], labels[4], v) for (name, labels), v in grown.items() if name == c.KV_TRANSFER_SECONDS]
    fetch = sum(v for src, dst, v in timed if dst in ("G1", "G2") and _onboard(src, dst))
    offload = sum(v for src, dst, v in timed if src == "G1" and not _onboard(src, dst))
    options = CorrelationOptions()
    fetch_inside = options.fetch_inside_by_engine.get(engine, options.fetch_inside)
    offload_inside = options.offload_inside_by_engine.get(engine, options.offload_inside)
    totals = WindowTotals(sums[c.TTFT_SECONDS][0], sums[c.QUEUE_SECONDS][0] if sums[c.QUEUE_SECONDS][1] else None,
                          sums[c.PREFILL_SECONDS][0] if sums[c.PREFILL_SECONDS][1] else None,
                          fetch if timed else None,
                          offload if any(src == "G1" for src, _, _ in timed) else None)
    attribution = attribute_window(totals, "prefill" if fetch_inside == "prefill" else "queue",
                                   "prefill" if offload_inside == "prefill" else "none")
    report.server_split = Split("server metrics", sums[c.TTFT_SECONDS][1], attribution.ttft,
                                {k: p.seconds for k, p in attribution.parts.items()},
                                {k: p.method for k, p in attribution.parts.items()})
