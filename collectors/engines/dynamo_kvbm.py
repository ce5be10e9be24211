"""Dynamo KVBM (KV Block Manager) /metrics, scraped and normalised to the engine contract.

The KVBM leader serves its own /metrics (`DYN_KVBM_METRICS=true`, port `DYN_KVBM_METRICS_PORT`, default
6880); older builds put the same counters on the worker's system port as
`dynamo_component_*{dynamo_namespace="kvbm_connector_leader"}`. The table is collectors/engines/kvbm_map.py.

- G3 or G4: KVBM's disk pool is a directory (`DYN_KVBM_DISK_CACHE_DIR`). It is G4 when that directory sits
  on a network or parallel file system (the seeds' IBM Storage Scale), decided from the mount table under
  the agent's proc root (collectors/sharedfs/placement.py), overridable with `disk_tier`, and shown in
  `kvscope_tier_placement_info`. The directory is `disk_cache_dir`, else `DYN_KVBM_DISK_CACHE_DIR` as this
  process sees it (give the sidecar the engine's value), else KVBM's own default, the temp directory.
- Geometry: KVBM counts blocks. Tokens per block are `block_tokens` from config, or learned from
  `geometry_url` — a page with vLLM's `cache_config_info{block_size}` (the worker) or Dynamo's
  `dynamo_frontend_model_kv_cache_block_size` (the frontend): KVBM moves the engine's own blocks. Bytes
  need `kv_bytes_per_token` (the model's KV geometry, `kvscope kv-size`); no page says it. Without
  block_tokens there are no hit tokens, without both no bytes: blocks per link are always exported.
  `kvscope_kv_block_size_tokens{source}` says where the block size came from.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from kvscope.agent.core import contract as c
from kvscope.agent.core.pipeline import CollectorContext, CollectorSpec
from kvscope.agent.core.readings import Reading, Sample
from kvscope.collectors.engines.contract_map import EngineNormaliser, Normalised
from kvscope.collectors.engines.kvbm_map import LEGACY_PREFIX, PREFIX, KvbmLabels, dialect
from kvscope.collectors.engines.kvbm_staging import StagedHits
from kvscope.collectors.engines.page_scrape import SCRAPE_METRICS, PageScraper, ScrapeOptions
from kvscope.collectors.engines.vllm_metrics import check_url
from kvscope.collectors.scrape.exposition import ExpositionScanner, ScanResult
from kvscope.collectors.scrape.fetch import Fetcher, ScrapeError, http_fetch
from kvscope.collectors.sharedfs.common import under_root
from kvscope.collectors.sharedfs.placement import Placement, place_from, placement_info

log = logging.getLogger("kvscope.collectors.dynamo_kvbm")

NAME = "dynamo_kvbm"
POOL = "kvbm_disk"
CACHE_CONFIG = "vllm:cache_config_info"
FRONTEND_BLOCK_SIZE = "dynamo_frontend_model_kv_cache_block_size"
_E = c.ENGINE_LABELS
METRICS = (*SCRAPE_METRICS, *(m for m in c.ENGINE_EXTRA_METRICS if m.name in (
    c.KV_TRANSFER_BLOCKS, c.KV_TRANSFER_FAILED_BLOCKS, c.CONNECTOR_HIT_TOKENS, c.ENGINE_HIT_RATIO,
    c.TIER_PLACEMENT_INFO, c.KV_BLOCK_SIZE_TOKENS)))


@dataclass
class KvbmOptions(ScrapeOptions):
    engine: str = "dynamo"  # urls: the KVBM leader's page, e.g. http://127.0.0.1:6880/metrics
    model: str = ""  # the `model` label: KVBM's series carry none
    disk_cache_dir: str = ""  # "" = $DYN_KVBM_DISK_CACHE_DIR as the agent sees it, else the temp directory
    disk_tier: Literal["auto", "G3", "G4"] = "auto"  # auto: from the type of the mount holding disk_cache_dir
    network_fstypes: list[str] = field(default_factory=list)  # file system types to treat as network, besides ours
    mountinfo: str = "self/mountinfo"  # below agent.proc_root unless absolute
    block_tokens: int = 0  # tokens per KVBM block; 0 = learn from geometry_url
    geometry_url: str = ""  # the vLLM worker's or Dynamo frontend's /metrics, to learn block_tokens from
    kv_bytes_per_token: int = 0  # the model's KV bytes per token; 0 = unknown (no bytes, blocks only)

    def validate(self, path: str) -> None:
        self.check_scrape(NAME)
        if self.disk_cache_dir and not os.path.isabs(self.disk_cache_dir):
            raise ValueError(f"disk_cache_dir: must be an absolute path, got {self.disk_cache_dir!r}")
        if self.block_tokens < 0 or self.kv_bytes_per_token < 0:
            raise ValueError("block_tokens and kv_bytes_per_token must be >= 0 (0 = unknown)")
        if self.geometry_url:
            check_url(self.geometry_url)


def block_size_of(page: ScanResult) -> int | None:
    """Tokens per KV block from a vLLM (`cache_config_info{block_size}`) or Dynamo frontend page."""
    for labels, _ in page.samples.get(CACHE_CONFIG, ()):
        size = labels.get("block_size", "")
        if size.isdigit() and int(size) > 0:
            return int(size)
    for _, value in page.samples.get(FRONTEND_BLOCK_SIZE, ()):
        if value >= 1 and value == int(value):
            return int(value)
    return None


def geometry_scanner() -> ExpositionScanner:
    return ExpositionScanner(("vllm:", "dynamo_frontend_"), (CACHE_CONFIG, FRONTEND_BLOCK_SIZE))


class KvbmCollector:
    def __init__(self, options: KvbmOptions, proc_root: str = "/proc", environ: Mapping[str, str] | None = None,
                 fetch: Fetcher | None = None) -> None:
        env = os.environ if environ is None else environ
        self._options = options
        self._dir = os.path.normpath(options.disk_cache_dir or env.get("DYN_KVBM_DISK_CACHE_DIR")
                                     or env.get("TMPDIR") or "/tmp")
        self._mountinfo = under_root(proc_root, options.mountinfo)
        self._fetch: Fetcher = fetch or http_fetch
        self._placement: Placement | None = None
        self._normaliser: EngineNormaliser | None = None
        self._staged = StagedHits()
        self._block_tokens, self._block_source = options.block_tokens, "config" if options.block_tokens else ""
        self._geometry = geometry_scanner()
        self._geometry_failed = False
        self._scraper = PageScraper(NAME, options.urls, (PREFIX, LEGACY_PREFIX), dialect("G3").wanted(),
                                    self._normalise, options.scrape_timeout_seconds, options.max_response_bytes,
                                    self._fetch)

    def collect(self) -> list[Reading]:
        placement = self._place()
        self._learn_block_size()
        readings = self._scraper.collect()
        o = self._options
        readings.append(placement_info(o.engine, POOL, placement))
        if self._block_tokens:
            readings.append(Sample(c.KV_BLOCK_SIZE_TOKENS, (o.engine, o.model, "0", self._block_source),
                                   float(self._block_tokens)))
        return readings

    def _place(self) -> Placement:
        """Decided once; retried each cycle while the mount table gave no answer."""
        if self._placement is not None and self._placement.decided_by != "default":
            return self._placement
        o = self._options
        placement, error = place_from(self._dir, self._mountinfo, o.disk_tier, o.network_fstypes)
        if error is not None and self._placement is None:
            log.warning("cannot read the mount table %s (%s): KVBM's disk pool %s is taken as G3 until it can be "
                        "read; set disk_tier to decide", self._mountinfo, error, self._dir)
        if placement != self._placement:
            log.info("KVBM disk pool %s is %s (%s: mount %s, type %s)", placement.path, placement.tier,
                     placement.decided_by, placement.mount or "-", placement.fstype or "-")
            self._placement = placement
            self._normaliser = EngineNormaliser(o.engine, dialect(placement.tier.value), KvbmLabels(o.model))
        return placement

    def _learn_block_size(self) -> None:
        url = self._options.geometry_url
        if self._block_tokens or not url:
            return
        try:
            body = self._fetch(url, self._options.scrape_timeout_seconds, self._options.max_response_bytes)
            size = block_size_of(self._geometry.scan(body.decode("utf-8", errors="replace")))
        except ScrapeError as exc:
            size = None
            if not self._geometry_failed:
                log.warning("cannot learn KVBM's block size from %s (%s); retrying every cycle", url, exc)
            self._geometry_failed = True
        if size is not None:
            self._block_tokens, self._block_source = size, url
            log.info("KVBM block size: %d tokens, learned from %s", size, url)

    def _normalise(self, url: str, page: ScanResult) -> Normalised:
        assert self._normaliser is not None and self._placement is not None  # made by _place() before a scrape
        tokens = self._block_tokens or None
        per_token = self._options.kv_bytes_per_token or None
        factors = {"block_tokens": tokens, "staged_block_tokens": -tokens if tokens else None,
                   "block_bytes": tokens * per_token if tokens and per_token else None}
        normalised = self._normaliser.normalise(page, factors)
        normalised.readings = self._staged.apply(normalised.readings, self._placement.tier.value)
        return normalised


def _factory(options: KvbmOptions, context: CollectorContext) -> KvbmCollector:
    return KvbmCollector(options, context.proc_root)


SPEC = CollectorSpec(
    name=NAME,
    description="Dynamo KVBM /metrics (blocks and bytes per link, hits per tier from onboarded blocks, its "
                "disk pool placed in G3 or G4 by mount type)",
    options=KvbmOptions,
    factory=_factory,
    metrics=METRICS,
    enabled_by_default=False,
    roots=("proc",),
)
