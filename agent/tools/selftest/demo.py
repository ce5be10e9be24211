"""`kvscope demo`: the seeds' two experiments at laptop scale, with the agent attached.

1. TTFT against prompt length: each prompt recomputed without a cache, then sent cold and warm to an engine
   whose reused blocks all come from G4; the split per length, the fetch bandwidth against break-even.
2. Shared prompts: N requests from M prompts at concurrency C, cache starting empty, against recompute.
3. What G4 is worth in that run: the GPU time it saved per hour, and the marginal value of doubling it
   (demo_value.py).

While it runs it serves each engine's and agent's /metrics (URLs printed) and prints a progress line per
second from the agent's own exposition. At the end: a report with one headline per experiment, printed and
written as Markdown + PNG (+ JSON figures) into the output directory (demo_figures.py, demo_report.py,
chart.py). `keep_serving` leaves the shared-prompts cache run's engine and agent up until `wait` returns.
"""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvscope.agent.analyses.whatif.commands import fetch
from kvscope.agent.analyses.whatif.profile import StreamProfile, loads
from kvscope.agent.tools.reference.engine import Engine
from kvscope.agent.tools.selftest import chart
from kvscope.agent.tools.selftest.checks import check_run, engine_samples
from kvscope.agent.tools.selftest.demo_figures import sweep_figures, throughput_figures
from kvscope.agent.tools.selftest.demo_report import markdown, sweep_headline, throughput_headline
from kvscope.agent.tools.selftest.demo_value import g4_value, value_headline, value_section, whatif_config
from kvscope.agent.tools.selftest.harness import Harness, RunCapture
from kvscope.agent.tools.selftest.plans import DemoPlan
from kvscope.agent.tools.selftest.runner import settle_check

Print = Callable[[str], None]


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
    total: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    agent_urls: dict[str, str] = field(default_factory=dict)

    def start(self, label: str, engine: Engine, engine_url: str, agent_url: str) -> None:
        self.agent_urls[label] = agent_url
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


@dataclass
class DemoResult:
    report: Path
    chart: Path
    figures: dict[str, Any]
    captures: list[RunCapture]
    passed: bool
    seconds: float


def _verdict(runs: list[RunCapture]) -> tuple[bool, str]:
    checks = [settle_check(r) for r in runs] + [c for r in runs for c in check_run(r)]
    misses = [c for c in checks if not c.passed]
    if not misses:
        return True, f"all {len(checks)} passed"
    return False, f"{len(misses)} of {len(checks)} missed: " + "; ".join(
        f"{c.run} {c.quantity} (truth {c.truth:.6g}, agent {c.measured:.6g}, tolerance {c.tolerance})" for c in misses)


def run_demo(plan: DemoPlan, out: Path, say: Print = print, keep_serving: bool = False,
             wait: Callable[[], object] | None = None, interval: float = 0.2) -> DemoResult:
    """The two experiments with the agent attached; prints progress, then the report, and writes it with the
    chart and every figure as JSON into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    progress = Progress(say)
    with tempfile.TemporaryDirectory(prefix="kvscope-demo-") as tmp:
        harness = Harness(Path(tmp) / "agent", interval=interval, on_start=progress.start, on_stop=progress.stop,
                          keep_serving={"shared-prompts cache"} if keep_serving else set())
        try:
            say(f"1/2 TTFT against prompt length: {', '.join(f'{n:,}' for n in plan.lengths)} tokens, "
                "recomputed, then cold and warm with G4")
            progress.total = len(plan.lengths)
            recomputed, rows = plan.sweep(harness, Path(tmp) / "sweep")
            say(f"2/2 shared prompts: {plan.requests} requests from {plan.prompts} prompts of "
                f"{plan.prompt_tokens:,} tokens, {plan.concurrency} at a time, with G4 then recomputed")
            progress.total = plan.requests
            # the shared-prompts runs: every block sampled, G4's size told to the what-if; the cache run's
            # profile is read before its agent stops
            harness.reuse_sample_rate = 1.0
            harness.extra_config = whatif_config(plan, plan.base(Path(tmp) / "shared"))
            profiles: dict[str, bytes] = {}

            def stop(label: str) -> None:
                _keep_profile(profiles, label, progress.agent_urls.get(label))
                progress.stop(label)

            harness.on_stop = stop
            cache, recompute = plan.throughput(harness, Path(tmp) / "shared")
            sweep_recompute, sweep_cache, shared_cache, shared_recompute = harness.runs
            g4 = g4_value(shared_cache, cache, _profile(profiles.get("shared-prompts cache")))
            passed, verdict = _verdict(harness.runs)
            sweep = sweep_figures(sweep_recompute, sweep_cache, recomputed, rows)
            throughput = throughput_figures(shared_cache, shared_recompute, cache, recompute, plan.prompts,
                                            plan.concurrency)
            report, png = out / "report.md", out / "ttft.png"
            report.write_text(markdown(plan, sweep, throughput, verdict, value_section(g4)), encoding="utf-8")
            figures = {"plan": asdict(plan), "sweep": asdict(sweep), "throughput": asdict(throughput),
                       "g4_value": {**asdict(g4), "doubling_per_hour": g4.per_hour(g4.doubling),
                                    "last_step_per_hour": g4.per_hour(g4.last)},
                       "headlines": {"sweep": sweep_headline(sweep), "throughput": throughput_headline(throughput),
                                     "g4_value": value_headline(g4)},
                       "selftest": verdict}
            (out / "figures.json").write_text(json.dumps(_finite(figures), indent=1) + "\n", encoding="utf-8")
            chart.render(png, sweep, throughput, f"kvscope demo: {plan.model or 'small'} KV geometry, every reused "
                         "block from G4")
            seconds = time.monotonic() - started
            say(report.read_text(encoding="utf-8"))
            say(f"headline 1: {sweep_headline(sweep)}")
            say(f"headline 2: {throughput_headline(throughput)}")
            say(f"headline 3: {value_headline(g4)}")
            say(f"written: {report}, {png}, {out / 'figures.json'} ({seconds:.0f} s)")
            if keep_serving and wait is not None:
                say("still serving the shared-prompts cache run's engine and agent (URLs above); Ctrl-C to stop")
                wait()
        finally:
            harness.close()
    return DemoResult(report, png, figures, list(harness.runs), passed, seconds)


def _keep_profile(profiles: dict[str, bytes], label: str, agent_url: str | None) -> None:
    """The what-if profile of a run's agent, read while it still serves (a failure leaves the figure out)."""
    if agent_url is None:
        return
    with contextlib.suppress(OSError):
        profiles[label] = fetch(agent_url)


def _profile(data: bytes | None) -> StreamProfile | None:
    profiles = loads(data) if data else []
    return profiles[0] if profiles else None


def _finite(value: Any) -> Any:
    """JSON without NaN or Infinity (null instead)."""
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value
