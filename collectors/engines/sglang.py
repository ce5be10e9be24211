"""SGLang's /metrics (`--enable-metrics`, the server port, default 30000), with HiCache's host and storage tiers,
normalised to the engine contract. The table and its reasoning: collectors/engines/sglang_map.py."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Literal

from kvscope.agent.core import contract as c
from kvscope.agent.core.pipeline import CollectorContext, CollectorSpec
from kvscope.agent.core.readings import Reading, Sample
from kvscope.agent.core.tenants import check_tenant_options
from kvscope.agent.core.tiers import Tier, parse_tier
from kvscope.collectors.engines.contract_map import EngineNormaliser, Normalised, Resolver, page_model
from kvscope.collectors.engines.label_tenants import (
    LABEL_TENANT_METRICS,
    LabelTenants,
    TenantSeries,
)
from kvscope.collectors.engines.page_scrape import SCRAPE_METRICS, EngineCollector, PageScraper, ScrapeOptions
from kvscope.collectors.engines.sglang_backends import (
    PLACEHOLDERS,
    UNATTRIBUTED,
    backend_key,
    backend_tiers,
    untiered_reason,
)
from kvscope.collectors.engines.sglang_map import (
    PREFIXES,
    dialect,
    has_hicache,
    sglang_labels,
    storage_backends,
)
from kvscope.collectors.engines.vllm_map import USAGE_RATIO
from kvscope.collectors.engines.vllm_metrics import METRICS as VLLM_METRICS
from kvscope.collectors.scrape.exposition import ScanResult
from kvscope.collectors.scrape.fetch import Fetcher
from kvscope.collectors.sharedfs.placement import place_pool

NAME = "sglang"
POOL = "sglang_hicache_file"
METRICS = (*SCRAPE_METRICS, *(m for m in VLLM_METRICS if m.name == USAGE_RATIO),
           *(m for m in c.ENGINE_EXTRA_METRICS if m.name in (
               c.KV_TRANSFER_TOKENS, c.KV_TRANSFER_BANDWIDTH, c.ENGINE_HIT_RATIO, c.TIER_USED_TOKENS,
               c.PREEMPTIONS, c.TIER_PLACEMENT_INFO, c.KV_EVICTED_TOKENS, c.ENGINE_UNMAPPED_VALUES)),
           *LABEL_TENANT_METRICS)
MAX_UNMAPPED = 16  # distinct backend names counted by name; the rest count as "other"
log = logging.getLogger(__name__)


@dataclass
class SglangOptions(ScrapeOptions):
    engine: str = "sglang"  # urls: e.g. http://127.0.0.1:30000/metrics
    # storage backend (--hicache-storage-backend, or its class as cache_source spells it) → tier, over the
    # defaults (file G3 or by file_storage_dir, hf3fs/mooncake/nixl/aibrix/eic G4, others unattributed); an
    # entry given here wins
    storage_backend_tiers: dict[str, str] = field(default_factory=dict)
    # the `file` backend's directory (SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR): its tier by the mount's type
    file_storage_dir: str = ""
    mountinfo: str = "self/mountinfo"  # below agent.proc_root unless absolute
    # hits the page does not split by tier: auto = G1 without HiCache series on the page, else unattributed
    unsplit_hits_tier: Literal["auto", "G1", "unattributed"] = "auto"
    kv_bytes_per_token: int = 0  # the model's KV bytes per token, for bytes where SGLang counts only tokens
    # served share per tenant: the request label SGLang was told to keep (--tokenizer-metrics-allowed-custom-labels)
    tenant_label: str = ""
    tenants_top_n: int = 0  # with tenant_label: the N busiest tenants get series of their own, the rest "other"
    tenants_max_tracked: int = 1000  # tenants remembered between collections, per model

    def validate(self, path: str) -> None:
        self.check_scrape(NAME)
        for backend, tier in self.storage_backend_tiers.items():
            try:
                parse_tier(tier)
            except ValueError as exc:
                raise ValueError(f"storage_backend_tiers.{backend}: {exc}") from None
        if self.file_storage_dir and not os.path.isabs(self.file_storage_dir):
            raise ValueError(f"file_storage_dir: must be an absolute path, got {self.file_storage_dir!r}")
        if self.kv_bytes_per_token < 0:
            raise ValueError("kv_bytes_per_token: must be >= 0 (0 = unknown)")
        check_tenant_options(self.tenants_top_n, self.tenants_max_tracked)
        if self.tenants_top_n and not self.tenant_label:
            raise ValueError("tenants_top_n: needs tenant_label, the request label SGLang keeps per tenant")


class SglangNormaliser:
    """Per page: whether HiCache is on and which storage backend it names decide the unsplit and storage tiers."""

    def __init__(self, options: SglangOptions, file_tier: str = "G3") -> None:
        self._options = options
        self._configured = frozenset(backend_key(k) for k in options.storage_backend_tiers)
        self._backends = backend_tiers(options.storage_backend_tiers, file_tier)
        self._token_bytes = float(options.kv_bytes_per_token) or None
        self._unsplit = "G1"
        self._page_storage = UNATTRIBUTED  # the tier of the one backend the page names
        self._page_model = ""
        self._normalisers: dict[str, EngineNormaliser] = {}
        self.unmapped: dict[str, int] = {}  # backend name → scrapes that named it without a tier
        sources = {"device": "G1", "host": "G2"}

        def cache_source(value: str) -> tuple[tuple[str, ...], int]:
            if value.startswith("storage_"):
                backend = backend_key(value)
                return (self._page_storage if backend in PLACEHOLDERS else self._backends(backend),), 0
            return (sources.get(value, self._unsplit),), 0

        self.hit_tier = lambda labels: cache_source(labels.get("cache_source", ""))[0][0]  # after normalise()
        self._resolvers: dict[str, Resolver] = {
            "cache_source": cache_source,
            "prefill_compute": lambda v: ((), 0) if v == "prefill_compute" else None,
            "kv_pool": lambda v: ((), 0) if v in ("", "kv") else None,
        }

    def normalise(self, page: ScanResult) -> Normalised:
        option = self._options.unsplit_hits_tier
        self._unsplit = option if option != "auto" else ("unattributed" if has_hicache(page) else "G1")
        backends = sorted(storage_backends(page))
        for backend in backends:
            self._check_mapped(backend)
        storage = self._backends(backends[0]) if len(backends) == 1 else Tier.UNATTRIBUTED.value
        self._page_storage, self._page_model = storage, page_model(page)
        normaliser = self._normalisers.get(storage)
        if normaliser is None:
            normaliser = self._normalisers[storage] = EngineNormaliser(
                self._options.engine, dialect(storage), lambda labels: sglang_labels(labels, self._page_model),
                self._resolvers)
        return normaliser.normalise(page, {"token_bytes": self._token_bytes})

    def _check_mapped(self, backend: str) -> None:
        """A backend with no tier is counted on every page that names it and logged the first time."""
        if backend in self._configured or self._backends(backend) != UNATTRIBUTED:
            return
        key = backend if backend in self.unmapped or len(self.unmapped) < MAX_UNMAPPED else "other"
        if key not in self.unmapped:
            log.warning("%s: storage backend %r is %s: its hits and moves are exported as tier 'unattributed'; "
                        "map it with storage_backend_tiers = { %s = \"G3\" } (or G4)", self._options.engine,
                        backend, untiered_reason(backend), backend)
        self.unmapped[key] = self.unmapped.get(key, 0) + 1

    def unmapped_readings(self) -> list[Reading]:
        return [Sample(c.ENGINE_UNMAPPED_VALUES, (self._options.engine, "storage_backend", backend), float(n))
                for backend, n in sorted(self.unmapped.items())]


class SglangCollector(EngineCollector):
    def __init__(self, options: SglangOptions, proc_root: str = "/proc", fetch: Fetcher | None = None) -> None:
        placement = place_pool(options.file_storage_dir, proc_root, options.mountinfo)
        self._normaliser = normaliser = SglangNormaliser(options, placement.tier.value if placement else "G3")
        series = TenantSeries(tuple(p + "prompt_tokens_total" for p in PREFIXES),
                              tuple(p + "cached_tokens_total" for p in PREFIXES), options.tenant_label,
                              normaliser.hit_tier)
        tenants: dict[str, LabelTenants] = {}  # per target URL, with tenants_top_n

        def normalise(url: str, page: ScanResult) -> Normalised:
            out = normaliser.normalise(page)
            if options.tenants_top_n:
                per_label = tenants.get(url)
                if per_label is None:
                    per_label = tenants[url] = LabelTenants(series, options.engine, options.tenants_top_n,
                                                            options.tenants_max_tracked)
                out.readings += per_label.readings(page, page_model(page))
            return out

        super().__init__(PageScraper(NAME, options.urls, PREFIXES, dialect("G3").wanted(), normalise,
                                     options.scrape_timeout_seconds, options.max_response_bytes, fetch),
                         options.engine, POOL, placement)

    def collect(self) -> list[Reading]:
        return [*super().collect(), *self._normaliser.unmapped_readings()]


def _factory(options: SglangOptions, context: CollectorContext) -> SglangCollector:
    return SglangCollector(options, context.proc_root)


SPEC = CollectorSpec(
    name=NAME,
    description="SGLang /metrics, both prefixes (hits per tier from cached_tokens' cache_source, HiCache host and "
                "storage moves, TTFT/queue, capacities)",
    options=SglangOptions,
    factory=_factory,
    metrics=METRICS,
    enabled_by_default=False,
    roots=("proc",),
)
