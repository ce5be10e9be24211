"""The report as Markdown and JSON (pure: a Report in, text out).

Numbers are rounded to what they can say: in the JSON every float to 6 significant digits (a TTFT sum of
6.319828992000001 s is 6.31983), in the Markdown to the unit's useful precision (ms to 0.1, shares to 0.1 %,
GB to the MB).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from kvscope.agent.analyses.whatif.sizes import fmt_bytes
from kvscope.agent.tools.analyze.inputs import COMPONENTS
from kvscope.agent.tools.analyze.report import Counterfactuals, Report, Split

SIGNIFICANT = 6


def _num(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.{SIGNIFICANT}g}") if math.isfinite(value) else None
    return value


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return _num(value)


def to_json(report: Report) -> str:
    data = dataclasses.asdict(report)
    if report.counterfactuals is not None:
        data["counterfactuals"]["speedup"] = report.counterfactuals.speedup
    return json.dumps(_clean(data), indent=1) + "\n"


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None or not math.isfinite(seconds) else f"{seconds * 1e3:.1f}"


def _gb(n: float) -> str:
    return f"{n / 1e9:.3f}"


def _fixed(value: float | None, digits: int) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:,.{digits}f}"


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


def _summary(r: Report) -> list[str]:
    a = r.aiperf
    return ["| figure | kvscope analyze | AIPerf |", "|---|---|---|",
            f"| requests | {r.requests} | {_fixed(a.get('request_count.avg'), 0)} |",
            f"| duration s | {r.duration_s:.3f} | {_fixed(a.get('benchmark_duration.avg'), 3)} |",
            f"| RPS | {r.rps:.3f} | {_fixed(a.get('request_throughput.avg'), 3)} |",
            f"| TTFT mean ms | {_ms(r.ttft_mean)} | {_fixed(a.get('time_to_first_token.avg'), 1)} |",
            f"| TTFT p50 ms | {_ms(r.ttft_p50)} | {_fixed(a.get('time_to_first_token.p50'), 1)} |",
            f"| TTFT p90 ms | {_ms(r.ttft_p90)} | {_fixed(a.get('time_to_first_token.p90'), 1)} |",
            f"| prompt tokens (cached) | {r.prompt_tokens:,} ({r.cached_tokens:,}, "
            f"{r.cached_tokens / r.prompt_tokens if r.prompt_tokens else 0:.1%}) | |", ""]


def _cache_and_links(r: Report) -> list[str]:
    if not (r.hits or r.links):
        return []
    out = [f"## Cache and links (engine /metrics as AIPerf scraped it, {r.server_source}, growth over the run)", ""]
    if r.lookup_tokens is not None:
        out += [f"Looked-up tokens {r.lookup_tokens:,.0f}; computed {r.computed_tokens or 0:,.0f}.", ""]
    out += ["| tier | hit tokens | share of lookups |", "|---|---|---|"]
    for tier, tokens in sorted(r.hits.items()):
        share = tokens / r.lookup_tokens if r.lookup_tokens else 0.0
        out.append(f"| {tier} | {tokens:,.0f} | {share:.1%} |")
    out += ["", "| link | GB | seconds | GB/s |", "|---|---|---|---|"]
    for link, v in sorted(r.links.items()):
        if v["bytes"] or v["seconds"]:
            out.append(f"| {link} | {_gb(v['bytes'])} | {v['seconds']:.3f} | {v['bytes_per_second'] / 1e9:.2f} |")
    return [*out, ""]


def _counterfactuals(c: Counterfactuals) -> list[str]:
    caveat = {"high": "the agent's cost model was fitted with its coefficients pinned down",
              "low": "LOW CONFIDENCE: the agent's cost model could not pin down its coefficients (too little spread "
                     "in prompt lengths, or too few requests) and used its prior's shape scaled to the data",
              "mixed": f"MIXED CONFIDENCE: {c.low_confidence_requests} of {c.requests} came from the cost model's "
                       "prior, before it could pin down its coefficients"}[c.confidence]
    return ["## What the cache changed (the agent's counterfactuals, from the recording)", "",
            f"Over {c.requests} requests: prefill time saved (recompute estimate − prefill − fetch) "
            f"**{c.prefill_saved:.3f} s** net; TTFT summed {c.ttft_with:.3f} s with the cache against "
            f"{c.ttft_without:.3f} s estimated without it (**{c.speedup:.2f}×**). Confidence: {caveat}.", ""]


def _value(r: Report) -> list[str]:
    if not (r.saved_per_hour or r.marginal):
        return []
    out = ["## What the cache was worth", ""]
    if r.saved_per_hour:
        out += ["*GPU time saved per hour* = the prefill seconds the agent's cost model says each request saved "
                "(recompute estimate − prefill − fetch), split by the tier that served its reused tokens and the "
                "tier its fetch read from as the engine's counters divide them over the run, over the run's "
                "duration, per hour (negative: the tier cost time).", "",
                "| tier | GPU-seconds saved per hour |", "|---|---|",
                *[f"| {tier} | {value:,.1f} |" for tier, value in r.saved_per_hour.items()], ""]
        if "G4" in r.saved_per_hour:
            out += [f"**G4 saved {r.saved_per_hour['G4']:,.1f} GPU-seconds of prefill per hour at this run's "
                    "rate.**", ""]
    if r.marginal:
        out += ["*Marginal value of a tier's size* = what the what-if replay of the run's profile predicts the "
                "tier at twice its size would save (next), or its last half saves today (last), less today's, "
                f"per request, at this run's rate ({r.rps:.3f} requests/s).", "",
                "| tier | step | size change | GPU-ms per request | GPU-s per hour | confidence |",
                "|---|---|---|---|---|---|",
                *[f"| {m['tier']} | {m['step']} | {_size(m)} | {1000 * m['per_request']:+,.2f} | "
                  f"{m['per_hour']:+,.1f} | {m['confidence']} |" for m in r.marginal], ""]
    return out


def _size(m: dict[str, Any]) -> str:
    return fmt_bytes(m["size_change"]) if m["size_change"] is not None else f"{m['blocks_change']:,} blocks"


def _baseline(r: Report) -> list[str]:
    if r.baseline is None:
        return []
    cmp = r.baseline
    out = ["## Against the baseline", "", f"Baseline: {cmp.baseline_dir}", ""]
    if cmp.warnings:
        out += ["**The two runs are not the same workload; read the speed-ups with that in mind:**", "",
                *[f"- {w}" for w in cmp.warnings], ""]
    out += ["| figure | this run | baseline | speed-up |", "|---|---|---|---|",
            f"| RPS | {r.rps:.3f} | {cmp.baseline_rps:.3f} | {cmp.rps_speedup:.2f}x |",
            f"| TTFT mean ms | {_ms(r.ttft_mean)} | {_ms(cmp.baseline_ttft_mean)} | {cmp.ttft_speedup:.2f}x |",
            f"| duration | | | {cmp.duration_speedup:.2f}x |"]
    out += [f"| TTFT {low:,}–{high - 1:,} tokens | | | {ratio:.2f}x |" for low, high, ratio in cmp.by_length]
    return [*out, ""]


def to_markdown(r: Report, charts: list[str] | None = None) -> str:
    out = [f"# kvscope analyze: {r.directory}", "", *_summary(r)]
    if r.skipped:
        out += [f"{r.skipped} records not counted (warm-up phase, cancelled, failed or without a first token).", ""]
    out += ["## TTFT by prompt length", "", "| prompt tokens | requests | mean ms | p50 ms | p90 ms | cold (mean ms) "
            "| warm (mean ms) |", "|---|---|---|---|---|---|---|"]
    for b in r.bins:
        out.append(f"| {b.low:,}–{b.high - 1:,} | {b.requests} | {_ms(b.ttft_mean)} | {_ms(b.ttft_p50)} | "
                   f"{_ms(b.ttft_p90)} | {b.cold} ({_ms(b.cold_ttft_mean)}) | {b.warm} ({_ms(b.warm_ttft_mean)}) |")
    out += ["", *_cache_and_links(r)]
    for split, title in ((r.server_split, "aggregate, from the engine's histograms"),
                         (r.split, "per request, from the kvscope recording")):
        if split is not None:
            out += [f"## TTFT split ({title})", "",
                    f"{split.requests:.0f} requests, TTFT {_ms(split.ttft / split.requests if split.requests else 0)} "
                    "ms mean.", "", "| component | ms per request | share | method |", "|---|---|---|---|",
                    *_split_rows(split), ""]
    if r.per_request:
        out += ["### Per request", "", "| request | prompt | cached | TTFT ms | " + " | ".join(COMPONENTS) + " |",
                "|---|---|---|---|" + "---|" * len(COMPONENTS)]
        for p in r.per_request:
            out.append(f"| {p['request_id'][:18]} | {p['prompt_tokens']} | {p['cached_tokens']} | {_ms(p['ttft'])} | "
                       + " | ".join(_ms(p[k]) for k in COMPONENTS) + " |")
        out.append("")
    if r.counterfactuals is not None:
        out += _counterfactuals(r.counterfactuals)
    out += _value(r)
    out += _baseline(r)
    if charts:
        out += ["## Charts", ""] + [f"![{name}]({name})" for name in charts] + [""]
    if r.notes:
        out += ["## Notes", ""] + [f"- {n}" for n in r.notes] + [""]
    return "\n".join(out)
