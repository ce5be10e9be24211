"""The marginal value of capacity from a profile: what each tier's next size step (2x today's) would save and
its last one (today's against half) saves, in GPU-seconds of prefill per request and, at the profile's request
rate, per hour. The same definition as the value analysis' gauge (agent/analyses/value/curve.py), from a
replay instead of the live counters."""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.agent.analyses.value.curve import steps
from kvscope.agent.analyses.whatif.hierarchy import TIERS
from kvscope.agent.analyses.whatif.predict import Prediction, replay
from kvscope.agent.analyses.whatif.profile import StreamProfile
from kvscope.agent.analyses.whatif.sizes import Scenario, Size, fmt_bytes

SCALES = (2.0, 0.5)


@dataclass(frozen=True, slots=True)
class Marginal:
    tier: str
    step: str  # next | last
    size_change: float | None  # bytes; None without bytes per token
    blocks_change: int
    per_request: float  # GPU-seconds per request
    per_hour: float | None  # at the profile's request rate
    confidence: str
    requests: int

    def line(self, hourly: bool = True) -> str:
        size = fmt_bytes(self.size_change) if self.size_change is not None else f"{self.blocks_change:,} blocks"
        what = (f"{self.tier} +{size} (2x): would save" if self.step == "next"
                else f"{self.tier} last {size} (of today's): saves")
        rate = f"{self.per_hour:+,.0f} GPU-s/h, " if hourly and self.per_hour is not None else ""
        return (f"{what} {rate}{1000 * self.per_request:+,.1f} GPU-ms per request "
                f"({self.requests} requests, {self.confidence or 'no'} confidence)")


def marginals(profile: StreamProfile, gpus: float = 1.0) -> list[Marginal]:
    """Each tier of known size above 0: its next and last step, where the replay predicts prefill saved."""
    scenarios = [Scenario(f"{tier}x{k:g}", ((tier, Size(k, "x")),)) for tier, today in zip(TIERS, profile.today,
                                                                                            strict=True)
                 if today for k in SCALES]
    if not scenarios:
        return []
    predictions = {p.scenario.name: p for p in replay(profile, scenarios)}
    return from_predictions(profile, predictions, gpus)


def from_predictions(profile: StreamProfile, predictions: dict[str, Prediction], gpus: float) -> list[Marginal]:
    saved = {name: p.ttft.prefill_saved * gpus for name, p in predictions.items() if p.ttft is not None}
    block_bytes = profile.block_tokens * profile.bytes_per_token
    out = []
    for tier in TIERS:
        i = TIERS.index(tier)
        blocks = {name: float(p.blocks[i]) for name, p in predictions.items()}
        for step in steps(tier, saved, blocks):
            changed = round(step.size_change or 0.0)
            low = "low" in (predictions[step.scenario].confidence, predictions["today"].confidence)
            ttft = predictions["today"].ttft
            out.append(Marginal(tier, step.step, changed * block_bytes if block_bytes else None, changed,
                                step.saved,
                                None if profile.requests_per_hour is None
                                else step.saved * profile.requests_per_hour,
                                "low" if low else "high", ttft.requests if ttft is not None else 0))
    return out


def marginal_text(found: list[Marginal]) -> str:
    if not found:
        return ""
    head = ("marginal value of capacity (GPU-seconds of prefill saved; next: the tier at 2x today's size, last: "
            "today's against half):\n")
    return head + "".join(f"  {m.line()}\n" for m in found)
