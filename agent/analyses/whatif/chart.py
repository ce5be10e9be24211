"""The chart `kvscope what-if --chart` draws: for one tier swept through sizes, the share of looked-up
tokens each tier serves (stacked) and TTFT (mean, p50), today's size and the asked one marked. Needs
matplotlib (the `reference` extra); the command checks for it first."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from kvscope.agent.analyses.whatif.hierarchy import TIERS
from kvscope.agent.analyses.whatif.predict import Prediction
from kvscope.agent.analyses.whatif.profile import StreamProfile
from kvscope.agent.analyses.whatif.report import measured_ttft

COLOURS = {"G1": "#1b9e77", "G2": "#7570b3", "G3": "#d95f02", "G4": "#e7298a", "computed": "#bdbdbd"}
SWEEP = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 8.0)  # multiples of today's size


def _x(profile: StreamProfile, blocks: int) -> float:
    if profile.bytes_per_token > 0:
        return blocks * profile.block_tokens * profile.bytes_per_token / 2**30
    return float(blocks)


def draw(profile: StreamProfile, tier: str, sweep: Sequence[Prediction], asked: Prediction | None,
         path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    i = TIERS.index(tier)
    points = sorted(sweep, key=lambda p: p.blocks[i])
    xs = [_x(profile, p.blocks[i]) for p in points]
    unit = "GiB" if profile.bytes_per_token > 0 else "blocks"
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    bottom = [0.0] * len(points)
    for k, name in enumerate(TIERS):
        share = [100 * (0.0 if math.isnan(p.shares[k]) else p.shares[k]) for p in points]
        if any(share):
            left.fill_between(xs, bottom, [b + s for b, s in zip(bottom, share, strict=True)], label=f"{name} hits",
                              color=COLOURS[name], alpha=0.85, step=None)
            bottom = [b + s for b, s in zip(bottom, share, strict=True)]
    left.fill_between(xs, bottom, [100.0] * len(points), label="computed", color=COLOURS["computed"], alpha=0.6)
    left.set_ylim(0, 100)
    left.set_ylabel("share of looked-up tokens (%)")
    left.set_title(f"Where prompt tokens come from, {tier} size varied")
    ttft = [(x, p.ttft) for x, p in zip(xs, points, strict=True) if p.ttft is not None]
    if ttft:
        right.plot([x for x, _ in ttft], [1000 * t.mean for _, t in ttft], "o-", label="TTFT mean (predicted)",
                   color="#386cb0")
        right.plot([x for x, _ in ttft], [1000 * t.p50 for _, t in ttft], "s--", label="TTFT p50 (predicted)",
                   color="#7fc97f")
        mean, _ = measured_ttft(profile)
        today = profile.today[i] or 0
        if mean is not None:
            right.plot([_x(profile, today)], [1000 * mean], "k*", markersize=12, label="TTFT mean measured today")
        confidence = next((p.confidence for p in points if p.confidence), "")
        right.set_title(f"TTFT against {tier} size ({confidence} confidence cost model)")
    else:
        right.text(0.5, 0.5, "no TTFT prediction:\n" + "\n".join(points[0].notes[:2]), ha="center", va="center",
                   transform=right.transAxes, wrap=True)
        right.set_title(f"TTFT against {tier} size")
    right.set_ylabel("TTFT (ms)")
    for ax in (left, right):
        ax.set_xlabel(f"{tier} size ({unit})")
        ax.axvline(_x(profile, profile.today[i] or 0), color="black", linestyle=":", label="today")
        if asked is not None:
            ax.axvline(_x(profile, asked.blocks[i]), color="red", linestyle="--", label=f"asked: {asked.scenario.name}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.suptitle(f"kvscope what-if: {profile.model} ({profile.engine}, dp_rank {profile.dp_rank})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
