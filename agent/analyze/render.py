"""The report as Markdown and JSON (pure: a Report in, text out)."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from kvscope.agent.analyze.build import Report, Split
from kvscope.agent.analyze.inputs import COMPONENTS


def _num(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return _num(value)


def to_json(report: Report) -> str:
    return json.dumps(_clean(dataclasses.asdict(report)), indent=1) + "\n"


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None or not math.isfinite(seconds) else f"{seconds * 1e3:.1f}"


def _gb(n: float) -> str:
    return f"{n / 1e9:.3f}"


def _split_rows(split: Split) -> list[str]:
    rows = []
    for k in COMPONENTS:
        seconds = split.components.get(k)
        if seconds is None:
            continue
        share = seconds / split.ttft if split.ttft else 0.0
        per = seconds / split.requests if split.requests else 0.0
        rows.append(f"| {k} | {_ms(per)} | {share:.1%} | {split.methods.get(k, '')} |")
    return rows


def to_markdown(r: Report, charts: list[str] | None = None) -> str:
    out = [f"# kvscope analyze: {r.directory}", ""]
    out += ["| figure | kvscope analyze | AIPerf |", "|---|---|---|",
            f"| requests | {r.requests} | {r.aiperf.get('request_count.avg', '–')} |",
            f"| duration s | {r.duration_s:.3f} | {r.aiperf.get('benchmark_duration.avg', '–')} |",
            f"| RPS | {r.rps:.3f} | {r.aiperf.get('request_throughput.avg', math.nan):.3f} |",
            f"| TTFT mean ms | {_ms(r.ttft_mean)} | {r.aiperf.get('time_to_first_token.avg', math.nan):.1f} |",
            f"| TTFT p50 ms | {_ms(r.ttft_p50)} | {r.aiperf.get('time_to_first_token.p50', math.nan):.1f} |",
            f"| TTFT p90 ms | {_ms(r.ttft_p90)} | {r.aiperf.get('time_to_first_token.p90', math.nan):.1f} |",
            f"| prompt tokens (cached) | {r.prompt_tokens} ({r.cached_tokens}, "
            f"{r.cached_tokens / r.prompt_tokens if r.prompt_tokens else 0:.1%}) | |", ""]
    if r.skipped:
        out += [f"{r.skipped} records not counted (warm-up phase, cancelled, failed or without a first token).", ""]
    out += ["## TTFT by prompt length", "", "| prompt tokens | requests | mean ms | p50 ms | p90 ms | cold (mean ms) "
            "| warm (mean ms) |", "|---|---|---|---|---|---|---|"]
    for b in r.bins:
        out.append(f"| {b.low}–{b.high - 1} | {b.requests} | {_ms(b.ttft_mean)} | {_ms(b.ttft_p50)} | "
                   f"{_ms(b.ttft_p90)} | {b.cold} ({_ms(b.cold_ttft_mean)}) | {b.warm} ({_ms(b.warm_ttft_mean)}) |")
    out.append("")
    if r.hits or r.links:
        out += ["## Cache and links (engine /metrics as AIPerf scraped it, growth over the run)", ""]
        if r.lookup_tokens is not None:
            out.append(f"Looked-up tokens {r.lookup_tokens:.0f}; computed {r.computed_tokens or 0:.0f}.")
            out.append("")
        out += ["| tier | hit tokens | share of lookups |", "|---|---|---|"]
        for tier, tokens in sorted(r.hits.items()):
            share = tokens / r.lookup_tokens if r.lookup_tokens else 0.0
            out.append(f"| {tier} | {tokens:.0f} | {share:.1%} |")
        out += ["", "| link | GB | seconds | GB/s |", "|---|---|---|---|"]
        for link, v in sorted(r.links.items()):
            if v["bytes"] or v["seconds"]:
                out.append(f"| {link} | {_gb(v['bytes'])} | {v['seconds']:.3f} | {v['bytes_per_second'] / 1e9:.2f} |")
        out.append("")
    for split, title in ((r.server_split, "aggregate, from the engine's histograms"),
                         (r.split, "per request, from the kvscope recording")):
        if split is not None:
            out += [f"## TTFT split ({title})", "",
                    f"{split.requests:.0f} requests, TTFT {_ms(split.ttft / split.requests if split.requests else 0)} "
                    "ms mean.", "", "| component | ms per request | share | method |", "|---|---|---|---|",
                    *_split_rows(split), ""]
    if r.per_request:
        out += ["### Per request", "", "| request | prompt | cached | TTFT ms | queue | fetch | prefill | other |",
                "|---|---|---|---|---|---|---|---|"]
        for p in r.per_request:
            out.append(f"| {p['request_id'][:18]} | {p['prompt_tokens']} | {p['cached_tokens']} | {_ms(p['ttft'])} | "
                       + " | ".join(_ms(p[k]) for k in COMPONENTS) + " |")
        out.append("")
    if r.baseline is not None:
        cmp = r.baseline
        out += ["## Against the baseline", "", f"Baseline: {cmp.baseline_dir}", "",
                "| figure | this run | baseline | speed-up |", "|---|---|---|---|",
                f"| RPS | {r.rps:.3f} | {cmp.baseline_rps:.3f} | {cmp.rps_speedup:.2f}x |",
                f"| TTFT mean ms | {_ms(r.ttft_mean)} | {_ms(cmp.baseline_ttft_mean)} | {cmp.ttft_speedup:.2f}x |",
                f"| duration | | | {cmp.duration_speedup:.2f}x |"]
        for low, high, ratio in cmp.by_length:
            out.append(f"| TTFT {low}–{high - 1} tokens | | | {ratio:.2f}x |")
        out.append("")
    if charts:
        out += ["## Charts", ""] + [f"![{name}]({name})" for name in charts] + [""]
    if r.notes:
        out += ["## Notes", ""] + [f"- {n}" for n in r.notes] + [""]
    return "\n".join(out)
