"""Engine autodetection: with no engine adapter configured, find the engines serving on this pod's usual ports
and scrape them through their ordinary adapters.

Once at start and then every `reprobe_interval_seconds`, each candidate URL is fetched (all in parallel, each
within `probe_timeout_seconds`) and identified by the names it serves (`identify`): `vllm:` → vllm, `sglang:` or
`sglang_` → sglang, `lmcache:` → lmcache, `kvbm_` (or `dynamo_component_*` in the `kvbm_connector_leader`
namespace) → dynamo_kvbm, other `dynamo_frontend_*` / `dynamo_component_*` → dynamo. A page can be several (a
Dynamo worker serves `dynamo_component_*` and its engine's `vllm:*`; vLLM's page can carry LMCache's). For each
kind found, the kind's own collector (the same class `[collectors.<kind>]` builds) is made with the URLs found
and its defaults, and every collection runs it: the adapters' series and health series are the ones an explicit
configuration gives. What was found is logged when it changes and exported as `kvscope_engine_discovered_info`.

Explicit configuration wins: when config enables any engine adapter, this collector probes nothing and reports
nothing (it says so once in the log). Beyond the adapters' defaults it passes on what the pages themselves say:
KVBM's unlabelled series get the one model the other pages serve, and it learns its block size from the page
that says it (vLLM's `cache_config_info`, the frontend's block size); `kv_bytes_per_token` (bytes need the
model's geometry) is an option here. Anything else needs the adapter configured explicitly, which turns this
collector off.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kvscope.agent.core.catalogue import gauge
from kvscope.agent.core.pipeline import Collector, CollectorContext, CollectorSpec
from kvscope.agent.core.readings import Reading, Sample
from kvscope.collectors.engines import dynamo_frontend, dynamo_kvbm, lmcache, sglang, vllm_metrics
from kvscope.collectors.engines.dynamo_frontend import DynamoCollector, DynamoOptions
from kvscope.collectors.engines.dynamo_kvbm import KvbmCollector, KvbmOptions, block_size_of
from kvscope.collectors.engines.kvbm_map import LEGACY_NAMESPACE
from kvscope.collectors.engines.lmcache import LmcacheCollector, LmcacheOptions
from kvscope.collectors.engines.page_scrape import MIB, check_targets
from kvscope.collectors.engines.sglang import SglangCollector, SglangOptions
from kvscope.collectors.engines.vllm_metrics import VllmMetricsCollector, VllmOptions
from kvscope.collectors.scrape.exposition import ExpositionScanner, ScanResult
from kvscope.collectors.scrape.fetch import Fetcher, ScrapeError, http_fetch

log = logging.getLogger("kvscope.collectors.engine_discovery")

NAME = "engine_discovery"
DISCOVERED = "kvscope_engine_discovered_info"
# the engine adapters: config enabling any of them turns autodetection off
ENGINE_COLLECTORS = frozenset({"vllm", "vllm_kv_events", "dynamo", "dynamo_kvbm", "sglang", "lmcache"})
KINDS = ("vllm", "sglang", "lmcache", "dynamo", "dynamo_kvbm")
PREFIXES = ("vllm:", "sglang:", "sglang_", "lmcache:", "kvbm_", "dynamo_")
DEFAULT_CANDIDATES = [
    "http://127.0.0.1:8000/metrics",  # vLLM's API server, or the Dynamo frontend
    "http://127.0.0.1:8081/metrics",  # a Dynamo worker's system port (its engine's lines pass through)
    "http://127.0.0.1:30000/metrics",  # SGLang
    "http://127.0.0.1:6880/metrics",  # Dynamo KVBM's leader
    "http://127.0.0.1:7000/metrics",  # LMCache's internal API server, worker 0
]
# what it emits: its own info, and every series of the adapters it runs
METRICS = (gauge(DISCOVERED, "", ("engine", "url"),
                 "Always 1: an engine autodetection found at that URL and scrapes through its adapter.",
                 "engine autodetection"),
           *vllm_metrics.METRICS, *dynamo_kvbm.METRICS, *dynamo_frontend.METRICS, *sglang.METRICS, *lmcache.METRICS)


@dataclass
class DiscoveryOptions:
    candidates: list[str] = field(default_factory=lambda: list(DEFAULT_CANDIDATES))
    reprobe_interval_seconds: float = 300.0  # after the probe at start
    # while a Dynamo worker's page serves no engine lines yet (its engine's appear with its first request)
    awaiting_engine_reprobe_seconds: float = 10.0
    probe_timeout_seconds: float = 1.0  # per candidate; all are probed in parallel
    max_response_bytes: int = 8 * MIB
    kv_bytes_per_token: int = 0  # the model's KV bytes per token, for the adapters that convert to bytes

    def validate(self, path: str) -> None:
        check_targets(self.candidates, NAME)
        if min(self.reprobe_interval_seconds, self.probe_timeout_seconds, self.awaiting_engine_reprobe_seconds) <= 0:
            raise ValueError("reprobe_interval_seconds, awaiting_engine_reprobe_seconds and probe_timeout_seconds "
                             "must be > 0")
        if self.kv_bytes_per_token < 0:
            raise ValueError("kv_bytes_per_token: must be >= 0 (0 = unknown)")


def identify(page: ScanResult) -> set[str]:
    """The engine kinds whose names a page serves."""
    kinds: set[str] = set()
    for name, rows in page.samples.items():
        if name.startswith("vllm:"):
            kinds.add("vllm")
        elif name.startswith(("sglang:", "sglang_")):
            kinds.add("sglang")
        elif name.startswith("lmcache:"):
            kinds.add("lmcache")
        elif name.startswith("kvbm_"):
            kinds.add("dynamo_kvbm")
        elif name.startswith(("dynamo_frontend_", "dynamo_component_")):
            leader = any(labels.get("dynamo_namespace") == LEGACY_NAMESPACE for labels, _ in rows)
            kinds.add("dynamo_kvbm" if leader else "dynamo")
    return kinds


def awaits_engine(page: ScanResult) -> bool:
    """A Dynamo worker's page without its engine's lines: Dynamo 1.6's workers (the mocker, as a vLLM worker's
    system port) serve the engine's `vllm:*` lines only from their first request on."""
    names = page.samples.keys()
    return (identify(page) == {"dynamo"} and any(n.startswith("dynamo_component_") for n in names)
            and not any(n.startswith("dynamo_frontend_") for n in names))


def models_of(page: ScanResult) -> set[str]:
    return {labels[key] for rows in page.samples.values() for labels, _ in rows
            for key in ("model_name", "model") if labels.get(key)}


@dataclass
class Found:
    """What one probe round found: URLs per kind, and what the pages say that KVBM's adapter needs."""

    urls: dict[str, list[str]] = field(default_factory=dict)
    models: set[str] = field(default_factory=set)
    geometry_url: str = ""  # a page that says the engine's block size (vLLM's, or the Dynamo frontend's)
    awaiting_engine: list[str] = field(default_factory=list)  # Dynamo worker pages without their engine's lines


Builder = Callable[[list[str], Found], Collector]


class DiscoveryCollector:
    def __init__(self, options: DiscoveryOptions, context: CollectorContext | None = None,
                 fetch: Fetcher | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        context = context or CollectorContext()
        self._options = options
        self._proc_root = context.proc_root
        self._configured = sorted(ENGINE_COLLECTORS & context.enabled_collectors)
        self._fetch: Fetcher = fetch or http_fetch
        self._clock = clock
        self._next_probe = 0.0
        self._found = Found()
        self._adapters: dict[str, Collector] = {}
        if self._configured:
            log.info("engine autodetection is off: config enables %s", ", ".join(self._configured))

    def collect(self) -> list[Reading]:
        if self._configured:
            return []
        if self._clock() >= self._next_probe:
            self._use(self._probe())
            o = self._options
            wait = o.awaiting_engine_reprobe_seconds if self._found.awaiting_engine else o.reprobe_interval_seconds
            self._next_probe = self._clock() + wait
        readings: list[Reading] = [Sample(DISCOVERED, (kind, url), 1.0)
                                   for kind, urls in self._found.urls.items() for url in urls]
        for adapter in self._adapters.values():
            readings.extend(adapter.collect())
        return readings

    def _probe(self) -> Found:
        o = self._options

        def probe(url: str) -> ScanResult | None:
            try:
                body = self._fetch(url, o.probe_timeout_seconds, o.max_response_bytes)
            except ScrapeError:
                return None
            return ExpositionScanner(PREFIXES).scan(body.decode("utf-8", errors="replace"))

        with ThreadPoolExecutor(max_workers=len(o.candidates), thread_name_prefix="probe") as pool:
            pages = dict(zip(o.candidates, pool.map(probe, o.candidates), strict=True))
        found = Found()
        for url, page in pages.items():
            if page is None:
                continue
            for kind in sorted(identify(page)):
                found.urls.setdefault(kind, []).append(url)
            found.models |= models_of(page)
            if awaits_engine(page):
                found.awaiting_engine.append(url)
            if not found.geometry_url and block_size_of(page):
                found.geometry_url = url
        return found

    def _use(self, found: Found) -> None:
        if found == self._found:
            return
        described = "; ".join(f"{kind} at {', '.join(urls)}" for kind, urls in sorted(found.urls.items()))
        log.info("engine autodetection found %s", described or "no engine on " + ", ".join(self._options.candidates))
        self._found = found
        self._adapters = {kind: self._builders()[kind](urls, found) for kind, urls in found.urls.items()}

    def _builders(self) -> Mapping[str, Builder]:
        bpt, root = self._options.kv_bytes_per_token, self._proc_root

        def kvbm(urls: list[str], found: Found) -> Collector:
            model = next(iter(found.models)) if len(found.models) == 1 else ""
            return KvbmCollector(KvbmOptions(urls=urls, model=model, geometry_url=found.geometry_url,
                                             kv_bytes_per_token=bpt), root, fetch=self._fetch)

        return {
            "vllm": lambda urls, _: VllmMetricsCollector(VllmOptions(urls=urls), self._fetch),
            "sglang": lambda urls, _: SglangCollector(SglangOptions(urls=urls, kv_bytes_per_token=bpt), root,
                                                      self._fetch),
            "lmcache": lambda urls, _: LmcacheCollector(LmcacheOptions(urls=urls), root, self._fetch),
            "dynamo": lambda urls, _: DynamoCollector(DynamoOptions(urls=urls), self._fetch),
            "dynamo_kvbm": kvbm,
        }


def _factory(options: DiscoveryOptions, context: CollectorContext) -> DiscoveryCollector:
    return DiscoveryCollector(options, context)


SPEC = CollectorSpec(
    name=NAME,
    description="Engine autodetection: with no engine adapter configured, probes the usual local ports (vLLM, "
                "Dynamo, SGLang, KVBM, LMCache), identifies engines by the names they serve, scrapes them",
    options=DiscoveryOptions,
    factory=_factory,
    metrics=METRICS,
    enabled_by_default=True,
)
