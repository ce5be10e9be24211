"""Served share per tenant from an engine's own counters, where the engine labels them by tenant:

- LMCache's multiprocess server: `lmcache_mp_lookup_requested_tokens_total` and `lmcache_mp_lookup_hit_tokens_total`
  carry `cache_salt` (LMCache `mp_observability` docs: "one entry per tenant or isolation domain"); the hits are
  L1 and L2 together, in the collector's `hit_tier`;
- SGLang: `sglang:prompt_tokens_total` and `sglang:cached_tokens_total{cache_source}` carry the per-request
  labels SGLang takes from its `x-custom-labels` header when started with
  `--tokenizer-metrics-allowed-custom-labels <label>` (TokenizerMetricsCollector); hits per tier by
  `cache_source`, as the collector maps them.

The counters are cumulative per (model, tenant) series; each collection turns every series' growth since the
last one into a TenantCap entry (when any of a tenant's counters went down, the server restarted: all its values
are new), so a thousand tenants on the page make at most `tenants_top_n` + 1 tenant series per model
(agent/core/tenants.py). An empty or absent tenant label is tenant `base`; a name longer than
MAX_TENANT_CHARS counts for `other`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvscope.agent.core.catalogue import MetricSpec, counter
from kvscope.agent.core.contract import ENGINE_LABELS
from kvscope.agent.core.readings import Reading, Sample
from kvscope.agent.core.tenants import OTHER, TenantCap
from kvscope.collectors.kv_events.tenants import MAX_TENANT_CHARS, TENANT_METRICS, TENANTS_FOLDED, TENANTS_FORGOTTEN
from kvscope.collectors.scrape.exposition import Labels, ScanResult

NO_TENANT = "base"  # lookups without the tenant label (or with it empty)
LOOKUPS, HIT_PREFIX = "lookups", "hits:"

TENANT_LOOKUP_TOKENS = "kvscope_tenant_kv_lookup_tokens_total"
TENANT_HIT_TOKENS = "kvscope_tenant_kv_hit_tokens_total"
TENANT_UNRANKED_TOKENS = "kvscope_tenant_unranked_lookup_tokens_total"
TENANT_ODD_NAME_TOKENS = "kvscope_tenant_odd_name_lookup_tokens_total"
_SRC = "engine counters by tenant (LMCache MP cache_salt, SGLang custom labels)"
LABEL_TENANT_METRICS: tuple[MetricSpec, ...] = (
    counter(TENANT_LOOKUP_TOKENS, "tokens", (*ENGINE_LABELS, "tenant"),
            "Tokens a tenant's requests looked up (LMCache MP: requested of its L1/L2; SGLang: prompt tokens): the "
            "top tenants_top_n tenants by recent lookups each, the rest as tenant=\"other\".", _SRC),
    counter(TENANT_HIT_TOKENS, "tokens", (*ENGINE_LABELS, "tenant", "tier"),
            "Of those, tokens the tier served (LMCache MP: L1 and L2 together, in the collector's hit_tier; "
            "SGLang: by cache_source). Served share = hits / lookups.", _SRC),
    counter(TENANT_UNRANKED_TOKENS, "tokens", ENGINE_LABELS,
            "Lookup tokens of tenants not taken in between two collections, for want of room (more than "
            "tenants_max_tracked new names): counted for tenant=\"other\".", _SRC),
    counter(TENANT_ODD_NAME_TOKENS, "tokens", ENGINE_LABELS,
            f"Lookup tokens of series whose tenant name was longer than {MAX_TENANT_CHARS} characters: counted for "
            "tenant=\"other\".", _SRC),
    *(m for m in TENANT_METRICS if m.name in (TENANTS_FOLDED, TENANTS_FORGOTTEN)),
)


@dataclass(frozen=True)
class TenantSeries:
    """Where a page keeps its per-tenant counters."""

    lookups: tuple[str, ...]  # sample names of the lookup counter (one per exposed prefix)
    hits: tuple[str, ...]  # and of the hit counter
    tenant_label: str
    hit_tier: Callable[[Labels], str]  # the tier of a hit row
    model_label: str = "model_name"


def tenant_name(value: str) -> str:
    if not value:
        return NO_TENANT
    return value if len(value) <= MAX_TENANT_CHARS else ""


class LabelTenants:
    """One target's page: per model, the growth of each tenant's lookup and hit counters into a TenantCap."""

    def __init__(self, series: TenantSeries, engine: str, top_n: int, max_tracked: int) -> None:
        self._series, self._engine = series, engine
        self._top_n, self._max_tracked = top_n, max_tracked
        self._caps: dict[str, TenantCap] = {}
        self._last: dict[tuple[str, str], dict[str, float]] = {}  # (model, tenant label) → values last time
        self._odd: dict[str, float] = {}  # model → lookup tokens of over-long names

    def _values(self, page: ScanResult, page_model: str) -> dict[tuple[str, str], dict[str, float]]:
        """(model, tenant label) → {lookups, hits:<tier>...} as the page has them now."""
        s = self._series
        out: dict[tuple[str, str], dict[str, float]] = {}
        rows = [(LOOKUPS, row) for name in s.lookups for row in page.samples.get(name, [])]
        rows += [(HIT_PREFIX, row) for name in s.hits for row in page.samples.get(name, [])]
        for kind, (labels, value) in rows:
            if not value >= 0:  # NaN or negative: not a counter value
                continue
            key = (labels.get(s.model_label) or page_model, labels.get(s.tenant_label, ""))
            amount = LOOKUPS if kind == LOOKUPS else HIT_PREFIX + s.hit_tier(labels)
            values = out.setdefault(key, {})
            values[amount] = values.get(amount, 0.0) + value
        return out

    def readings(self, page: ScanResult, page_model: str) -> list[Reading]:
        if not any(name in page.samples for name in self._series.lookups):
            return []
        now = self._values(page, page_model)
        for key, values in now.items():
            last = self._last.get(key, {})
            if any(values.get(name, 0.0) < before for name, before in last.items()):
                last = {}  # a counter went down: the server restarted, all of it is new
            self._add(*key, {name: value - last.get(name, 0.0) for name, value in values.items()})
        self._last = now  # memory: the page's size
        return [r for model, cap in self._caps.items() for r in self._model_readings(model, cap)]

    def _add(self, model: str, label: str, grown: dict[str, float]) -> None:
        cap = self._caps.get(model)
        if cap is None:
            cap = self._caps[model] = TenantCap(self._top_n, self._max_tracked)
        lookups = grown.get(LOOKUPS, 0.0)
        tenant = tenant_name(label)
        if not tenant:
            self._odd[model] = self._odd.get(model, 0.0) + lookups
            tenant = OTHER
        cap.add(tenant, lookups, grown)

    def _model_readings(self, model: str, cap: TenantCap) -> list[Reading]:
        labels = (self._engine, model, "0")
        cap.rank()
        out: list[Reading] = []
        for tenant, totals in cap.shown():
            out.append(Sample(TENANT_LOOKUP_TOKENS, (*labels, tenant), totals.get(LOOKUPS, 0.0)))
            out += [Sample(TENANT_HIT_TOKENS, (*labels, tenant, name.removeprefix(HIT_PREFIX)), value)
                    for name, value in sorted(totals.items()) if name.startswith(HIT_PREFIX)]
        out.append(Sample(TENANTS_FOLDED, labels, cap.folded))
        out.append(Sample(TENANTS_FORGOTTEN, labels, cap.forgotten))
        out.append(Sample(TENANT_UNRANKED_TOKENS, labels, cap.unranked))
        out.append(Sample(TENANT_ODD_NAME_TOKENS, labels, self._odd.get(model, 0.0)))
        return out
