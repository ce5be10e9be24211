"""Which tier served the reused tokens, and which tier's reads took the fetch time: the split of a request's
saved (or lost) prefill seconds by tier.

Spans say how many tokens a request reused and how long its fetch took, not from which tier. The engine's
counters say it for all requests together: hit tokens per tier, and transfer seconds and bytes per link.
The mix keeps both, decayed with a half-life so that it follows the workload, per engine:

- token share of tier t: its hit tokens / all hit tokens (G1 and `unattributed` included);
- fetch share of tier t (below G1): the seconds of the links it is read over. A tier read through host
  memory (G3/G4 -> G2 -> G1) owns its own link's seconds and the part of G2 -> G1's seconds that its bytes
  into G2 make of G2 -> G1's bytes; G2 owns the rest. Without timed links the fetch follows the token shares
  of the tiers below G1.

A request's saved seconds by tier, the split the reference engine's truth uses too (docs/value.md):

    saved_t = (compute(P, 0) − prefill) × token share_t − fetch × fetch share_t

which adds up over the tiers to the request's saved seconds.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from kvscope.agent.core.tiers import Tier

G1, G2 = Tier.G1.value, Tier.G2.value


@dataclass
class TierMix:
    hit_tokens: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    link_seconds: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    link_bytes: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))

    def decay(self, factor: float) -> None:
        for tier in self.hit_tokens:
            self.hit_tokens[tier] *= factor
        for pair in self.link_seconds:
            self.link_seconds[pair] *= factor
        for pair in self.link_bytes:
            self.link_bytes[pair] *= factor

    def add_hits(self, tier: str, tokens: float) -> None:
        if tokens > 0:
            self.hit_tokens[tier] += tokens

    def add_onboard(self, src: str, dst: str, moved: float, seconds: float | None) -> None:
        if moved > 0:
            self.link_bytes[(src, dst)] += moved
        if seconds is not None and seconds > 0:
            self.link_seconds[(src, dst)] += seconds

    @property
    def known(self) -> bool:
        return sum(self.hit_tokens.values()) > 0

    def token_shares(self) -> dict[str, float]:
        total = sum(self.hit_tokens.values())
        return {t: n / total for t, n in self.hit_tokens.items() if n > 0} if total > 0 else {}

    def fetch_shares(self) -> dict[str, float]:
        seconds: dict[str, float] = defaultdict(float)
        relay = self.link_seconds.get((G2, G1), 0.0)
        relayed_bytes = self.link_bytes.get((G2, G1), 0.0)
        own_g2 = 1.0
        for (src, _dst), spent in self.link_seconds.items():
            if src != G2:
                seconds[src] += spent
        for (src, dst), moved in self.link_bytes.items():
            if dst == G2 and src != G1 and relayed_bytes > 0:
                part = min(own_g2, moved / relayed_bytes)
                seconds[src] += relay * part
                own_g2 -= part
        if own_g2 > 0:
            seconds[G2] += relay * own_g2
        total = sum(seconds.values())
        if total > 0:
            return {t: s / total for t, s in seconds.items() if s > 0}
        below = {t: n for t, n in self.hit_tokens.items() if t != G1 and n > 0}
        hits = sum(below.values())
        return {t: n / hits for t, n in below.items()} if hits > 0 else {}

    def split(self, avoided: float, fetch: float) -> dict[str, float]:
        """saved_t for a request whose compute avoided is `avoided` (compute(P, 0) − prefill) and fetch `fetch`."""
        out: dict[str, float] = defaultdict(float)
        for tier, share in self.token_shares().items():
            out[tier] += avoided * share
        fetch_shares = self.fetch_shares()
        if fetch > 0 and not fetch_shares:
            fetch_shares = {Tier.UNATTRIBUTED.value: 1.0}  # fetched, but no tier below G1 was seen serving
        for tier, share in fetch_shares.items():
            out[tier] -= fetch * share
        return dict(out)
