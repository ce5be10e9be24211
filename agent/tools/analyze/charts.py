"""PNG charts of a Report (matplotlib, Agg backend: no display needed). matplotlib is in the `reference` extra.

Every chart has a legend, and a chart is drawn only with data for every panel it has: the split without a
recording is one panel (the aggregate shares), the link chart needs the JSONL time series.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvscope.agent.tools.analyze.inputs import COMPONENTS
from kvscope.agent.tools.analyze.report import Report

COLOURS = {"frontend": "#6b8e23", "queue": "#9e9e9e", "fetch": "#e4572e",
           "offload": "#8e6cbe", "prefill": "#2e86ab", "other": "#f3a712"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def ttft_by_length(report: Report, baseline: Report | None = None) -> Any:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    cold = [(n, t * 1e3) for n, t, share in report.scatter if share == 0]
    warm = [(n, t * 1e3, share) for n, t, share in report.scatter if share > 0]
    if cold:
        ax.scatter(*zip(*cold, strict=True), s=16, c="#2e86ab", label="cold (no cached tokens)")
    if warm:
        points = ax.scatter([w[0] for w in warm], [w[1] for w in warm], s=16, c=[w[2] for w in warm],
                            cmap="autumn_r", vmin=0, vmax=1, label="warm (colour: cached share)")
        fig.colorbar(points, ax=ax, label="cached share of the prompt")
    if baseline is not None:
        ax.scatter([n for n, _, _ in baseline.scatter], [t * 1e3 for _, t, _ in baseline.scatter], s=10,
                   marker="x", c="#555555", label="baseline (recompute)")
    for i, b in enumerate(report.bins):  # a segment over the prompts each bin holds
        inside = [n for n, _, _ in report.scatter if b.low <= n < b.high]
        ax.hlines(b.ttft_mean * 1e3, min(inside), max(inside), colors="k", linestyles="--", lw=1,
                  label="mean per power-of-two length bin" if i == 0 else None)
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("TTFT (ms, client side)")
    ax.set_title("TTFT by prompt length")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    return fig


def _shares(ax: Any, report: Report) -> None:
    """Stacked shares of TTFT, one bar per split there is (server histograms, recording), with a legend."""
    splits = [s for s in (report.server_split, report.split) if s is not None]
    for i, split in enumerate(splits):
        bottom = 0.0
        for k in COMPONENTS:
            share = 100 * split.components.get(k, 0.0) / split.ttft if split.ttft else 0.0
            ax.bar(i, share, bottom=bottom, color=COLOURS[k], width=0.6, label=k if i == 0 else None)
            if share >= 4:
                ax.text(i, bottom + share / 2, f"{share:.0f}%", ha="center", va="center", fontsize=7)
            bottom += share
    ax.set_xticks(range(len(splits)), ["server\nhistograms" if s.source == "server metrics" else "kvscope\nrecording"
                                       for s in splits], fontsize=7)
    ax.set_xlim(-0.6, len(splits) - 0.4 + (1.2 if len(splits) == 1 else 0.8))
    ax.set_ylim(0, 100)
    ax.set_ylabel("% of TTFT")
    ax.set_title("TTFT split, all requests", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")


def ttft_split(report: Report) -> Any:
    """Per-request stacked bars (with a recording) beside the aggregate shares; the shares alone without one."""
    plt = _pyplot()
    rows = report.per_request
    if rows:
        fig, (ax, agg) = plt.subplots(1, 2, figsize=(10, 4.2), dpi=110, gridspec_kw={"width_ratios": [3, 1.3]})
        x = list(range(len(rows)))
        bottom = [0.0] * len(rows)
        for k in COMPONENTS:
            heights = [(p[k] or 0.0) * 1e3 for p in rows]
            ax.bar(x, heights, bottom=bottom, color=COLOURS[k], label=k, width=0.85)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        ax.set_xlabel("request (by arrival)")
        ax.set_ylabel("ms")
        ax.set_title("TTFT split per request (kvscope recording)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    else:
        fig, agg = plt.subplots(figsize=(4.5, 4.2), dpi=110)
    _shares(agg, report)
    return fig


def link_bytes(report: Report) -> Any:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.8), dpi=110)
    links = sorted({k for _, v in report.timeline for k, b in v.items() if b > 0})
    for link in links:
        ax.step([t for t, _ in report.timeline], [v.get(link, 0.0) / 1e9 for _, v in report.timeline],
                where="post", label=link)
    ax.set_xlabel("seconds since the first request")
    ax.set_ylabel("GB moved (cumulative)")
    ax.set_title("KV bytes per link (engine /metrics, AIPerf's scrapes)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def write_charts(report: Report, out: Path, baseline: Report | None = None) -> list[str]:
    """The PNG files written into `out` (names relative to it); [] when matplotlib is missing."""
    try:
        _pyplot()
    except ImportError:
        return []
    plt = _pyplot()
    written = []
    for name, fig in figures(report, baseline).items():
        fig.tight_layout()
        fig.savefig(out / name)
        plt.close(fig)
        written.append(name)
    return written


def figures(report: Report, baseline: Report | None = None) -> dict[str, Any]:
    """The charts there is data for, by file name (matplotlib figures, not yet saved)."""
    out = {"ttft_by_prompt_length.png": ttft_by_length(report, baseline)}
    if report.server_split is not None or report.split is not None:
        out["ttft_split.png"] = ttft_split(report)
    if any(b > 0 for _, links in report.timeline for b in links.values()):
        out["link_bytes.png"] = link_bytes(report)
    return out
