"""`kvscope what-if`'s answer as text and JSON: per scenario, the tier sizes, the share of looked-up tokens
each tier would serve, and TTFT; the model at today's sizes beside what the engine measured, so the
model's own error is in view (a scenario's shares are the measured ones moved by the model)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from kvscope.agent.analyses.whatif.hierarchy import TIERS
from kvscope.agent.analyses.whatif.predict import Prediction
from kvscope.agent.analyses.whatif.profile import MIN_DISTINCT_SAMPLED, StreamProfile
from kvscope.agent.analyses.whatif.sizes import fmt_bytes


def _pct(x: float) -> str:
    return "—" if math.isnan(x) else f"{100 * x:.1f}%"


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{1000 * x:.1f} ms"


def _size(profile: StreamProfile, blocks: int) -> str:
    if profile.bytes_per_token > 0:
        return fmt_bytes(blocks * profile.block_tokens * profile.bytes_per_token)
    return f"{blocks:,} blocks"


def measured_ttft(profile: StreamProfile) -> tuple[float | None, float | None]:
    ttfts = sorted(r.ttft for r in profile.requests)
    if not ttfts:
        return None, None
    return statistics.fmean(ttfts), ttfts[max(0, math.ceil(0.5 * len(ttfts)) - 1)]


def table(profile: StreamProfile, predictions: Sequence[Prediction]) -> str:
    """One line per scenario (today's model first, the engine's measurement under it)."""
    head = ["scenario", *(f"{t} size" for t in TIERS), *(f"{t} share" for t in TIERS), "computed", "TTFT mean",
            "TTFT p50", "saved/req", "confidence"]
    rows = []
    for p in predictions:
        today = p.scenario.name == "today"
        shares = p.model_shares if today else p.shares  # today: the model itself, to set against the measurement
        served = [s for s in shares if not math.isnan(s)]
        computed = 1 - sum(served) if served else math.nan
        ttft = p.ttft
        rows.append([p.scenario.name if not today else "today (model)",
                     *(_size(profile, b) for b in p.blocks), *(_pct(s) for s in shares), _pct(computed),
                     _ms(ttft.mean if ttft else None), _ms(ttft.p50 if ttft else None),
                     _ms(ttft.prefill_saved if ttft else None), p.confidence or "—"])
        if p.scenario.name == "today":
            m = profile.measured
            shares = [m.share(t) for t in TIERS]
            mean, p50 = measured_ttft(profile)
            rows.append(["today (measured)", *("" for _ in TIERS), *(_pct(s) for s in shares),
                         _pct(1 - sum(shares)) if m.lookup_tokens > 0 else "—", _ms(mean), _ms(p50), "", ""])
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths,
                                                                                              strict=True)))
             for r in [head, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def header(profile: StreamProfile) -> str:
    """What the predictions stand on, in a few lines."""
    trace = profile.counted
    lines = [f"{profile.engine} {profile.model} dp_rank {profile.dp_rank}: {trace:,} sampled block accesses "
             f"(rate {profile.sample_rate:g}: {trace / profile.sample_rate:,.0f} accesses of {profile.block_tokens} "
             f"tokens), {profile.measured.lookup_tokens:,.0f} tokens looked up, {len(profile.requests)} recent "
             f"requests; {profile.policy} tiers"]
    if profile.g1_hits_seen is not None and profile.g1_hits_seen < 0.9:
        lines.append(f"WARNING: the KV events showed {100 * profile.g1_hits_seen:.0f}% of the engine's G1 hits: "
                     "without kv_cache_report_mode=full they carry only G1 misses and these predictions do not hold")
    if profile.sample_too_small:
        lines.append(f"WARNING: the sample holds only {profile.distinct_sampled:,} distinct blocks (fewer than "
                     f"{MIN_DISTINCT_SAMPLED}): the shares below may be off by many points. Set "
                     f"[collectors.vllm_kv_events] reuse_sample_rate = {profile.rate_to_trust():.3g} and re-run")
    else:
        lines.append(f"sample: {profile.distinct_sampled:,} distinct blocks")
    if profile.dropped:
        lines.append(f"note: {profile.dropped:,} sampled accesses were dropped before the analysis read them")
    lines.extend(f"note: {n}" for n in profile.notes)
    if profile.cost is None:
        lines.append("note: no prefill cost model yet, so no TTFT (the correlation analysis fits one)")
    elif not profile.cost.confident:
        lines.append("note: the prefill cost model is low-confidence (prompts too alike to tell a from b): TTFT "
                     "uses its prior's shape, scaled")
    return "\n".join(lines) + "\n"


def notes(predictions: Sequence[Prediction]) -> str:
    seen: list[str] = []
    for p in predictions:
        for n in p.notes:
            line = f"{p.scenario.name}: {n}"
            if line not in seen:
                seen.append(line)
    return "".join(f"note: {n}\n" for n in seen)


def as_json(profile: StreamProfile, predictions: Sequence[Prediction]) -> dict[str, Any]:
    def num(x: float | None) -> float | None:
        return None if x is None or not math.isfinite(x) else round(x, 9)

    mean, p50 = measured_ttft(profile)
    return {
        "engine": profile.engine, "model": profile.model, "dp_rank": profile.dp_rank, "policy": profile.policy,
        "sample_rate": profile.sample_rate, "block_tokens": profile.block_tokens,
        "bytes_per_token": profile.bytes_per_token, "distinct_sampled_blocks": profile.distinct_sampled,
        "sample_too_small": profile.sample_too_small, "rate_to_trust": round(profile.rate_to_trust(), 9),
        "measured": {"shares": {t: num(profile.measured.share(t)) for t in TIERS}, "ttft_mean": num(mean),
                     "ttft_p50": num(p50)},
        "scenarios": [{
            "name": p.scenario.name,
            "blocks": dict(zip(TIERS, p.blocks, strict=True)),
            "bytes": {t: b * profile.block_tokens * profile.bytes_per_token if profile.bytes_per_token else None
                      for t, b in zip(TIERS, p.blocks, strict=True)},
            "shares": {t: num(s) for t, s in zip(TIERS, p.shares, strict=True)},
            "model_shares": {t: num(s) for t, s in zip(TIERS, p.model_shares, strict=True)},
            "ttft_mean": num(p.ttft.mean) if p.ttft else None, "ttft_p50": num(p.ttft.p50) if p.ttft else None,
            "prefill_saved_per_request": num(p.ttft.prefill_saved) if p.ttft else None,
            "confidence": p.confidence or None, "clamped": p.clamped, "notes": p.notes,
        } for p in predictions],
    }
