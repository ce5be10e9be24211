"""The demo's PNG: TTFT per request (cold vs warm, against the recompute baseline) and the TTFT split.

matplotlib (the `reference` extra) with the Agg backend, imported here only, so nothing else pays for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvscope.agent.records import COMPONENTS

COLOURS = {"queue": "#9e9e9e", "fetch": "#1f77b4", "offload": "#9467bd", "prefill": "#ff7f0e", "other": "#d4c35a"}


@dataclass(frozen=True, slots=True)
class RequestPoint:
    order: int  # completion order
    ttft_ms: float
    warm: bool


def render(path: Path, cache: Sequence[RequestPoint], recompute: Sequence[RequestPoint],
           agent_shares: dict[str, float], truth_shares: dict[str, float], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [1.6, 1]})
    if recompute:
        left.plot([p.order for p in recompute], [p.ttft_ms for p in recompute], color="#bbbbbb", lw=1.5,
                  label="recompute baseline (no cache)", zorder=1)
    for warm, colour, label in ((False, "#d62728", "cold (computed)"), (True, "#2ca02c", "warm (reused KV)")):
        pts = [p for p in cache if p.warm == warm]
        left.scatter([p.order for p in pts], [p.ttft_ms for p in pts], s=22, color=colour, label=label, zorder=2)
    left.set_xlabel("request (completion order)")
    left.set_ylabel("TTFT (ms)")
    left.set_title("TTFT per request, as the agent recorded it")
    left.set_ylim(bottom=0)
    left.grid(alpha=0.3)
    left.legend(loc="lower right", fontsize=8, framealpha=0.9)

    # grouped bars with their values: queue can dwarf the rest, a stacked bar would hide fetch and other
    height = 0.38
    for offset, (name, shares, hatch) in ((-height / 2, ("agent", agent_shares, "")),
                                           (height / 2, ("truth", truth_shares, "//"))):
        ys = [i + offset for i in range(len(COMPONENTS))]
        values = [shares.get(c, 0.0) for c in COMPONENTS]
        right.barh(ys, values, height=height, color=[COLOURS[c] for c in COMPONENTS], hatch=hatch,
                   edgecolor="white", label=name)
        for y, v in zip(ys, values, strict=True):
            right.text(v + 1, y, f"{name} {v:.1f}%", va="center", fontsize=7)
    right.set_yticks(range(len(COMPONENTS)), list(COMPONENTS))
    right.invert_yaxis()
    right.set_xlim(0, 115)
    right.set_xlabel("share of TTFT (%)")
    right.set_title("Where TTFT went (cache run): agent vs truth")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
