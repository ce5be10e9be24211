"""The demo's PNG, one figure read at a glance: TTFT against prompt length with its split (recomputed vs KV
fetched from G4), fetch bandwidth against break-even, and throughput with and without the cache.

matplotlib (the `reference` extra) with the Agg backend, imported here only, so nothing else pays for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvscope.agent.core.records import COMPONENTS
from kvscope.agent.tools.selftest.demo_figures import Sweep, Throughput

COLOURS = {"frontend": "#6b8e23", "queue": "#9e9e9e", "fetch": "#1f77b4",
           "offload": "#9467bd", "prefill": "#ff7f0e", "other": "#d4c35a"}


def _ttft_split(ax: Any, sweep: Sweep) -> None:
    width = 0.38
    for offset, kind, hatch in ((-width / 2, "recompute", "//"), (width / 2, "warm", "")):
        bottom = [0.0] * len(sweep.points)
        for c in COMPONENTS:
            heights = [p.split[kind][c] for p in sweep.points]
            ax.bar([i + offset for i in range(len(sweep.points))], heights, width, bottom=bottom, color=COLOURS[c],
                   hatch=hatch, edgecolor="white", linewidth=0.5, label=c if kind == "warm" else None)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    for i, p in enumerate(sweep.points):
        ax.annotate(f"{p.speedup:.1f}×", (i + width / 2, p.warm_s), textcoords="offset points", xytext=(0, 3),
                    ha="center", fontsize=8, fontweight="bold")
    ax.bar([0], [0], color="white", edgecolor="#555555", hatch="//", label="left bar: recomputed")
    ax.bar([0], [0], color="white", edgecolor="#555555", label="right bar: KV from G4 (speed-up above)")
    ax.set_xticks(range(len(sweep.points)), [f"{p.tokens:,}" for p in sweep.points])
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("time to first token (s)")
    ax.set_title("TTFT against prompt length, and where it went")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", framealpha=0.9)


def _bandwidth(ax: Any, sweep: Sweep) -> None:
    tokens = [p.tokens for p in sweep.points]
    ax.plot(tokens, [p.fetch_bandwidth / 1e9 for p in sweep.points], "o-", color="#2ca02c",
            label="measured fetch from G4")
    ax.plot(tokens, [p.breakeven_bandwidth / 1e9 for p in sweep.points], "s--", color="#d62728",
            label="break-even (slower than recompute below)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(tokens, [f"{n // 1024}k" for n in tokens])
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("GB/s")
    ax.set_ylim(bottom=0)
    ax.set_title("Fetch bandwidth against break-even")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best", framealpha=0.9)


def _throughput(ax: Any, t: Throughput) -> None:
    values = [t.recompute_rps, t.cache_rps]
    bars = ax.bar(["recompute", "G4 cache\n(cold fill included)"], values, color=["#bbbbbb", "#2ca02c"],
                  label=[f"{v:.2f} requests/s" for v in values])
    for bar, v in zip(bars, values, strict=True):
        ax.annotate(f"{v:.2f}", (bar.get_x() + bar.get_width() / 2, v), textcoords="offset points", xytext=(0, 3),
                    ha="center", fontsize=8)
    ax.set_ylabel("requests per second")
    ax.set_ylim(0, max(values) * 1.2)
    ax.set_title(f"Shared prompts: {t.speedup:.2f}× throughput")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", title=f"{t.requests} requests, {t.prompts} prompts, "
              f"{t.concurrency} at a time", title_fontsize=7)


def render(path: Path, sweep: Sweep, throughput: Throughput, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8), gridspec_kw={"width_ratios": [1.7, 1, 0.8]})
    _ttft_split(axes[0], sweep)
    _bandwidth(axes[1], sweep)
    _throughput(axes[2], throughput)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
