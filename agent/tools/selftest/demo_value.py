"""What G4 is worth in the demo's own shared-prompts run (docs/value.md).

- *GPU time G4 saved per hour*: the prefill seconds the agent attributes to G4 (each request's recompute
  avoided, split by the tier that served its reused tokens, less its fetch from G4: kvscope_tier_prefill_saved
  less _lost), over the run's wall time, per hour, on the engine's one device slot (one GPU); the engine's own
  split of its truth beside it.
- *Marginal value of doubling G4*: the what-if replay of the agent's profile (GET /whatif/profile) with G4
  twice today's size, its prefill saved per request less today's, at the run's request rate. The what-if is
  told the sizes an operator would give it: G4 from the engine's configuration, G1 and G2 as 0 (they keep
  nothing between requests here, as in the seeds' G4 test). Its last step (today's G4 against half) is
  printed beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvscope.agent.analyses.whatif.marginal import Marginal, marginals
from kvscope.agent.analyses.whatif.predict import replay
from kvscope.agent.analyses.whatif.profile import StreamProfile
from kvscope.agent.analyses.whatif.sizes import fmt_bytes
from kvscope.agent.tools.reference.engine import EngineConfig
from kvscope.agent.tools.reference.scenarios import LoadResult, cache_config
from kvscope.agent.tools.selftest.checks import measured_figures, truth_figures
from kvscope.agent.tools.selftest.harness import RunCapture
from kvscope.agent.tools.selftest.plans import DemoPlan


def whatif_config(plan: DemoPlan, base: EngineConfig) -> str:
    """The agent's [analyses.whatif] for the shared-prompts run: G4's size as the engine has it."""
    config = cache_config(base, plan.prompts, plan.prompt_tokens)
    g4 = config.g4_blocks * config.geometry.block_bytes(config.block_tokens)
    return (f'\n[analyses.whatif]\ntier_sizes = {{ G1 = "0", G2 = "0", G3 = "0", G4 = "{g4}B" }}\n'
            "scales = [0.5, 2.0]\n")


@dataclass(frozen=True, slots=True)
class G4Value:
    seconds: float  # the run's wall time
    requests: int
    saved_per_hour: float  # GPU-seconds, the agent's
    saved_per_hour_truth: float  # the engine's own split
    g4_bytes: float | None
    doubling: Marginal | None
    last: Marginal | None
    model_share_error_pp: float  # the what-if at today's sizes against the measured G4 share, points
    notes: list[str] | None = None

    def per_hour(self, m: Marginal | None) -> float:
        return math.nan if m is None else m.per_request * self.requests / self.seconds * 3600.0


def g4_value(cache_run: RunCapture, cache: LoadResult, profile: StreamProfile | None) -> G4Value:
    agent, truth = measured_figures(cache_run), truth_figures(cache_run)
    per_hour = 3600.0 / cache.seconds
    doubling = last = None
    error, notes = math.nan, None
    g4_bytes = None
    if profile is not None:
        found = {m.step: m for m in marginals(profile) if m.tier == "G4"}
        doubling, last = found.get("next"), found.get("last")
        (today,) = replay(profile, [])
        error = 100 * (today.model_shares[3] - profile.measured.share("G4"))
        g4_bytes = float(profile.today[3] or 0) * profile.block_tokens * profile.bytes_per_token
        notes = list(profile.notes)
    return G4Value(cache.seconds, cache.requests, agent.saved_by_tier.get("G4", 0.0) * per_hour,
                   truth.saved_by_tier.get("G4", 0.0) * per_hour, g4_bytes, doubling, last, error, notes)


def value_headline(v: G4Value) -> str:
    doubled = ("not predicted" if v.doubling is None
               else f"{v.per_hour(v.doubling):+,.0f} GPU-s/h more")
    return (f"G4 saved {v.saved_per_hour:,.0f} GPU-seconds of prefill per hour at this run's rate (the engine's "
            f"truth: {v.saved_per_hour_truth:,.0f}); doubling it: {doubled}.")


def value_section(v: G4Value) -> list[str]:
    size = "—" if v.g4_bytes is None else fmt_bytes(v.g4_bytes)
    lines = ["## 3. What G4 is worth in this run", "", f"**{value_headline(v)}**", "",
             "*GPU time saved per hour* = the prefill seconds the agent attributes to G4 in the shared-prompts run "
             "(each request's recompute avoided, split by the tier that served its reused tokens, less its "
             "fetch from G4), over the run's wall time, per hour, for an engine on one GPU; the engine's own "
             "split of its truth is in brackets.", "",
             f"*Marginal value of doubling G4* = what the what-if predicts G4 at twice today's size ({size}) "
             "would save, less what it saves today, per request, at this run's request rate "
             f"({v.requests} requests in {v.seconds:.1f} s).", ""]
    for m in (v.doubling, v.last):
        if m is not None:
            lines.append(f"- {m.line(hourly=False)}: {v.per_hour(m):+,.0f} GPU-s/h at this run's rate")
    if v.doubling is None:
        lines.append("- no prediction for G4: " + ("; ".join(v.notes or []) or "the agent served no what-if profile"))
    if math.isfinite(v.model_share_error_pp):
        lines += ["", f"The what-if's model of today's tiers puts G4's share of the looked-up tokens "
                  f"{v.model_share_error_pp:+.1f} points from what the engine measured: that is how far its "
                  "model of this engine is off (with several clients at once, a prompt sent again before its "
                  "first send has stored its KV is recomputed, which a model of tier sizes does not see). "
                  "`kvscope selftest --scenario what-if` holds such predictions to re-runs at the predicted "
                  "sizes."]
    return [*lines, ""]
