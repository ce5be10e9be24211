"""LMCache's `lmcache:*` series, on vLLM's /metrics or LMCache's internal API server (worker 0 on port 7000),
normalised to the engine contract under `engine="lmcache"`.

Facts: shared/facts/engines.md §2 (`lmcache/observability.py`). Labels `model_name`, `worker_id` (newer builds
add `role`, `served_model_name`); `served_model_name` is preferred as the model (it is vLLM's `model_name`).
`worker_id` is a tensor-parallel worker: each counts the same tokens for its slice of the KV, so token counts
come from the lowest worker and byte counts and usages are summed over workers.

- `num_hit_tokens` → `kvscope_kv_hit_tokens_total{tier=hit_tier}` (LMCache does not split hits by tier:
  `unattributed` unless config names the tier) and `kvscope_connector_hit_tokens_total`;
- `num_requested_tokens` → `kvscope_connector_lookup_tokens_total` (what vLLM's GPU cache missed);
- `num_remote_read_bytes` / `_write_bytes` → `kvscope_kv_transfer_bytes_total` remote → G2 / G2 → remote, and
  the `_sum` of `remote_time_to_get` / `_put` (histograms in **milliseconds**) → `kvscope_kv_transfer_seconds_total`;
- `time_to_retrieve` / `time_to_store` (seconds) → `kvscope_kv_load_seconds` / `kvscope_kv_store_seconds`;
- `local_cache_usage` / `local_storage_usage` / `remote_cache_usage` (bytes) → `kvscope_tier_used_bytes` of G2,
  the local disk's tier (G3, or by `local_disk_dir`'s mount) and the remote tier (`remote_tier`, G4);
- `retrieve_hit_rate`, `lookup_hit_rate` ("since last log") → `kvscope_engine_hit_ratio{tier="all"}`;
- `num_prompt_tokens`, `num_vllm_hit_tokens` → lookups, prompt tokens and G1 hits, with `engine_totals` only.

LMCache's multiprocess mode (`lmcache_mp_*`, its MP server's page) is read beside it: collectors/engines/lmcache_mp.py.

No double counting: vLLM's adapter already counts every prompt token and the G1 hits from vLLM's own series,
so LMCache's copies of them are read only when LMCache's page is all there is (`engine_totals`). LMCache's hits
are vLLM's connector hits (`external_prefix_cache_hits`), which the vLLM adapter reports as `unattributed`
until its pending `connector` option leaves them to this adapter (docs/engines.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

from kvscope.agent.core import contract as c
from kvscope.agent.core.pipeline import CollectorContext, CollectorSpec
from kvscope.agent.core.tenants import check_tenant_options
from kvscope.agent.core.tiers import parse_tier
from kvscope.collectors.engines.contract_map import (
    Dialect,
    EngineNormaliser,
    HistogramRule,
    Normalised,
    Rule,
    page_model,
)
from kvscope.collectors.engines.label_tenants import (
    LABEL_TENANT_METRICS,
    LabelTenants,
    TenantSeries,
)
from kvscope.collectors.engines.lmcache_mp import DEFAULT_L2_TIERS, L2, L2_LOAD, mp_dialect
from kvscope.collectors.engines.lmcache_mp import PREFIX as MP_PREFIX
from kvscope.collectors.engines.page_scrape import SCRAPE_METRICS, EngineCollector, PageScraper, ScrapeOptions
from kvscope.collectors.engines.vllm_map import TierTable
from kvscope.collectors.scrape.exposition import Labels, ScanResult
from kvscope.collectors.scrape.fetch import Fetcher
from kvscope.collectors.sharedfs.placement import place_pool

NAME = "lmcache"
PREFIX = "lmcache:"
POOL = "lmcache_local_disk"
METRICS = (*SCRAPE_METRICS, *(m for m in c.ENGINE_EXTRA_METRICS if m.name in (
    c.CONNECTOR_LOOKUP_TOKENS, c.CONNECTOR_HIT_TOKENS, c.ENGINE_HIT_RATIO, c.KV_LOAD_SECONDS, c.KV_STORE_SECONDS,
    c.TIER_PLACEMENT_INFO, c.KV_TRANSFER_BANDWIDTH, c.KV_LIFETIME_SECONDS, c.KV_IDLE_BEFORE_EVICT_SECONDS,
    c.KV_REUSE_GAP_SECONDS, c.CONNECTOR_TIER_LOOKUP_BLOCKS, c.CONNECTOR_TIER_HIT_BLOCKS)), *LABEL_TENANT_METRICS)


def dialect(hit_tier: str, disk_tier: str, remote_tier: str, engine_totals: bool) -> Dialect:
    counters = [
        Rule("num_hit_tokens_total", c.KV_HIT_TOKENS, (hit_tier,)),
        Rule("num_hit_tokens_total", c.CONNECTOR_HIT_TOKENS),
        Rule("num_requested_tokens_total", c.CONNECTOR_LOOKUP_TOKENS),
        Rule("num_remote_read_bytes_total", c.KV_TRANSFER_BYTES, (remote_tier, "G2"), shards="sum"),
        Rule("num_remote_write_bytes_total", c.KV_TRANSFER_BYTES, ("G2", remote_tier), shards="sum"),
        Rule("remote_time_to_get_sum", c.KV_TRANSFER_SECONDS, (remote_tier, "G2"), unit="ms", shards="sum"),
        Rule("remote_time_to_put_sum", c.KV_TRANSFER_SECONDS, ("G2", remote_tier), unit="ms", shards="sum"),
    ]
    if engine_totals:
        counters += [Rule("num_prompt_tokens_total", c.KV_LOOKUP_TOKENS),
                     Rule("num_prompt_tokens_total", c.PROMPT_TOKENS),
                     Rule("num_vllm_hit_tokens_total", c.KV_HIT_TOKENS, ("G1",))]
    gauges = (
        Rule("local_cache_usage", c.TIER_USED_BYTES, ("G2",), shards="sum"),
        Rule("local_storage_usage", c.TIER_USED_BYTES, (disk_tier,), shards="sum"),
        Rule("remote_cache_usage", c.TIER_USED_BYTES, (remote_tier,), shards="sum"),
        Rule("retrieve_hit_rate", c.ENGINE_HIT_RATIO, ("all", "lmcache:retrieve_hit_rate")),
        Rule("lookup_hit_rate", c.ENGINE_HIT_RATIO, ("all", "lmcache:lookup_hit_rate")),
    )
    histograms = (HistogramRule("time_to_retrieve", c.KV_LOAD_SECONDS),
                  HistogramRule("time_to_store", c.KV_STORE_SECONDS))
    return Dialect((PREFIX,), tuple(counters), gauges, histograms)


def lmcache_labels(labels: Labels) -> tuple[str, str, str]:
    return labels.get("served_model_name") or labels.get("model_name", ""), "0", labels.get("worker_id", "0")


@dataclass
class LmcacheOptions(ScrapeOptions):
    engine: str = "lmcache"  # urls: vLLM's /metrics, or LMCache's API server (http://127.0.0.1:7000/metrics)
    hit_tier: Literal["unattributed", "G2", "G3", "G4"] = "unattributed"  # the tier of LMCache's hits, if one
    remote_tier: Literal["G3", "G4"] = "G4"  # the remote backend (LMCache server, Redis, Mooncake, a shared FS)
    local_disk_dir: str = ""  # the local_disk backend's path: its tier by the mount's type ("" = G3)
    mountinfo: str = "self/mountinfo"  # below agent.proc_root unless absolute
    engine_totals: bool = False  # also read prompt tokens and G1 hits (only when no vLLM adapter reads the engine)
    # MP mode: L2 adapter (l2_name) → tier, over the defaults (fs G3, nixl_store and mooncake_store G4)
    l2_tiers: dict[str, str] = field(default_factory=dict)
    # MP mode: served share per tenant (cache_salt) for the N busiest tenants, the rest as "other" (0 = off)
    tenants_top_n: int = 0
    tenants_max_tracked: int = 1000  # tenants remembered between collections, per model

    def validate(self, path: str) -> None:
        self.check_scrape(NAME)
        check_tenant_options(self.tenants_top_n, self.tenants_max_tracked)
        for name, tier in self.l2_tiers.items():
            try:
                parse_tier(tier)
            except ValueError as exc:
                raise ValueError(f"l2_tiers.{name}: {exc}") from None
        if self.local_disk_dir and not os.path.isabs(self.local_disk_dir):
            raise ValueError(f"local_disk_dir: must be an absolute path, got {self.local_disk_dir!r}")


class LmcacheCollector(EngineCollector):
    def __init__(self, options: LmcacheOptions, proc_root: str = "/proc", fetch: Fetcher | None = None) -> None:
        placement = place_pool(options.local_disk_dir, proc_root, options.mountinfo)
        table = dialect(options.hit_tier, placement.tier.value if placement else "G3", options.remote_tier,
                        options.engine_totals)
        normaliser = EngineNormaliser(options.engine, table, lmcache_labels)
        mp = MpNormaliser(options)
        tenants: dict[str, LabelTenants] = {}  # per target URL, with tenants_top_n
        salts = TenantSeries((MP_PREFIX + "lookup_requested_tokens_total",), (MP_PREFIX + "lookup_hit_tokens_total",),
                             "cache_salt", lambda _labels: options.hit_tier)

        def normalise(url: str, page: ScanResult) -> Normalised:
            ours, theirs = normaliser.normalise(page), mp.normalise(page)
            readings = [*ours.readings, *theirs.readings]
            if options.tenants_top_n:
                per_salt = tenants.get(url)
                if per_salt is None:
                    per_salt = tenants[url] = LabelTenants(salts, options.engine, options.tenants_top_n,
                                                           options.tenants_max_tracked)
                readings += per_salt.readings(page, page_model(page))
            return Normalised(readings, ours.dropped + theirs.dropped)

        super().__init__(PageScraper(NAME, options.urls, (PREFIX, MP_PREFIX), table.wanted() | mp.wanted,
                                     normalise, options.scrape_timeout_seconds, options.max_response_bytes, fetch),
                         options.engine, POOL, placement)


class MpNormaliser:
    """The `lmcache_mp_` family: L2 tiers by `l2_name`; series without `model_name` take the page's model, and
    L2's unlabelled prefetch counters the tier of the one L2 adapter the page names (else unattributed)."""

    def __init__(self, options: LmcacheOptions) -> None:
        self._options = options
        self._tiers = TierTable({**DEFAULT_L2_TIERS, **options.l2_tiers})
        self._model = ""
        self._resolvers = {L2: lambda v: ((self._tiers(v),), 0), L2_LOAD: lambda v: ((self._tiers(v), "G2"), 0)}
        self._normalisers: dict[str, EngineNormaliser] = {}
        self.wanted = mp_dialect("unattributed", "unattributed").wanted()

    def _labels(self, labels: Labels) -> tuple[str, str, str]:
        return labels.get("model_name") or self._model, "0", "0"  # one MP server: no shards of its own

    def normalise(self, page: ScanResult) -> Normalised:
        if not any(name.startswith(MP_PREFIX) and rows for name, rows in page.samples.items()):
            return Normalised()
        self._model = page_model(page)
        adapters = {labels["l2_name"] for name, rows in page.samples.items() if name.startswith(MP_PREFIX)
                    for labels, _ in rows if labels.get("l2_name")}
        l2_tier = self._tiers(next(iter(adapters))) if len(adapters) == 1 else "unattributed"
        normaliser = self._normalisers.get(l2_tier)
        if normaliser is None:
            normaliser = self._normalisers[l2_tier] = EngineNormaliser(
                self._options.engine, mp_dialect(self._options.hit_tier, l2_tier), self._labels, self._resolvers)
        return normaliser.normalise(page)


def _factory(options: LmcacheOptions, context: CollectorContext) -> LmcacheCollector:
    return LmcacheCollector(options, context.proc_root)


SPEC = CollectorSpec(
    name=NAME,
    description="LMCache lmcache:* series (connector lookups and hits, remote bytes and times, usage per backend, "
                "retrieve/store times) on vLLM's /metrics or LMCache's API server, and lmcache_mp_* of its "
                "multiprocess server (L1/L2 lookups, hits, usage, throughput, chunk lifetimes)",
    options=LmcacheOptions,
    factory=_factory,
    metrics=METRICS,
    enabled_by_default=False,
    roots=("proc",),
)
