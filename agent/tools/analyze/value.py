"""What the cache was worth in an AIPerf run (docs/value.md): the same figures as the demo's, from the run's
artifacts.

- GPU-seconds of prefill each tier saved per hour: the recording's per-request prefill saved (the agent's
  counterfactual), each split by the tier that served its reused tokens and the tier its fetch read from, as
  the engine's counters over the run divide them (the correlation analysis' tier mix), over the run's
  duration, x the GPUs one engine spans.
- The marginal value of each tier's size, where a what-if profile of the run is given (`--whatif`): the
  replay's prefill saved per request at 2x (and half) each tier's size less today's, at the run's request rate.
"""

from __future__ import annotations

from dataclasses import asdict

from kvscope.agent.analyses.correlation.tiermix import TierMix
from kvscope.agent.analyses.whatif.marginal import marginals
from kvscope.agent.analyses.whatif.profile import StreamProfile
from kvscope.agent.tools.analyze.inputs import RecordedRequest
from kvscope.agent.tools.analyze.report import Report

ONBOARD = {("G2", "G1"), ("G3", "G2"), ("G3", "G1"), ("G4", "G3"), ("G4", "G2"), ("G4", "G1")}


def run_mix(report: Report) -> TierMix:
    """The engine's hits and onboard link totals over the run, as one window of the tier mix."""
    mix = TierMix()
    for tier, tokens in report.hits.items():
        mix.add_hits(tier, tokens)
    for name, link in report.links.items():
        src, _, dst = name.partition("->")
        if (src, dst) in ONBOARD:
            mix.add_onboard(src, dst, link["bytes"], link["seconds"])
    mix.close_window()
    return mix


def value_figures(report: Report, kept: list[RecordedRequest], profile: StreamProfile | None, gpus: float) -> None:
    judged = [r for r in kept if r.prefill_saved is not None]
    if judged and report.duration_s > 0 and report.hits:
        mix = run_mix(report)
        saved: dict[str, float] = {}
        for r in judged:
            fetch = r.components.get("fetch", 0.0)
            for tier, seconds in mix.split(float(r.cached_tokens or 0), (r.prefill_saved or 0.0) + fetch,
                                           fetch).items():
                saved[tier] = saved.get(tier, 0.0) + seconds
        report.saved_per_hour = {t: s * gpus * 3600.0 / report.duration_s for t, s in sorted(saved.items())}
    elif judged:
        report.notes.append("value: no engine hit counters (server metrics) to split the saved time by tier")
    if profile is not None:
        found = marginals(profile, gpus)
        report.marginal = [{**asdict(m), "per_hour": m.per_request * report.rps * 3600.0} for m in found]
        if not found:
            report.notes.append("value: the what-if profile has no tier of known size above 0 to step")
