"""Which tier served the reused tokens, and which tier's reads took the fetch time: the split of a request's
saved (or lost) prefill seconds by tier.

Spans say how many tokens a request reused and how long its fetch took, not from which tier. The engine's
counters say it for all requests together: hit tokens per tier, and transfer seconds and bytes per link.
Each window's growth goes into a pool per engine; each request's reused tokens (and fetch seconds) are
drawn from the pool in proportion to what it holds, so requests are matched with the hits the counters
counted around them (a mix over a long time would give the G4 hits of a G4-heavy minute to the G1
requests of the minute before). A request whose hits the pool does not hold yet (its span came ahead of the
scrape that counts them) waits for them, MIX_WAIT_SECONDS at most; what the pool still cannot cover then
follows the mix, the same counts decayed with a half-life. The pool decays alike: hits of requests
that never send a record do not pile up.

The fetch seconds of tier t (below G1) are the seconds of the links it is read over: a tier read through
host memory (G3/G4 -> G2 -> G1) owns its own link's seconds and the part of G2 -> G1's seconds that its
bytes into G2 make of G2 -> G1's bytes; G2 owns the rest, if it serves hits of its own (if not, the relayed
tiers share all of it, by their bytes into G2 in the window or, where it counted none, before). Without timed
links a request's fetch follows the hit tokens it drew from the tiers below G1 (what it read), or the mix's
where it drew none there (vLLM 0.14.1 with KVBM reports no transfer seconds): following the mix alone gave a
request that read only from G4 the G2 share of the whole run as well. Two requests whose hits one scrape
window counted still share them, and so their reads' tiers.

A request's saved seconds by tier, the split the reference engine's truth uses too (docs/value.md):

    saved_t = (compute(P, 0) − prefill) × tokens_t / reused − fetch × fetch share_t

which adds up over the tiers to the request's saved seconds.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from kvscope.agent.core.tiers import Tier

MIX_WAIT_SECONDS = 15.0
G1, G2 = Tier.G1.value, Tier.G2.value
UNATTRIBUTED = Tier.UNATTRIBUTED.value


def fetch_seconds_by_tier(link_seconds: Mapping[tuple[str, str], float],
                          link_bytes: Mapping[tuple[str, str], float], g2_serves: bool = True,
                          relayed_before: Mapping[str, float] | None = None) -> dict[str, float]:
    """Onboard link seconds as seconds per tier read (see the module docstring). `g2_serves`: G2 served hits of
    its own; where it serves none, all of G2 -> G1 is the relayed tiers', in proportion to their bytes into G2
    (a window can count a block's two hops apart), and a window that counted none of their first hops takes
    the proportions of `relayed_before` (each tier's bytes into G2 in earlier windows)."""
    out: dict[str, float] = defaultdict(float)
    relay = link_seconds.get((G2, G1), 0.0)
    relayed_bytes = link_bytes.get((G2, G1), 0.0)
    into_g2 = {src: moved for (src, dst), moved in link_bytes.items() if dst == G2 and src != G1 and moved > 0}
    if not g2_serves and not into_g2:
        into_g2 = {src: moved for src, moved in (relayed_before or {}).items() if moved > 0}
    for (src, _dst), spent in link_seconds.items():
        if src != G2:
            out[src] += spent
    own_g2 = 1.0
    whole = sum(into_g2.values()) if not g2_serves else max(relayed_bytes, sum(into_g2.values()))
    for src, moved in into_g2.items():
        part = min(own_g2, moved / whole) if whole > 0 else 0.0
        out[src] += relay * part
        own_g2 -= part
    if own_g2 > 1e-12 and relay > 0:
        out[G2] += relay * own_g2
    return {t: s for t, s in out.items() if s > 0}


def _shares(amounts: Mapping[str, float]) -> dict[str, float]:
    total = sum(amounts.values())
    return {t: n / total for t, n in amounts.items() if n > 0} if total > 0 else {}


def _decay(table: dict[str, float], factor: float) -> None:
    for key in table:
        table[key] *= factor


def _draw(pool: dict[str, float], wanted: float, fallback: Mapping[str, float]) -> dict[str, float]:
    """`wanted` taken from the pool in proportion to what it holds, the rest by the fallback shares."""
    total = sum(pool.values())
    taken = min(wanted, total)
    out: dict[str, float] = defaultdict(float)
    if taken > 0:
        for tier in [t for t, held in pool.items() if held > 0]:
            amount = taken * pool[tier] / total
            out[tier] += amount
            pool[tier] -= amount
    rest = wanted - taken
    if rest > 0:
        for tier, share in (fallback or {UNATTRIBUTED: 1.0}).items():
            out[tier] += rest * share
    return dict(out)


@dataclass
class TierMix:
    hits: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # decayed, by tier
    fetch: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # decayed seconds, by tier
    hit_pool: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    fetch_pool: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    into_g2: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # decayed bytes, by source tier
    _links: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)  # this window: bytes, s
    _undrawn: float = 0.0  # hit tokens counted and not drawn yet, not decayed: what a waiting request waits for
    # requests waiting for their hits to reach the pool: reused, avoided, fetch, a label, since (wall)
    _waiting: deque[tuple[float, float, float, str, float]] = field(default_factory=deque)

    def add_request(self, reused: float, avoided: float, fetch: float, label: str, now: float) -> None:
        self._waiting.append((reused, avoided, fetch, label, now))

    def settle(self, now: float, wait: float = MIX_WAIT_SECONDS) -> list[tuple[str, dict[str, float]]]:
        """The waiting requests' splits, in order of arrival, as far as the pool holds their hits (or they
        waited `wait` seconds): (label, saved seconds by tier)."""
        out = []
        while self._waiting:
            reused, avoided, fetch, label, since = self._waiting[0]
            if self._undrawn < reused and now - since < wait:
                break
            self._waiting.popleft()
            out.append((label, self.split(reused, avoided, fetch)))
        return out

    def decay(self, factor: float) -> None:
        for table in (self.hits, self.fetch, self.hit_pool, self.fetch_pool, self.into_g2):
            _decay(table, factor)

    def add_hits(self, tier: str, tokens: float) -> None:
        if tokens > 0:
            self.hits[tier] += tokens
            self.hit_pool[tier] += tokens
            self._undrawn += tokens

    def add_onboard(self, src: str, dst: str, moved: float, seconds: float | None) -> None:
        before = self._links.get((src, dst), (0.0, 0.0))
        self._links[(src, dst)] = (before[0] + max(0.0, moved), before[1] + max(0.0, seconds or 0.0))

    def close_window(self) -> None:
        """The window's link seconds, as seconds per tier read, into the pool and the mix."""
        seconds = fetch_seconds_by_tier({k: v[1] for k, v in self._links.items()},
                                        {k: v[0] for k, v in self._links.items()}, self.hits.get(G2, 0.0) > 0,
                                        self.into_g2)
        for tier, spent in seconds.items():
            self.fetch[tier] += spent
            self.fetch_pool[tier] += spent
        for (src, dst), (moved, _) in self._links.items():
            if dst == G2 and src != G1:
                self.into_g2[src] += moved
        self._links.clear()

    @property
    def known(self) -> bool:
        return sum(self.hits.values()) > 0

    def token_shares(self) -> dict[str, float]:
        return _shares(self.hits)

    def fetch_shares(self, drawn: Mapping[str, float] | None = None) -> dict[str, float]:
        """Shares of the fetch seconds by tier; without timed links, the hit tokens below G1 that a request
        `drawn` (its own reads), else the mix's."""
        return (_shares(self.fetch) or _shares({t: n for t, n in (drawn or {}).items() if t != G1})
                or _shares({t: n for t, n in self.hits.items() if t != G1}))

    def split(self, reused: float, avoided: float, fetch: float) -> dict[str, float]:
        """saved_t for a request that reused `reused` tokens, avoided `avoided` seconds of compute
        (compute(P, 0) − prefill) and fetched for `fetch` seconds; draws both from the pools."""
        out: dict[str, float] = defaultdict(float)
        drawn: dict[str, float] = {}
        if reused > 0:
            self._undrawn = max(0.0, self._undrawn - reused)
            drawn = _draw(self.hit_pool, reused, self.token_shares())
            for tier, tokens in drawn.items():
                out[tier] += avoided * tokens / reused
        if fetch > 0:
            for tier, seconds in _draw(self.fetch_pool, fetch, self.fetch_shares(drawn)).items():
                out[tier] -= seconds
        return dict(out)
