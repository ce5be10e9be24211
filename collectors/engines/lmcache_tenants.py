"""Served share per tenant from LMCache's multiprocess server: `lmcache_mp_lookup_requested_tokens_total` and
`lmcache_mp_lookup_hit_tokens_total` carry `cache_salt` (LMCache `mp_observability` docs: "one entry per tenant
or isolation domain"), so per tenant hits / lookups is the share LMCache's L1 and L2 served.

The counters are cumulative per (model_name, cache_salt) series; each collection turns every series' growth
since the last one into a TenantCap entry (when either counter of a salt went down, the server restarted: both
values are new), so a thousand salts on the page make at most `tenants_top_n` + 1 tenant series per model
(agent/core/tenants.py).
An empty or absent `cache_salt` is tenant `base`; a salt longer than MAX_TENANT_CHARS counts for `other`.
The hits are L1 and L2 together (LMCache does not split them per tenant): tier `hit_tier`, as the
collector's kvscope_kv_hit_tokens_total.
"""

from __future__ import annotations

from kvscope.agent.core.catalogue import MetricSpec, counter
from kvscope.agent.core.contract import ENGINE_LABELS
from kvscope.agent.core.readings import Reading, Sample
from kvscope.agent.core.tenants import OTHER, TenantCap
from kvscope.collectors.engines.lmcache_mp import PREFIX
from kvscope.collectors.kv_events.tenants import MAX_TENANT_CHARS, TENANT_METRICS, TENANTS_FOLDED, TENANTS_FORGOTTEN
from kvscope.collectors.scrape.exposition import ScanResult

REQUESTED = f"{PREFIX}lookup_requested_tokens_total"
HIT = f"{PREFIX}lookup_hit_tokens_total"
NO_SALT = "base"  # lookups without a cache_salt
LOOKUPS, HITS = "lookups", "hits"

TENANT_LOOKUP_TOKENS = "kvscope_tenant_kv_lookup_tokens_total"
TENANT_HIT_TOKENS = "kvscope_tenant_kv_hit_tokens_total"
TENANT_UNRANKED_TOKENS = "kvscope_tenant_unranked_lookup_tokens_total"
TENANT_ODD_NAME_TOKENS = "kvscope_tenant_odd_name_lookup_tokens_total"
_SRC = "LMCache MP lmcache_mp_lookup_{requested,hit}_tokens (cache_salt)"
SALT_TENANT_METRICS: tuple[MetricSpec, ...] = (
    counter(TENANT_LOOKUP_TOKENS, "tokens", (*ENGINE_LABELS, "tenant"),
            "Tokens a tenant's lookups asked LMCache for (cache_salt): the top tenants_top_n tenants by recent "
            "lookups each, the rest as tenant=\"other\".", _SRC),
    counter(TENANT_HIT_TOKENS, "tokens", (*ENGINE_LABELS, "tenant", "tier"),
            "Of those, tokens LMCache's L1 or L2 served (tier: the collector's hit_tier). Served share = hits / "
            "lookups.", _SRC),
    counter(TENANT_UNRANKED_TOKENS, "tokens", ENGINE_LABELS,
            "Lookup tokens of tenants not taken in between two collections, for want of room (more than "
            "tenants_max_tracked new names): counted for tenant=\"other\".", _SRC),
    counter(TENANT_ODD_NAME_TOKENS, "tokens", ENGINE_LABELS,
            f"Lookup tokens of series whose cache_salt was longer than {MAX_TENANT_CHARS} characters: counted for "
            "tenant=\"other\".", _SRC),
    *(m for m in TENANT_METRICS if m.name in (TENANTS_FOLDED, TENANTS_FORGOTTEN)),
)


def tenant_of_salt(salt: str) -> str:
    if not salt:
        return NO_SALT
    return salt if len(salt) <= MAX_TENANT_CHARS else ""


class SaltTenants:
    """One target's MP page: per model, the growth of each salt's lookup and hit counters into a TenantCap."""

    def __init__(self, engine: str, hit_tier: str, top_n: int, max_tracked: int) -> None:
        self._engine, self._hit_tier = engine, hit_tier
        self._top_n, self._max_tracked = top_n, max_tracked
        self._caps: dict[str, TenantCap] = {}
        self._last: dict[tuple[str, str], tuple[float, float]] = {}  # (model, salt) → (requested, hit) last time
        self._odd: dict[str, float] = {}  # model → lookup tokens of over-long salts

    def _values(self, page: ScanResult, page_model: str) -> dict[tuple[str, str], list[float]]:
        """(model, salt) → [requested, hit] as the page has them now."""
        out: dict[tuple[str, str], list[float]] = {}
        for i, name in enumerate((REQUESTED, HIT)):
            for labels, value in page.samples.get(name, []):
                if not value >= 0:  # NaN or negative: not a counter value
                    continue
                key = (labels.get("model_name") or page_model, labels.get("cache_salt", ""))
                out.setdefault(key, [0.0, 0.0])[i] += value
        return out

    def readings(self, page: ScanResult, page_model: str) -> list[Reading]:
        if REQUESTED not in page.samples:
            return []
        now = self._values(page, page_model)
        for (model, salt), (asked, hit) in now.items():
            last = self._last.get((model, salt), (0.0, 0.0))
            if asked < last[0] or hit < last[1]:  # either went down: the server restarted, all of it is new
                last = (0.0, 0.0)
            self._add(model, salt, asked - last[0], hit - last[1])
        self._last = {key: (pair[0], pair[1]) for key, pair in now.items()}  # memory: the page's size
        return [r for model, cap in self._caps.items() for r in self._model_readings(model, cap)]

    def _add(self, model: str, salt: str, asked: float, hit: float) -> None:
        cap = self._caps.get(model)
        if cap is None:
            cap = self._caps[model] = TenantCap(self._top_n, self._max_tracked)
        tenant = tenant_of_salt(salt)
        if not tenant:
            self._odd[model] = self._odd.get(model, 0.0) + asked
            tenant = OTHER
        cap.add(tenant, asked, {LOOKUPS: asked, HITS: hit})

    def _model_readings(self, model: str, cap: TenantCap) -> list[Reading]:
        labels = (self._engine, model, "0")
        cap.rank()
        out: list[Reading] = []
        for tenant, totals in cap.shown():
            out.append(Sample(TENANT_LOOKUP_TOKENS, (*labels, tenant), totals.get(LOOKUPS, 0.0)))
            out.append(Sample(TENANT_HIT_TOKENS, (*labels, tenant, self._hit_tier), totals.get(HITS, 0.0)))
        out.append(Sample(TENANTS_FOLDED, labels, cap.folded))
        out.append(Sample(TENANTS_FORGOTTEN, labels, cap.forgotten))
        out.append(Sample(TENANT_UNRANKED_TOKENS, labels, cap.unranked))
        out.append(Sample(TENANT_ODD_NAME_TOKENS, labels, self._odd.get(model, 0.0)))
        return out
