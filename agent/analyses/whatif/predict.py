"""From replayed accesses to predictions: the share of looked-up tokens each tier serves, and TTFT.

Shares. A model of the hierarchy at a scenario's sizes serves each sampled access from a tier or not at
all (hierarchy.py). Models at today's sizes and at the scenario's are fed the same accesses, so for every
access both outcomes are known: the fraction of the tokens tier k serves today that the scenario serves
from k' (the transport T[k][k'], computed tokens included). The tokens tier k' would serve are today's, as
the engine's own counters split them over the counted period, moved by T; their share is that over the
tokens the engine looked up (partial last blocks included, which no tier ever serves). The model's own
counts (counts[k] × block_tokens / R) are kept beside: at today's sizes, against the counters, they are
the model's error. Tokens the model served from k today beyond the engine's count of k were recomputed by
the engine: where T moves k's tokens to another tier, those become hits too (the miss row, `_misread`).

TTFT. Each recent request keeps its own measured TTFT and prompt; what changes is where its prompt's
tokens come from:

    c  = its tokens by tier today: its measured reused tokens, split over G1..G4 as the engine's counters
         split them (a request source that gives no reused count, as vLLM's span: the counters' shares
         of its prompt); the rest computed
    c' = c · T
    TTFT' = TTFT + [compute(P − ctx', ctx') − compute(P − ctx, ctx)] + [fetch(c') − fetch(c)]

with compute the correlation analysis' fitted prefill cost a·new + b·new·(2·ctx + new), ctx the reused
tokens, and fetch(c) = Σ_k c_k × bytes/token × (1/BW_k + 1/BW_via) + L_k per tier fetched from, from its
measured bandwidths and latencies (a tier whose blocks pass through host memory pays that hop too).
An engine that evicts inside the request's step (the reference engine; KVBM) has measured offload in its
requests: it is scaled by the seconds the scenario's G1 evictions would spend storing blocks (into each
tier, at what a byte stored there costs today) over today's (a smaller G1 evicts more; without G2 they go to
files); an engine that stores asynchronously (vLLM's OffloadingConnector) has none. Queue and the rest stay as
measured. Prefill saved = compute(P, 0) − compute(P − ctx', ctx') − fetch(c'). The figures carry the cost
model's confidence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvscope.agent.analyses.whatif.hierarchy import MISS, OUTCOMES, TIERS, Chains, Hierarchy, scaled_capacities
from kvscope.agent.analyses.whatif.profile import Cost, Measured, RequestSample, StreamProfile, batches_of
from kvscope.agent.analyses.whatif.sizes import TODAY, Scenario

N = len(OUTCOMES)


@dataclass
class Outcomes:
    """Sampled accesses by outcome (G1..G4, miss) at a scenario's sizes, and jointly with today's."""

    counts: list[int] = field(default_factory=lambda: [0] * N)
    joint: list[list[int]] = field(default_factory=lambda: [[0] * N for _ in range(N)])  # [today][scenario]
    # blocks G1's evictions stored into each tier (index G1..G4): the offload an engine may do in the step
    stores: list[int] = field(default_factory=lambda: [0] * len(TIERS))

    def add(self, today: int, scenario: int) -> None:
        self.counts[scenario] += 1
        self.joint[today][scenario] += 1


@dataclass
class TtftPrediction:
    mean: float
    p50: float
    prefill_saved: float  # mean per request, seconds (negative: the cache costs time)
    requests: int
    samples: list[tuple[float, float]]  # (weight, predicted TTFT): each request's outcomes, weights adding to 1
    saved_samples: list[tuple[float, float]]  # (weight, prefill saved), the same outcomes


@dataclass
class Prediction:
    scenario: Scenario
    blocks: list[int]  # per tier G1..G4
    clamped: bool  # a capacity beyond what the model holds (max_blocks) was cut
    hit_tokens: list[float]  # per tier G1..G4 over the counted period: today's measured tokens, moved (anchored)
    shares: list[float]  # of the looked-up tokens, per tier G1..G4 (NaN when nothing was looked up)
    ttft: TtftPrediction | None
    confidence: str  # "high" | "low" (the cost model's), "" without a TTFT prediction
    notes: list[str] = field(default_factory=list)
    model_hit_tokens: list[float] = field(default_factory=list)  # the model's own counts × block tokens / R
    model_shares: list[float] = field(default_factory=list)  # of today: the model against the measurement


def transport(outcomes: Outcomes, measured: Measured, block_tokens: int, sample_rate: float,
              blocks: Sequence[int]) -> list[list[float]]:
    """T[k][k']: of the tokens served by k today (computed: k = MISS), the fraction the scenario serves from k'.

    A hit row is the model's own conditional frequencies (a tier the model never served from today keeps
    its tokens, or loses them to recompute when the scenario turns it off). The miss row is scaled to the
    engine's measured recomputed tokens, which include the partial last blocks the access stream never
    shows."""
    out = [[1.0 if i == j else 0.0 for j in range(N)] for i in range(N)]
    for k in range(MISS):
        row = outcomes.joint[k]
        total = sum(row)
        if total:
            out[k] = [x / total for x in row]
        elif blocks[k] <= 0:
            out[k] = [1.0 if j == MISS else 0.0 for j in range(N)]
    missed = measured.lookup_tokens - sum(measured.hit_tokens.get(t, 0.0) for t in TIERS)
    if missed > 0:
        per_access = block_tokens / sample_rate
        gained = [min(1.0, (outcomes.joint[MISS][j] * per_access + _misread(outcomes, measured, per_access, j))
                      / missed) for j in range(MISS)]
        scale = 1.0 / sum(gained) if sum(gained) > 1.0 else 1.0
        gained = [x * scale for x in gained]
        out[MISS] = [*gained, 1.0 - sum(gained)]
    return out


def _misread(outcomes: Outcomes, measured: Measured, per_access: float, j: int) -> float:
    """Tokens the engine recomputed today that the model served from another tier k (its today's count of k
    above the engine's), which the scenario serves from j: the model's row k moves them, and where it moves
    them to a tier other than k, the engine's recomputes become j's hits. Without this the miss row sees
    only the model's own misses, and a model that keeps a little more than the engine today (G3 +0.5
    points in the self-test's what-if run) under-predicts what a larger tier gains by as much."""
    out = 0.0
    for k in range(MISS):
        row = outcomes.joint[k]
        total = sum(row)
        excess = total * per_access - measured.hit_tokens.get(TIERS[k], 0.0)
        if k != j and total and excess > 0:
            out += excess * row[j] / total
    return out


def composition(measured: Measured) -> list[float]:
    """Today's looked-up tokens by outcome (G1..G4, computed), as the engine's counters give them."""
    hits = [measured.hit_tokens.get(tier, 0.0) for tier in TIERS]
    return [*hits, max(0.0, measured.lookup_tokens - sum(hits))]


def anchored(t: Sequence[Sequence[float]], measured: Measured) -> list[float]:
    """Tokens each tier would serve: today's measured tokens by tier, moved by the transport (the model's own
    today changes nothing). Sampling's largest error, which hot blocks are in the sample, falls on today's
    composition, which the engine's counters give exactly; what is left is in T's conditional frequencies."""
    now = composition(measured)
    return [sum(now[k] * t[k][j] for k in range(N)) for j in range(MISS)]


def _fetch_seconds(tokens: Sequence[float], cost: Cost, bytes_per_token: float, block_tokens: int) -> float:
    """Seconds to bring `tokens[k]` tokens from each tier k (G2..G4) to G1."""
    total = 0.0
    for k in range(1, MISS):
        n = tokens[k]
        if n <= 0:
            continue
        path = [TIERS[k]]
        via = cost.fetch[TIERS[k]].via
        if via is not None and via != TIERS[k]:
            path.append(via)
        for hop in path:
            fetch = cost.fetch[hop]
            assert fetch.bandwidth is not None
            total += n * bytes_per_token / fetch.bandwidth + fetch.latency * min(1.0, n / max(1, block_tokens))
    return total


def _missing_bandwidth(tokens: Sequence[float], cost: Cost) -> list[str]:
    """Tiers (or hops) the tokens come through whose fetch bandwidth was never measured."""
    missing: list[str] = []
    for k in range(1, MISS):
        if tokens[k] <= 0:
            continue
        fetch = cost.fetch.get(TIERS[k])
        hops = [TIERS[k]]
        if fetch is not None and fetch.via is not None and fetch.via != TIERS[k]:
            hops.append(fetch.via)
        for hop in hops:
            f = cost.fetch.get(hop)
            if (f is None or f.bandwidth is None or f.bandwidth <= 0) and hop not in missing:
                missing.append(hop)
    return missing


def predict_ttft(requests: Sequence[RequestSample], t: Sequence[Sequence[float]], measured: Measured, cost: Cost,
                 bytes_per_token: float, block_tokens: int, offload: float | None = 1.0
                 ) -> tuple[TtftPrediction | None, list[str]]:
    """TTFT, prefill saved for the scenario whose transport from today is `t` (see the module docstring);
    `offload`: the scenario's offload over today's (offload_ratio; None: not known)."""
    if not requests:
        return None, ["no recent requests with a TTFT (the correlation analysis attributes them)"]
    if measured.lookup_tokens <= 0:
        return None, ["the engine looked up no tokens in the counted period"]
    hits = composition(measured)[:MISS]
    reused = sum(hits)
    rows = []
    aggregate = [0.0] * N
    for r in requests:
        prompt = float(r.prompt_tokens)
        cached = min(prompt, float(r.cached_tokens) if r.cached_tokens is not None
                     else prompt * reused / measured.lookup_tokens)
        now = [cached * h / reused if reused > 0 else 0.0 for h in hits] + [prompt - cached]
        outcomes = _outcomes(now, t)
        rows.append((r, prompt, now, outcomes))
        for j in range(N):
            aggregate[j] = max(aggregate[j], now[j], *(c[j] for _, c in outcomes))
    if offload is None and any(r.offload for r in requests):
        return None, ["the scenario's evictions store into a tier the engine never stored into from G1 today (or "
                      "today nothing is evicted): what that adds to TTFT was never measured"]
    missing = _missing_bandwidth(aggregate, cost)
    if missing:
        return None, [f"no fetch bandwidth measured yet for {', '.join(missing)}: the engine has not fetched "
                      "from it; TTFT cannot be predicted for sizes that would"]
    samples: list[tuple[float, float]] = []  # (weight, predicted TTFT)
    saved: list[tuple[float, float]] = []
    for r, prompt, now, outcomes in rows:
        ctx = sum(now[:MISS])
        today = cost.compute(prompt - ctx, ctx) + _fetch_seconds(now, cost, bytes_per_token, block_tokens)
        offload_change = (r.offload or 0.0) * ((1.0 if offload is None else offload) - 1.0)
        for weight, then in outcomes:
            ctx2 = sum(then[:MISS])
            spent = cost.compute(prompt - ctx2, ctx2) + _fetch_seconds(then, cost, bytes_per_token, block_tokens)
            samples.append((weight, r.ttft + spent - today + offload_change))
            saved.append((weight, cost.compute(prompt, 0.0) - spent))
    total = sum(w for w, _ in samples)
    return TtftPrediction(sum(w * x for w, x in samples) / total, _weighted_median(samples),
                          sum(w * x for w, x in saved) / total, len(rows), samples, saved), []


def _outcomes(now: Sequence[float], t: Sequence[Sequence[float]]) -> list[tuple[float, list[float]]]:
    """Where a request's tokens go in the scenario, as (probability, tokens by outcome): its run from each tier
    moves as one piece (the blocks of a run were used together, so they stay or go together), spread over
    the destinations of that tier's row of T; its computed tokens spread by the miss row (most of them are
    never reusable: the part of the prompt no one else sent)."""
    base = [now[MISS] * t[MISS][j] for j in range(N)]
    out: list[tuple[float, list[float]]] = [(1.0, base)]
    for k in range(MISS):
        if now[k] <= 0:
            continue
        grown = []
        for weight, tokens in out:
            for j in range(N):
                if t[k][j] > 0:
                    moved = list(tokens)
                    moved[j] += now[k]
                    grown.append((weight * t[k][j], moved))
        out = grown
    return out


def _weighted_median(samples: Sequence[tuple[float, float]]) -> float:
    ordered = sorted(samples, key=lambda s: s[1])
    half = sum(w for w, _ in ordered) / 2
    running = 0.0
    for w, x in ordered:
        running += w
        if running >= half:
            return x
    return ordered[-1][1]


def prediction(profile: StreamProfile, scenario: Scenario, blocks: list[int], clamped: bool, outcomes: Outcomes,
               today: Outcomes) -> Prediction:
    """Shares and TTFT of one scenario from its replayed outcomes over the profile's counted period."""
    per_access = profile.block_tokens / profile.sample_rate
    model_hits = [outcomes.counts[k] * per_access for k in range(MISS)]
    lookup = profile.measured.lookup_tokens
    t = transport(outcomes, profile.measured, profile.block_tokens, profile.sample_rate, blocks)
    hit_tokens = anchored(t, profile.measured)

    def share(tokens: list[float]) -> list[float]:
        return [h / lookup if lookup > 0 else math.nan for h in tokens]

    notes = []
    if clamped:
        notes.append(f"sizes beyond what the model holds ({profile.max_blocks} sampled blocks, i.e. "
                     f"{profile.max_blocks / profile.sample_rate:,.0f} blocks) were cut: reuse farther apart than "
                     "that is not seen")
    ttft = None
    if profile.cost is None:
        notes.append("no prefill cost model yet (the correlation analysis fits one from attributed requests)")
    else:
        ttft, why = predict_ttft(profile.requests, t, profile.measured, profile.cost, profile.bytes_per_token,
                                 profile.block_tokens, offload_ratio(today, outcomes, profile.cost.store))
        notes.extend(why)
    confidence = "" if ttft is None or profile.cost is None else ("high" if profile.cost.confident else "low")
    if profile.sample_too_small:
        confidence = "low"
        notes.append(f"the sample holds {profile.distinct_sampled} distinct blocks, too few to trust "
                     f"(re-run at reuse_sample_rate {profile.rate_to_trust():.3g})")
    return Prediction(scenario, blocks, clamped, hit_tokens, share(hit_tokens), ttft, confidence, notes,
                      model_hits, share(model_hits))


def feed(today: Hierarchy, today_outcomes: Outcomes, others: Sequence[tuple[Hierarchy, Outcomes]],
         batch: list[int], chained: Sequence[bool]) -> None:
    """One engine step's accesses through today's model and every scenario's, counting outcomes jointly."""
    stored = list(today.g1_stores)
    base = today.access_batch(batch, chained)
    today_outcomes.stores = [n + now - then for n, now, then in zip(today_outcomes.stores, today.g1_stores, stored,
                                                                   strict=True)]
    for b in base:
        today_outcomes.add(b, b)
    for h, o in others:
        stored = list(h.g1_stores)
        add = o.add
        for b, outcome in zip(base, h.access_batch(batch, chained), strict=True):
            add(b, outcome)
        o.stores = [n + now - then for n, now, then in zip(o.stores, h.g1_stores, stored, strict=True)]


def offload_ratio(today: Outcomes, scenario: Outcomes, store_cost: dict[str, float | None]) -> float | None:
    """How much the scenario's offload work on the request path differs from today's: the seconds of the blocks
    G1's evictions store into each tier, weighed by what storing a byte into that tier costs today
    (`store_cost`, seconds per byte), over today's. None: the scenario stores into a tier whose cost was
    never measured, or evicts where today nothing is."""
    def seconds(o: Outcomes) -> float | None:
        total = 0.0
        for tier, n in zip(TIERS, o.stores, strict=True):
            if n:
                cost = store_cost.get(tier)
                if cost is None:
                    return None
                total += n * cost
        return total

    now, then = seconds(today), seconds(scenario)
    if now is None or then is None:
        return None
    if now <= 0:
        return 1.0 if then <= 0 else None
    return then / now


def _batches_before(profile: StreamProfile) -> int:
    """How many batches start before the counted period (the warm-up; the last may straddle it)."""
    at = 0
    for i, n in enumerate(profile.batches):
        if at >= profile.warmup:
            return i
        at += n
    return len(profile.batches)


def replay(profile: StreamProfile, scenarios: Sequence[Scenario]) -> list[Prediction]:
    """Replays the profile's trace through today's hierarchy and each scenario's; their predictions, today's first.

    The first `warmup` accesses only fill the models; the rest are counted."""
    geometry = profile.geometry
    runs: list[tuple[Scenario, list[int], bool, Hierarchy]] = []
    for s in (TODAY, *scenarios):
        blocks = s.blocks(profile.today, geometry)
        caps, clamped = scaled_capacities(blocks, profile.sample_rate, profile.max_blocks)
        runs.append((s, blocks, clamped, Hierarchy(caps, profile.policy)))
    models = [h for *_, h in runs]
    chains = Chains(2 * profile.max_blocks)
    for batch in batches_of(profile.trace, profile.batches[:_batches_before(profile)]):
        chained = chains.links(batch)
        for h in models:
            h.access_batch(batch, chained)
    outcomes = [Outcomes() for _ in runs]
    others = list(zip(models[1:], outcomes[1:], strict=True))
    for batch in batches_of(profile.trace, profile.batches, profile.warmup):
        feed(models[0], outcomes[0], others, batch, chains.links(batch))
    return [prediction(profile, s, blocks, clamped, o, outcomes[0]) for (s, blocks, clamped, _), o
            in zip(runs, outcomes, strict=True)]
