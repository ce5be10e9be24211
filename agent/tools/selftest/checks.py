"""Truth against measurement: the same figures from both sides, compared with stated tolerances.

`truth_figures` reads the engine's side of a RunCapture, `measured_figures` the agent's (its /metrics
exposition and the correlation engine's per-request lines); `compare` is a pure function of the two,
so a test can feed it a doctored truth and watch the verdict fail.

Tolerances, and why:
- counts (tokens, bytes, blocks, requests): exact. Both sides count the same integers; the agent
  carries them as floats, which are exact below 2^53. Used bytes per tier too: the agent multiplies
  its resident blocks by the events' block_size and its configured kv_bytes_per_token, the engine its
  resident blocks by its block bytes (block_tokens × the geometry's bytes per token).
- TTFT sum: relative 1e-9. The engine observes each TTFT into vLLM's histogram (a float sum), the
  exposition prints it exactly (Go's shortest repr), and the store adds differences of cumulative sums
  once per scrape: each addition can round by one ulp (~1e-16 relative), so even 10^4 scrapes stay
  below 1e-12. A real loss (a missed request) is at least one TTFT, orders of magnitude above.
- TTFT components: shares of the aggregate within 5 percentage points (correlation.md §6). The agent
  gets fetch from transfer seconds, which leave out bookkeeping between the hops, offload from the
  engine's store timer (G1 → G2), and sees the engine's own "other" inside the prefill phase
  (lookup, publishing events, a descheduled thread) only as GPU idle time in the device slot's samples.
- per request: fetch and prefill each within 10 % of the request's TTFT, for ≥ 90 % of requests.
- prefill saved: within 10 % of the truth. The agent fits its cost model on measured phases; the
  engine knows each request's recompute cost from its own model.
- prefill saved per tier: within 10 % of the truth, for each tier that holds at least TIER_SHARE_CHECKED of the
  saved seconds (smaller ones are reported). The engine knows each request's tokens and fetch seconds per
  tier; the agent has only its counters' mix over all requests (docs/value.md has the split both use).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from kvscope.agent.core.records import COMPONENTS
from kvscope.agent.core.tiers import STORAGE_TIERS
from kvscope.agent.tools.reference.truth import RequestTruth
from kvscope.agent.tools.selftest.harness import ENGINE_KIND, RunCapture

SHARE_PP = 5.0
# fetch intervals are placed from each span's phase lengths (correlation.md §5); 10 % as per request
STALL_RELATIVE = 0.10
REQUEST_FRACTION_OF_TTFT = 0.10
REQUESTS_WITHIN = 0.90
SAVED_RELATIVE = 0.10
TIER_SHARE_CHECKED = 0.10
SUM_RELATIVE = 1e-9


@dataclass
class Figures:
    """One side's view of a run; the same shape for truth and measurement."""

    hit_tokens: dict[str, float] = field(default_factory=dict)  # tier -> tokens
    link_bytes: dict[str, float] = field(default_factory=dict)  # "src->dst" -> bytes
    resident_blocks: dict[str, float] = field(default_factory=dict)  # tier -> blocks (NaN: not exported)
    used_bytes: dict[str, float] = field(default_factory=dict)  # tier -> bytes (absent: not exported)
    requests: float = 0.0
    ttft_count: float = 0.0
    ttft_sum: float = 0.0
    lookup_tokens: float = 0.0
    computed_tokens: float = 0.0
    components: dict[str, float] = field(default_factory=dict)  # seconds summed over requests
    # id -> ttft, fetch, prefill, offload
    per_request: dict[str, tuple[float, float, float, float]] = field(default_factory=dict)
    prefill_saved: float = 0.0  # net seconds (saved − lost) over requests that reused tokens
    saved_by_tier: dict[str, float] = field(default_factory=dict)  # the same, by the tier that served the reuse
    fetch_stall: float = 0.0  # device idle while a request fetched and none computed, seconds


@dataclass(frozen=True, slots=True)
class Check:
    run: str
    quantity: str
    truth: float
    measured: float
    error: float
    tolerance: str
    passed: bool

    def as_dict(self) -> dict[str, Any]:
        def num(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {"run": self.run, "quantity": self.quantity, "truth": num(self.truth),
                "measured": num(self.measured), "error": num(self.error), "tolerance": self.tolerance,
                "passed": self.passed}


def truth_figures(run: RunCapture) -> Figures:
    f = Figures()
    for t in run.truths:
        for tier, tokens in t.tokens_by_tier.items():
            f.hit_tokens[tier] = f.hit_tokens.get(tier, 0.0) + tokens
        f.ttft_sum += t.ttft_s
        f.lookup_tokens += t.prompt_tokens
        f.computed_tokens += t.computed_tokens
        for name, seconds in t.components().items():
            f.components[name] = f.components.get(name, 0.0) + seconds
        f.per_request[t.request_id] = (t.ttft_s, t.fetch_total_s, t.prefill_compute_s, t.offload_s)
        if t.tokens_by_tier:
            f.prefill_saved += t.recompute_s - (t.prefill_compute_s + t.fetch_total_s)
            for tier, seconds in saved_by_tier(t).items():
                f.saved_by_tier[tier] = f.saved_by_tier.get(tier, 0.0) + seconds
        # one device loop fetches synchronously, then computes: the device is idle for every fetch
        f.fetch_stall += t.fetch_total_s
    f.requests = f.ttft_count = float(len(run.truths))
    f.link_bytes = {k: float(v) for k, v in run.link_bytes.items()}
    f.resident_blocks = {k: float(v) for k, v in run.resident.items()}
    block_bytes = run.config.geometry.block_bytes(run.block_tokens)  # the engine's own block size in bytes
    f.used_bytes = {k: float(v * block_bytes) for k, v in run.resident.items()}
    return f


def saved_by_tier(t: RequestTruth) -> dict[str, float]:
    """The engine's own split of a request's saved seconds: compute avoided by its tokens per tier, less each
    tier's fetch seconds."""
    reused = sum(t.tokens_by_tier.values())
    avoided = t.recompute_s - t.prefill_compute_s
    out = {tier: avoided * n / reused for tier, n in t.tokens_by_tier.items()} if reused else {}
    for tier, seconds in t.fetch_s.items():
        out[tier] = out.get(tier, 0.0) - seconds
    return out


def engine_samples(exposition: str) -> Iterable[tuple[str, dict[str, str], float]]:
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            if s.labels.get("engine", ENGINE_KIND) == ENGINE_KIND:
                yield s.name, s.labels, float(s.value)


def measured_figures(run: RunCapture) -> Figures:
    f = Figures()
    f.resident_blocks = {str(t): math.nan for t in STORAGE_TIERS}  # absent = residency not known
    estimated: set[str] = set()  # tiers whose residency is an estimate after lost batches: not a measurement
    saved = lost = 0.0
    for name, labels, value in engine_samples(run.exposition):
        if name == "kvscope_kv_hit_tokens_total":
            f.hit_tokens[labels["tier"]] = f.hit_tokens.get(labels["tier"], 0.0) + value
        elif name == "kvscope_kv_transfer_bytes_total":
            link = f"{labels['src']}->{labels['dst']}"
            f.link_bytes[link] = f.link_bytes.get(link, 0.0) + value
        elif name == "kvscope_kv_resident_blocks":
            f.resident_blocks[labels["tier"]] = value
        elif name == "kvscope_tier_used_bytes":
            f.used_bytes[labels["tier"]] = value
        elif name == "kvscope_kv_residency_known" and value == 0:
            estimated.add(labels["tier"])
        elif name == "kvscope_ttft_seconds_count":
            f.ttft_count += value
        elif name == "kvscope_ttft_seconds_sum":
            f.ttft_sum += value
        elif name == "kvscope_kv_lookup_tokens_total":
            f.lookup_tokens += value
        elif name == "kvscope_kv_computed_tokens_total":
            f.computed_tokens += value
        elif name == "kvscope_ttft_attributed_seconds_total":
            c = labels["component"]
            f.components[c] = f.components.get(c, 0.0) + value
        elif name == "kvscope_requests_attributed_total":
            f.requests += value
        elif name == "kvscope_prefill_saved_seconds_total":
            saved += value
        elif name == "kvscope_prefill_lost_seconds_total":
            lost += value
        elif name == "kvscope_gpu_fetch_stall_seconds_total":
            f.fetch_stall += value
        elif name in ("kvscope_tier_prefill_saved_seconds_total", "kvscope_tier_prefill_lost_seconds_total"):
            sign = 1.0 if "saved" in name else -1.0
            f.saved_by_tier[labels["tier"]] = f.saved_by_tier.get(labels["tier"], 0.0) + sign * value
    f.prefill_saved = saved - lost
    for tier in estimated:
        f.resident_blocks[tier] = math.nan
        f.used_bytes.pop(tier, None)
    for line in run.requests:
        parts = line.get("components", {})

        def seconds(component: str, parts: dict[str, Any] = parts) -> float:
            value = (parts.get(component) or {}).get("seconds")
            return math.nan if value is None else float(value)

        f.per_request[str(line["request_id"])] = (float(line["ttft"]), seconds("fetch"), seconds("prefill"),
                                                  seconds("offload") if "offload" in parts else 0.0)
    return f


def _exact(run: str, quantity: str, truth: float, measured: float) -> Check:
    error = measured - truth
    return Check(run, quantity, truth, measured, error, "exact", error == 0)


def compare(run: str, truth: Figures, measured: Figures) -> list[Check]:
    out: list[Check] = []
    for tier in sorted(set(truth.hit_tokens) | set(measured.hit_tokens)):
        t, m = truth.hit_tokens.get(tier, 0.0), measured.hit_tokens.get(tier, 0.0)
        if t or m:
            out.append(_exact(run, f"hit tokens {tier}", t, m))
    for link in sorted(set(truth.link_bytes) | set(measured.link_bytes)):
        t, m = truth.link_bytes.get(link, 0.0), measured.link_bytes.get(link, 0.0)
        if t or m:
            out.append(_exact(run, f"bytes {link}", t, m))
    for tier in sorted(truth.resident_blocks):
        out.append(_exact(run, f"resident blocks {tier}", truth.resident_blocks[tier],
                          measured.resident_blocks.get(tier, math.nan)))
    out.extend(_used_bytes(run, truth, measured))
    out.append(_exact(run, "requests attributed (spans)", truth.requests, measured.requests))
    out.append(_exact(run, "TTFT count", truth.ttft_count, measured.ttft_count))
    rel = (measured.ttft_sum - truth.ttft_sum) / truth.ttft_sum if truth.ttft_sum else measured.ttft_sum
    out.append(Check(run, "TTFT sum s", truth.ttft_sum, measured.ttft_sum, rel, f"rel {SUM_RELATIVE:g}",
                     abs(rel) <= SUM_RELATIVE))
    out.append(_exact(run, "lookup tokens", truth.lookup_tokens, measured.lookup_tokens))
    out.append(_exact(run, "computed tokens", truth.computed_tokens, measured.computed_tokens))
    out.extend(_shares(run, truth, measured))
    out.extend(_per_request(run, truth, measured))
    t, m = truth.prefill_saved, measured.prefill_saved
    err = (m - t) / abs(t) if t else (0.0 if m == 0 else math.inf)
    out.append(Check(run, "prefill saved s (net)", t, m, err, f"rel {SAVED_RELATIVE:g}", abs(err) <= SAVED_RELATIVE))
    out.extend(_saved_by_tier(run, truth, measured))
    t, m = truth.fetch_stall, measured.fetch_stall
    err = (m - t) / t if t else (0.0 if m == 0 else math.inf)
    out.append(Check(run, "GPU fetch stall s (device slot)", t, m, err, f"rel {STALL_RELATIVE:g}",
                     abs(err) <= STALL_RELATIVE))
    return out


def _saved_by_tier(run: str, truth: Figures, measured: Figures) -> list[Check]:
    """Net saved seconds per tier: within SAVED_RELATIVE where the tier holds TIER_SHARE_CHECKED of the saved
    seconds by either side's count, reported below that."""
    scale = sum(abs(v) for v in truth.saved_by_tier.values())
    out = []
    for tier in sorted(set(truth.saved_by_tier) | set(measured.saved_by_tier)):
        t, m = truth.saved_by_tier.get(tier, 0.0), measured.saved_by_tier.get(tier, 0.0)
        err = (m - t) / abs(t) if t else (0.0 if m == 0 else math.inf)
        checked = scale > 0 and max(abs(t), abs(m)) >= TIER_SHARE_CHECKED * scale
        out.append(Check(run, f"prefill saved s (net) {tier}", t, m, err,
                         f"rel {SAVED_RELATIVE:g}" if checked else "reported (under 10 % of the saved seconds)",
                         abs(err) <= SAVED_RELATIVE or not checked))
    return out


def _used_bytes(run: str, truth: Figures, measured: Figures) -> list[Check]:
    """Per tier, exact; an absent tier is a miss (the harness configures kv_bytes_per_token, so the agent
    has every factor it needs)."""
    return [_exact(run, f"used bytes {tier}", truth.used_bytes[tier], measured.used_bytes.get(tier, math.nan))
            for tier in sorted(truth.used_bytes)]


def shares(components: dict[str, float]) -> dict[str, float]:
    total = sum(components.get(c, 0.0) for c in COMPONENTS)
    return {c: 100.0 * components.get(c, 0.0) / total if total > 0 else math.nan for c in COMPONENTS}


def _shares(run: str, truth: Figures, measured: Figures) -> list[Check]:
    ts, ms = shares(truth.components), shares(measured.components)
    out = []
    for c in COMPONENTS:
        err = ms[c] - ts[c]
        out.append(Check(run, f"TTFT share {c} %", ts[c], ms[c], err, f"±{SHARE_PP:g} pp",
                         abs(err) <= SHARE_PP))
    return out


def _per_request(run: str, truth: Figures, measured: Figures) -> list[Check]:
    """Fraction of requests whose fetch (prefill, offload) the agent got within 10 % of their TTFT."""
    out = []
    for index, name in ((1, "fetch"), (2, "prefill"), (3, "offload")):
        good, worst = 0, 0.0
        for rid, values in truth.per_request.items():
            got = measured.per_request.get(rid)
            error = math.inf if got is None or math.isnan(got[index]) else abs(got[index] - values[index]) / values[0]
            worst = max(worst, error)
            good += error <= REQUEST_FRACTION_OF_TTFT
        n = len(truth.per_request)
        fraction = good / n if n else math.nan
        out.append(Check(run, f"requests with {name} within 10% of TTFT", 1.0, fraction, worst,
                         f"≥ {REQUESTS_WITHIN:.0%} of requests (error: worst, in TTFT)",
                         n > 0 and fraction >= REQUESTS_WITHIN))
    return out


def check_run(run: RunCapture) -> list[Check]:
    return compare(run.label, truth_figures(run), measured_figures(run))


def telemetry_checks(run: RunCapture) -> list[Check]:
    """What the agent read from the engine, which must be exact: hits, bytes, residency, used bytes, requests,
    TTFT count and sum, lookups. Not the correlation engine's attribution tolerances (shares, per request,
    prefill saved, fetch stall), which the scenarios built for them hold it to."""
    return [c for c in check_run(run) if c.tolerance in ("exact", f"rel {SUM_RELATIVE:g}")]


# what the agent's default [analyses.correlation] fit_min_spread requires of the prompt lengths
MIN_SPREAD = 2.0


def confidence_checks(run: RunCapture) -> list[Check]:
    """For a run whose prompt lengths span less than MIN_SPREAD: the agent's cost model must say it is not
    confident (kvscope_prefill_cost_confident 0), and every counterfactual second must be labelled low."""
    prompts = [t.prompt_tokens for t in run.truths]
    spread = max(prompts) / min(prompts) if prompts else math.nan
    confident = math.nan
    low = high = 0.0
    for name, labels, value in engine_samples(run.exposition):
        if name == "kvscope_prefill_cost_confident":
            confident = value
        elif name in ("kvscope_prefill_saved_seconds_total", "kvscope_prefill_lost_seconds_total"):
            if labels.get("confidence") == "low":
                low += value
            else:
                high += value
    narrow = spread < MIN_SPREAD
    out = [Check(run.label, f"cost model confident (prompts span {spread:.2f}x)", 0.0 if narrow else 1.0,
                 confident, confident - (0.0 if narrow else 1.0), f"0 below a {MIN_SPREAD:g}x spread",
                 not narrow or confident == 0.0)]
    share = low / (low + high) if low + high > 0 else math.nan
    out.append(Check(run.label, "counterfactual seconds labelled low-confidence", 1.0 if narrow else 0.0, share,
                     share - (1.0 if narrow else 0.0), "all of them, below the spread", not narrow or share == 1.0))
    return out
