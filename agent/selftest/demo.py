"""`kvscope demo`: the shared-prompts scenario (and its recompute baseline) with the agent attached.

While it runs it serves the engine's and the agent's /metrics (URLs printed) and prints a progress line
per second from the agent's own exposition. At the end: a report of what the agent measured next to the
engine's truth, printed and written as Markdown + PNG (+ JSON figures) into the output directory.
"""

from __future__ import annotations

import json
import math
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvscope.agent.records import COMPONENTS
from kvscope.agent.reference.engine import Engine
from kvscope.agent.reference.scenarios import LoadResult
from kvscope.agent.selftest import chart
from kvscope.agent.selftest.checks import check_run, engine_samples, measured_figures, shares, truth_figures
from kvscope.agent.selftest.harness import Harness, RunCapture
from kvscope.agent.selftest.plans import SharedPromptsPlan
from kvscope.agent.selftest.runner import settle_check

Print = Callable[[str], None]


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def _agent_totals(url: str) -> dict[str, float]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=2) as r:
        text = bytes(r.read()).decode()
    out: dict[str, float] = {}
    for name, labels, value in engine_samples(text):
        key = f"{name}:{labels['tier']}" if name == "kvscope_kv_hit_tokens_total" else name
        out[key] = out.get(key, 0.0) + value
    return out


@dataclass
class Progress:
    """A line per second while an engine runs: requests done (engine) and what the agent has seen."""

    say: Print
    total: int
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self, label: str, engine: Engine, engine_url: str, agent_url: str) -> None:
        self.say(f"[{label}] engine /metrics: {engine_url}")
        self.say(f"[{label}] agent  /metrics: {agent_url}")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, args=(label, engine, agent_url), daemon=True)
        self._thread.start()

    def stop(self, label: str) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.say(f"[{label}] done; the agent has seen every request")

    def _loop(self, label: str, engine: Engine, agent_url: str) -> None:
        t0 = time.monotonic()
        while not self._stop.wait(1.0):
            done = len(engine.truth.records)
            try:
                m = _agent_totals(agent_url)
            except OSError:
                continue
            lookup = m.get("kvscope_kv_lookup_tokens_total", 0.0)
            hits = {t: m.get(f"kvscope_kv_hit_tokens_total:{t}", 0.0) for t in ("G1", "G2", "G3", "G4")}
            rate = " ".join(f"{t} {100 * v / lookup:.0f}%" for t, v in hits.items() if v and lookup) or "none"
            count, total = m.get("kvscope_ttft_seconds_count", 0.0), m.get("kvscope_ttft_seconds_sum", 0.0)
            ttft = f"{1000 * total / count:.0f} ms" if count else "-"
            self.say(f"[{label}] {time.monotonic() - t0:4.0f}s  {done}/{self.total} requests done; agent: "
                     f"{count:.0f} TTFTs, mean {ttft}, hits {rate}")


def figures(cache: RunCapture, recompute: RunCapture, cache_result: LoadResult,
            recompute_result: LoadResult) -> dict[str, Any]:
    """Everything the report shows, agent next to truth."""
    t, m = truth_figures(cache), measured_figures(cache)
    rt, rm = truth_figures(recompute), measured_figures(recompute)
    truth_by_id = {tr.request_id: tr for tr in cache.truths}

    def split(records: list[dict[str, Any]]) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {"cold": [], "warm": []}
        for r in records:
            out["warm" if r.get("cached_tokens") else "cold"].append(1000 * float(r["ttft"]))
        return out

    agent_ttft = split(cache.requests)
    truth_ttft = {"cold": [1000 * tr.ttft_s for tr in cache.truths if not tr.tokens_by_tier],
                  "warm": [1000 * tr.ttft_s for tr in cache.truths if tr.tokens_by_tier]}
    tiers = ("G1", "G2", "G3", "G4")
    with_without = _counterfactual(cache.exposition)
    return {
        "requests": len(cache.truths), "prompt_tokens": cache.truths[0].prompt_tokens if cache.truths else 0,
        "hit_rate_pct": {tier: {"agent": 100 * m.hit_tokens.get(tier, 0.0) / m.lookup_tokens,
                                "truth": 100 * t.hit_tokens.get(tier, 0.0) / t.lookup_tokens} for tier in tiers},
        "hit_tokens": {tier: {"agent": m.hit_tokens.get(tier, 0.0), "truth": t.hit_tokens.get(tier, 0.0)}
                       for tier in tiers},
        "bytes_per_link": {link: {"agent": m.link_bytes.get(link, 0.0), "truth": t.link_bytes.get(link, 0.0)}
                           for link in sorted(set(m.link_bytes) | set(t.link_bytes))
                           if m.link_bytes.get(link) or t.link_bytes.get(link)},
        "ttft_ms": {kind: {"agent": {"n": len(agent_ttft[kind]), "p50": percentile(agent_ttft[kind], 50),
                                     "p95": percentile(agent_ttft[kind], 95)},
                           "truth": {"n": len(truth_ttft[kind]), "p50": percentile(truth_ttft[kind], 50),
                                     "p95": percentile(truth_ttft[kind], 95)}} for kind in ("cold", "warm")},
        "mean_ttft_ms": {"cache": {"agent": 1000 * m.ttft_sum / m.ttft_count,
                                   "truth": 1000 * t.ttft_sum / t.ttft_count},
                         "recompute": {"agent": 1000 * rm.ttft_sum / rm.ttft_count,
                                       "truth": 1000 * rt.ttft_sum / rt.ttft_count}},
        "run_seconds": {"cache": cache_result.seconds, "recompute": recompute_result.seconds},
        "speedup": {"total_time": recompute_result.seconds / cache_result.seconds,
                    "mean_ttft_agent": (rm.ttft_sum / rm.ttft_count) / (m.ttft_sum / m.ttft_count),
                    "mean_ttft_truth": (rt.ttft_sum / rt.ttft_count) / (t.ttft_sum / t.ttft_count),
                    "agent_counterfactual": with_without},
        "ttft_split_pct": {"agent": shares(m.components), "truth": shares(t.components)},
        "prefill_saved_s": {"agent": m.prefill_saved, "truth": t.prefill_saved},
        "points": {"cache": [[1000 * float(r["ttft"]), bool(r.get("cached_tokens"))] for r in cache.requests
                             if str(r["request_id"]) in truth_by_id],
                   "recompute": [1000 * float(r["ttft"]) for r in recompute.requests]},
    }


def _counterfactual(exposition: str) -> float:
    """The agent's own estimate: TTFT without the cache / with it, over requests that reused tokens."""
    sums = {"with": 0.0, "without": 0.0}
    for name, labels, value in engine_samples(exposition):
        if name == "kvscope_counterfactual_ttft_seconds_total":
            sums[labels["cache"]] += value
    return sums["without"] / sums["with"] if sums["with"] else math.nan


def _f(x: float, digits: int = 1) -> str:
    return "—" if math.isnan(x) else f"{x:,.{digits}f}"


def markdown(fig: dict[str, Any], plan: SharedPromptsPlan, verdict: str) -> str:
    g = plan.model or "selftest-small (2 KiB/token)"
    lines = [
        "# kvscope demo: shared prompts through G1–G4",
        "",
        f"{fig['requests']} requests drawn from {plan.prompts} prompts of {plan.prompt_tokens} tokens at "
        f"concurrency {plan.concurrency}; KV geometry {g}, {plan.block_tokens}-token blocks, compute × "
        f"{plan.time_scale:g}. The cache starts empty. *Agent* = what kvscope measured through its ordinary "
        "collectors (vLLM /metrics, KV events, OTLP spans, correlation); *truth* = the reference engine's "
        "own record.",
        "",
        "## Hit rate per tier (share of prompt tokens looked up)",
        "",
        "| tier | agent | truth | tokens (agent) |",
        "|---|---:|---:|---:|",
    ]
    for tier, v in fig["hit_rate_pct"].items():
        lines.append(f"| {tier} | {_f(v['agent'])} % | {_f(v['truth'])} % | {fig['hit_tokens'][tier]['agent']:,.0f} |")
    lines += ["", "## Bytes per link", "", "| link | agent | truth |", "|---|---:|---:|"]
    for link, v in fig["bytes_per_link"].items():
        lines.append(f"| {link} | {v['agent'] / 1e6:,.1f} MB | {v['truth'] / 1e6:,.1f} MB |")
    lines += ["", "## TTFT, cold vs warm (ms)", "", "| requests | n | p50 agent | p50 truth | p95 agent | p95 truth |",
              "|---|---:|---:|---:|---:|---:|"]
    for kind, v in fig["ttft_ms"].items():
        a, t = v["agent"], v["truth"]
        lines.append(f"| {kind} | {a['n']} | {_f(a['p50'])} | {_f(t['p50'])} | {_f(a['p95'])} | {_f(t['p95'])} |")
    s, mt = fig["speedup"], fig["mean_ttft_ms"]
    lines += ["", "## Against recompute", "",
              f"- whole run: {fig['run_seconds']['recompute']:.2f} s without the cache, "
              f"{fig['run_seconds']['cache']:.2f} s with it: **{s['total_time']:.2f}×** (cold fill included)",
              f"- mean TTFT: {_f(mt['recompute']['agent'])} ms → {_f(mt['cache']['agent'])} ms as the agent saw it "
              f"(**{s['mean_ttft_agent']:.2f}×**; truth {s['mean_ttft_truth']:.2f}×)",
              f"- the agent's counterfactual for requests that reused KV (TTFT without / with the cache, from its "
              f"fitted prefill cost model): {_f(s['agent_counterfactual'], 2)}×",
              f"- prefill saved: agent {fig['prefill_saved_s']['agent']:.3f} s, truth "
              f"{fig['prefill_saved_s']['truth']:.3f} s", "",
              "## Where TTFT went (cache run, % of TTFT)", "", "| component | agent | truth |", "|---|---:|---:|"]
    for c in COMPONENTS:
        lines.append(f"| {c} | {_f(fig['ttft_split_pct']['agent'][c])} | {_f(fig['ttft_split_pct']['truth'][c])} |")
    lines += ["", "The agent puts the engine's own bookkeeping inside the prefill phase (lookup, hashing, "
              "eviction copies) into *prefill*: vLLM's phases cannot separate it; the truth calls it *other*.",
              "", "![TTFT per request and the TTFT split](ttft.png)", "", f"Selftest checks on this run: {verdict}", ""]
    return "\n".join(lines)


@dataclass
class DemoResult:
    report: Path
    chart: Path
    figures: dict[str, Any]
    captures: list[RunCapture]
    passed: bool


def run_demo(plan: SharedPromptsPlan, out: Path, say: Print = print, keep_serving: bool = False,
             wait: Callable[[], None] | None = None, interval: float = 0.2) -> DemoResult:
    out.mkdir(parents=True, exist_ok=True)
    progress = Progress(say, plan.requests)
    with tempfile.TemporaryDirectory(prefix="kvscope-demo-") as tmp:
        harness = Harness(Path(tmp) / "agent", interval=interval, on_start=progress.start, on_stop=progress.stop,
                          keep_serving={"cache"} if keep_serving else set())
        try:
            cache_result, recompute_result = plan.run(harness, Path(tmp) / "data")
            cache, recompute = harness.runs
            checks = [settle_check(r) for r in harness.runs] + [c for r in harness.runs for c in check_run(r)]
            passed = all(c.passed for c in checks)
            verdict = (f"all {len(checks)} passed" if passed else
                       f"{sum(not c.passed for c in checks)} of {len(checks)} missed: "
                       + ", ".join(f"{c.run} {c.quantity}" for c in checks if not c.passed))
            fig = figures(cache, recompute, cache_result, recompute_result)
            report, png = out / "report.md", out / "ttft.png"
            report.write_text(markdown(fig, plan, verdict), encoding="utf-8")
            (out / "figures.json").write_text(json.dumps(fig, indent=1) + "\n", encoding="utf-8")
            chart.render(png, [chart.RequestPoint(i, ms, warm) for i, (ms, warm) in enumerate(fig["points"]["cache"])],
                         [chart.RequestPoint(i, ms, False) for i, ms in enumerate(fig["points"]["recompute"])],
                         fig["ttft_split_pct"]["agent"], fig["ttft_split_pct"]["truth"],
                         f"kvscope demo: {fig['requests']} requests, {plan.prompts} shared prompts, "
                         f"concurrency {plan.concurrency}")
            say(report.read_text(encoding="utf-8"))
            say(f"written: {report}, {png}, {out / 'figures.json'}")
            if keep_serving and wait is not None:
                say("still serving the cache run's engine and agent (URLs above); Ctrl-C to stop")
                wait()
        finally:
            harness.close()
    return DemoResult(report, png, fig, [cache, recompute], passed)
