"""The what-if proof: predict other tier sizes from one run, then run them and compare.

1. The reference engine runs a workload of shared prefixes at several popularities (prefix_order: system
   prompts and documents, Zipf-popular, then multi-turn conversations, each turn reusing the last) at
   gpt-oss-120b's KV geometry (36,864 B/token), scaled in count, with G1, G2 and G3, announcing every G1
   reuse in its KV events (vLLM's kv_cache_report_mode=full). The agent is attached as usual, with the
   what-if analysis.
2. Before the agent stops, the profile is fetched from its endpoint (GET /whatif/profile, what `kvscope
   what-if --url` reads) and replayed at the plan's scenarios: by default G1 twice as large, and G2 removed.
3. The engine runs the same requests at each scenario's sizes; its truth (tokens per tier, TTFT) is compared
   with the prediction: the share of looked-up tokens each tier served within 3 percentage points, mean
   TTFT within 10 %, and the marginal value of the step (the prefill seconds saved per request at the
   scenario's sizes less today's, docs/value.md) within 20 % as `kvscope what-if` replays it. The p50 is
   reported beside it, and so is the marginal value the agent's exported counters give (what its gauge is
   made from): each request is predicted as it comes, with the models as far as they have seen, so in a
   short run from a cold cache it lags the replay of the whole trace. The model at today's sizes is held to
   the same 3 points, and the agent's exported counters must say what the replay says.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from kvscope.agent.analyses.whatif.commands import fetch
from kvscope.agent.analyses.whatif.hierarchy import TIERS
from kvscope.agent.analyses.whatif.metrics import HIT_TOKENS, PREFILL_LOST, PREFILL_SAVED, TTFT
from kvscope.agent.analyses.whatif.predict import Prediction, replay
from kvscope.agent.analyses.whatif.profile import StreamProfile, loads
from kvscope.agent.analyses.whatif.sizes import Scenario, scenario
from kvscope.agent.tools.reference.engine import EngineConfig
from kvscope.agent.tools.reference.geometry import preset
from kvscope.agent.tools.reference.scenarios import prefix_order, run_load
from kvscope.agent.tools.selftest.checks import Check, engine_samples
from kvscope.agent.tools.selftest.harness import Harness, RunCapture

SHARE_PP = 3.0  # per-tier served share, percentage points (the goal)
TTFT_RELATIVE = 0.10  # mean TTFT
EXPORT_RELATIVE = 1e-9  # exported model counts against the replay of the same accesses
MARGINAL_RELATIVE = 0.20  # change of the prefill saved per request, a size step against a re-run at that size


@dataclass(frozen=True, slots=True)
class WhatIfPlan:
    requests: int = 160
    systems: int = 2
    system_tokens: int = 64
    documents: int = 24
    document_tokens: tuple[int, int] = (128, 512)
    question_tokens: tuple[int, int] = (8, 32)
    answer_tokens: tuple[int, int] = (16, 48)
    turns: tuple[int, int] = (2, 6)
    active: int = 16  # conversations open at once
    zipf: float = 1.0
    block_tokens: int = 32  # 1.2 MB blocks at gpt-oss-120b's 36,864 B/token; a prompt is ~18 blocks
    g1_blocks: int = 96  # about 5 prompts
    g2_blocks: int = 128
    g3_blocks: int = 96
    # compute at 16x the seeds' cost model (a timed sleep): TTFT well above the engine's own Python and I/O, which move
    # with the shared VM's core speed between the runs compared
    time_scale: float = 16.0
    max_tokens: int = 1
    # stores to G3 inline: with write-behind (the engine's default) a block on its way down is in no tier until it
    # lands, which depends on timing (docs/whatif.md: G3's share 1-2 points lower, more under load)
    write_behind_blocks: int = 0
    concurrency: int = 1
    model: str = "gpt-oss-120b"
    seed: int = 0
    scenarios: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (("G1x2", (("G1", "2x"),)),
                                                                       ("no-G2", (("G2", "0"),)))

    def config(self, data_dir: Path, blocks: list[int]) -> EngineConfig:
        return EngineConfig(data_dir=data_dir, geometry=preset(self.model), block_tokens=self.block_tokens,
                            g1_blocks=blocks[0], g2_blocks=blocks[1], g3_blocks=blocks[2], g4_blocks=blocks[3],
                            time_scale=self.time_scale, default_max_tokens=self.max_tokens,
                            write_behind_blocks=self.write_behind_blocks, kv_cache_report_full=True)

    @property
    def today(self) -> list[int]:
        return [self.g1_blocks, self.g2_blocks, self.g3_blocks, 0]

    def agent_config(self) -> str:
        """The what-if analysis as an operator would configure it for this engine: G3's size (vLLM's /metrics
        sizes G1 and G2 only) and the plan's scenarios."""
        block_bytes = preset(self.model).block_bytes(self.block_tokens)
        named = ", ".join(f'"{name}" = {{ {", ".join(f"{t} = {s!r}" for t, s in sizes)} }}'.replace("'", '"')
                          for name, sizes in self.scenarios)
        return (f'\n[analyses.whatif]\ntier_sizes = {{ G3 = "{self.g3_blocks * block_bytes}B", G4 = "0" }}\n'
                f"scales = []\nscenarios = {{ {named} }}\n")

    def named(self) -> list[Scenario]:
        return [scenario(name, dict(sizes)) for name, sizes in self.scenarios]

    def run(self, harness: Harness, data_dir: Path) -> WhatIfResult:
        order = prefix_order(self.requests, self.seed, self.systems, self.system_tokens, self.documents,
                             self.document_tokens, self.question_tokens, self.answer_tokens, self.turns, self.active,
                             self.zipf)
        profiles: dict[str, bytes] = {}
        urls: dict[str, str] = {}
        harness.on_start = lambda label, _engine, _url, agent: urls.__setitem__(label, agent)
        harness.on_stop = lambda label: profiles.__setitem__(label, fetch(urls[label]))
        harness.prefix = "today "
        run_load(self.config(data_dir / "today", self.today), "today", order, self.concurrency, harness.attached)
        (harness.workdir / "whatif-profile.json").write_bytes(profiles["today cache"])  # kvscope what-if --recording
        (profile,) = loads(profiles["today cache"])
        predictions = replay(profile, self.named())
        result = WhatIfResult(profile, predictions, harness.runs[-1])
        for p in predictions[1:]:
            harness.prefix = f"{p.scenario.name} "
            run_load(self.config(data_dir / p.scenario.name, p.blocks), p.scenario.name, order, self.concurrency,
                     harness.attached)
            result.runs[p.scenario.name] = harness.runs[-1]
        harness.on_start = harness.on_stop = None
        return result


@dataclass
class WhatIfResult:
    profile: StreamProfile
    predictions: list[Prediction]  # today's first
    today: RunCapture
    runs: dict[str, RunCapture] = field(default_factory=dict)  # scenario -> the engine run at its sizes


@dataclass(frozen=True, slots=True)
class Actual:
    shares: list[float]  # per tier, of looked-up tokens
    ttft_mean: float
    ttft_p50: float


def actual(run: RunCapture) -> Actual:
    lookup = sum(t.prompt_tokens for t in run.truths)
    shares = [sum(t.tokens_by_tier.get(tier, 0) for t in run.truths) / lookup for tier in TIERS]
    ttfts = sorted(t.ttft_s for t in run.truths)
    return Actual(shares, statistics.fmean(ttfts), ttfts[max(0, math.ceil(0.5 * len(ttfts)) - 1)])


def whatif_checks(result: WhatIfResult) -> list[Check]:
    out = []
    today, measured_today = result.predictions[0], actual(result.today)
    out.extend(_share_checks("today", today, measured_today, "model at today's sizes", today.model_shares))
    out.extend(_export_checks(result))
    out.extend(marginal_checks(result))
    for p in result.predictions[1:]:
        run = result.runs[p.scenario.name]
        truth = actual(run)
        label = f"{p.scenario.name} ({run.label})"
        out.extend(_share_checks(label, p, truth, "predicted"))
        if p.ttft is None:
            out.append(Check(label, "mean TTFT s predicted", truth.ttft_mean, math.nan, math.nan,
                             f"rel {TTFT_RELATIVE:g} ({'; '.join(p.notes)})", False))
            continue
        error = (p.ttft.mean - truth.ttft_mean) / truth.ttft_mean
        out.append(Check(label, f"mean TTFT s predicted ({p.confidence} confidence)", truth.ttft_mean, p.ttft.mean,
                         error, f"rel {TTFT_RELATIVE:g}", abs(error) <= TTFT_RELATIVE))
        out.append(Check(label, "p50 TTFT s predicted (reported)", truth.ttft_p50, p.ttft.p50,
                         (p.ttft.p50 - truth.ttft_p50) / truth.ttft_p50, "reported", True))
        change, predicted_change = (100 * (x / measured_today.ttft_mean - 1) for x in (truth.ttft_mean, p.ttft.mean))
        out.append(Check(label, "mean TTFT change from today % (reported)", change, predicted_change,
                         predicted_change - change, "reported", True))
    return out


def _share_checks(label: str, p: Prediction, truth: Actual, what: str,
                  shares: list[float] | None = None) -> list[Check]:
    out = []
    for tier, predicted, real in zip(TIERS, p.shares if shares is None else shares, truth.shares, strict=True):
        if tier == "G4" and not predicted and not real:
            continue
        error = 100 * (predicted - real)
        out.append(Check(label, f"{tier} served share % {what}", 100 * real, 100 * predicted, error,
                         f"±{SHARE_PP:g} pp", abs(error) <= SHARE_PP))
    return out


def _export_checks(result: WhatIfResult) -> list[Check]:
    """The agent's exported what-if counters (what a dashboard plots: each model's own counts) against the
    replay of its profile's trace: the same accesses through the same models."""
    exported: dict[tuple[str, str], float] = {}
    for name, labels, value in engine_samples(result.today.exposition):
        if name == HIT_TOKENS:
            exported[(labels["scenario"], labels["tier"])] = value
    out = []
    for p in result.predictions:
        for tier, tokens in zip(TIERS, p.model_hit_tokens, strict=True):
            got = exported.get((p.scenario.name, tier), 0.0)
            error = (got - tokens) / tokens if tokens else got
            out.append(Check("today", f"{p.scenario.name} {tier} hit tokens exported = replayed", tokens, got, error,
                             f"rel {EXPORT_RELATIVE:g}", abs(error) <= EXPORT_RELATIVE))
    return out


def saved_per_request(run: RunCapture) -> float:
    """The engine's truth: recompute less prefill and fetch, per request (0 for one that reused nothing)."""
    saved = [t.recompute_s - t.prefill_compute_s - t.fetch_total_s if t.tokens_by_tier else 0.0 for t in run.truths]
    return statistics.fmean(saved) if saved else math.nan


def exported_saved_per_request(exposition: str) -> dict[str, float]:
    """Net predicted prefill saved per request by scenario, from the agent's what-if counters."""
    net: dict[str, float] = {}
    requests = 0.0
    for name, labels, value in engine_samples(exposition):
        if name in (PREFILL_SAVED, PREFILL_LOST):
            sign = 1.0 if name == PREFILL_SAVED else -1.0
            net[labels["scenario"]] = net.get(labels["scenario"], 0.0) + sign * value
        elif name == f"{TTFT}_count" and labels.get("scenario") == "today":
            requests += value
    return {s: v / requests for s, v in net.items()} if requests else {}


def marginal_checks(result: WhatIfResult) -> list[Check]:
    """Each scenario is a step of a tier's size from today's: its prefill saved per request less today's, as the
    replay predicts it and as the agent's counters do, against the engine's truth at both sizes."""
    today = result.predictions[0]
    truth_today = saved_per_request(result.today)
    exported = exported_saved_per_request(result.today.exposition)
    out = []
    for p in result.predictions[1:]:
        run = result.runs[p.scenario.name]
        label = f"{p.scenario.name} ({run.label})"
        truth = saved_per_request(run) - truth_today
        predicted = (p.ttft.prefill_saved - today.ttft.prefill_saved if p.ttft is not None and today.ttft is not None
                     else math.nan)
        counted = exported.get(p.scenario.name, math.nan) - exported.get("today", math.nan)
        for what, got, checked in (("replayed", predicted, True), ("exported (reported)", counted, False)):
            error = (got - truth) / abs(truth) if truth else math.inf
            out.append(Check(label, f"marginal prefill saved s/request {what} ({p.confidence or 'no'} confidence)",
                             truth, got, error, f"rel {MARGINAL_RELATIVE:g}" if checked else "reported",
                             abs(error) <= MARGINAL_RELATIVE or not checked))
    return out
