"""Per-tenant totals under a cardinality cap: the top N tenants by recent traffic have series of their own,
every other tenant's traffic goes to one series, `other`. Pure: no I/O, no clock.

A tenant is what an engine labels its requests or blocks by (a LoRA adapter in vLLM's KV events, LMCache's
cache_salt, a request label). Their number is the engine's users' to choose, so exporting one series per
tenant would let a thousand tenants make a thousand series per metric; this keeps it to N + 1.

- `add(tenant, traffic, amounts)` counts `amounts` (named quantities, e.g. lookups and hits) for the tenant
  if it is shown, else for `other`. While fewer than N tenants are shown, a new one is shown at once.
- `rank()` (once per collection, before `shown()`) ranks the tenants by traffic, halved at each rank so that
  recent traffic counts most, and shows the top N from then on. A tenant no longer shown keeps the totals it
  was last exported with and goes on from them if it comes back; what it counted since then moves to
  `other`, and so does its traffic while it is not shown. Every exported series only grows, and the last
  values of all series ever exported add up to all the traffic counted.
- Memory: at most `max_tracked` tenants are remembered between ranks (the busiest); the rest are forgotten
  (counted), and a forgotten tenant that comes back starts again from zero. Between two ranks at most
  `max_tracked` new tenants are taken in; beyond that (a flood of names) a new tenant's traffic counts for
  `other` without its name being kept (`unranked`, in traffic units).
"""

from __future__ import annotations

from collections.abc import Mapping

OTHER = "other"
DECAY = 0.5  # traffic weight kept at each rank


def check_tenant_options(top_n: int, max_tracked: int) -> None:
    """The `tenants_top_n` / `tenants_max_tracked` options of a collector that caps tenants (0 = off)."""
    if top_n < 0:
        raise ValueError(f"tenants_top_n: must be >= 0 (0 = off), got {top_n}")
    if top_n and max_tracked < top_n:
        raise ValueError(f"tenants_max_tracked: must be >= tenants_top_n ({top_n}), got {max_tracked}")


class TenantCap:
    def __init__(self, top_n: int, max_tracked: int) -> None:
        if top_n < 1:
            raise ValueError(f"top_n must be >= 1, got {top_n}")
        self.top_n = top_n
        self.max_tracked = max(max_tracked, top_n)
        self._traffic: dict[str, float] = {}
        self._shown: set[str] = set()
        self._totals: dict[str, dict[str, float]] = {}
        self._exported: dict[str, dict[str, float]] = {}  # the totals shown() last gave, per tenant
        self.forgotten = 0  # tenants dropped from memory at a rank to stay within max_tracked
        self.unranked = 0.0  # traffic of tenants not taken in between two ranks (no room): counted for `other`

    def add(self, tenant: str, traffic: float, amounts: Mapping[str, float]) -> None:
        if tenant in self._traffic or (tenant != OTHER and len(self._traffic) < 2 * self.max_tracked):
            self._traffic[tenant] = self._traffic.get(tenant, 0.0) + traffic
            if tenant not in self._shown and len(self._shown) < self.top_n:
                self._shown.add(tenant)
        elif tenant != OTHER:  # no room until the next rank: `other`, and the name is not kept
            self.unranked += traffic
        totals = self._totals.setdefault(tenant if tenant in self._shown else OTHER, {})
        for name, amount in amounts.items():
            totals[name] = totals.get(name, 0.0) + amount

    def rank(self) -> None:
        ranked = sorted(self._traffic.items(), key=lambda item: (-item[1], item[0]))
        shown = {tenant for tenant, traffic in ranked[:self.top_n] if traffic > 0}
        for tenant in self._shown - shown:  # what it counted since it was last exported goes to `other`
            self._fold(tenant)
        self._shown = shown
        for tenant, _ in ranked[self.max_tracked:]:
            del self._traffic[tenant]
            self._totals.pop(tenant, None)
            self._exported.pop(tenant, None)
        self.forgotten += max(0, len(ranked) - self.max_tracked)
        for tenant in self._traffic:
            self._traffic[tenant] *= DECAY

    def _fold(self, tenant: str) -> None:
        totals, exported = self._totals.get(tenant, {}), self._exported.get(tenant, {})
        other = self._totals.setdefault(OTHER, {})
        for name, amount in totals.items():
            other[name] = other.get(name, 0.0) + amount - exported.get(name, 0.0)
            totals[name] = exported.get(name, 0.0)

    def shown(self) -> list[tuple[str, dict[str, float]]]:
        """(tenant, totals) of the tenants shown, and of `other` once anything was counted for it."""
        names = sorted(self._shown & self._totals.keys())
        for name in names:
            self._exported[name] = dict(self._totals[name])
        if OTHER in self._totals:
            names.append(OTHER)
        return [(name, dict(self._totals[name])) for name in names]

    @property
    def folded(self) -> int:
        """Tenants remembered and not shown: their traffic counts for `other`."""
        return len(self._traffic.keys() - self._shown)
