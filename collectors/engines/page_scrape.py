"""Scraping an engine's /metrics pages for the adapters built on contract_map.py (KVBM, Dynamo, LMCache, SGLang).

The HTTP client, the URL checks and the per-target health series are the vLLM adapter's
(collectors/engines/vllm_metrics.py), so every engine target reports the same `kvscope_scrape_*` series with its
own `collector` label. A target that fails (connect, timeout, HTTP status, too large, cut off) gives no
engine readings for that cycle and does not affect the other targets; a series another target already
reported (same engine, model and dp rank) is dropped and counted as `duplicate_series`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kvscope.agent.core.catalogue import MetricSpec
from kvscope.agent.core.readings import Reading
from kvscope.collectors.engines.contract_map import Normalised
from kvscope.collectors.engines.vllm_metrics import METRICS, check_url
from kvscope.collectors.scrape.exposition import ExpositionScanner, ScanResult
from kvscope.collectors.scrape.fetch import Fetcher, ParallelScrape, ScrapeError, http_fetch
from kvscope.collectors.scrape.target import ScrapeTarget, SeriesKey, target_health
from kvscope.collectors.sharedfs.placement import Placement, placement_info

SCRAPE_METRICS: tuple[MetricSpec, ...] = tuple(m for m in METRICS if m.name.startswith("kvscope_scrape_"))
MIB = 1 << 20


@dataclass
class ScrapeOptions:
    """The options every engine adapter built on this module has (its section adds its own)."""

    urls: list[str] = field(default_factory=list)  # the engine's /metrics pages
    engine: str = ""  # the `engine` label (engine kind); each adapter sets its default
    scrape_timeout_seconds: float = 2.0  # whole request per target: connect, headers and body
    max_response_bytes: int = 8 * MIB  # a larger body fails that target (kind="too_large")

    def check_scrape(self, what: str) -> None:
        check_targets(self.urls, what)
        if self.scrape_timeout_seconds <= 0:
            raise ValueError(f"scrape_timeout_seconds: must be > 0, got {self.scrape_timeout_seconds}")
        if self.max_response_bytes < 1024:
            raise ValueError(f"max_response_bytes: must be >= 1024, got {self.max_response_bytes}")
        if not self.engine:
            raise ValueError("engine: must not be empty")


def check_targets(urls: list[str], what: str) -> None:
    """Config validation shared by the engine adapters: at least one URL, each http(s), none twice."""
    if not urls:
        raise ValueError(f"urls: the {what} collector is enabled but has no URL to scrape")
    for url in urls:
        check_url(url)
    if len(set(urls)) != len(urls):
        raise ValueError("urls: a URL is listed twice")


class PageScraper:
    """Fetches each target, scans it for the dialect's samples and hands the page to `normalise`."""

    def __init__(self, collector: str, urls: Iterable[str], prefixes: tuple[str, ...], wanted: frozenset[str],
                 normalise: Callable[[str, ScanResult], Normalised], timeout: float, max_bytes: int,
                 fetch: Fetcher | None = None) -> None:
        self.collector = collector
        self._normalise = normalise
        self._targets = [ScrapeTarget(url, ExpositionScanner(prefixes, wanted)) for url in urls]
        # all targets at once, each within its own deadline: a slow one costs the others nothing
        self._scrape_all = ParallelScrape([t.url for t in self._targets], fetch or http_fetch, timeout, max_bytes)

    def collect(self) -> list[Reading]:
        readings: list[Reading] = []
        claimed: set[SeriesKey] = set()
        for target, answer in zip(self._targets, self._scrape_all.cycle(), strict=True):
            self._scrape(target, answer, readings, claimed)
        readings.extend(target_health(self.collector, self._targets))
        return readings

    def _scrape(self, target: ScrapeTarget, answer: bytes | ScrapeError, readings: list[Reading],
                claimed: set[SeriesKey]) -> None:
        page = target.page(self.collector, answer)
        if page is None:
            return
        result = self._normalise(target.url, page)
        target.count_malformed(self.collector, page, result.dropped)
        target.claim(self.collector, result.readings, claimed, readings, "same name and labels")


class EngineCollector:
    """An engine adapter: its pages, plus `kvscope_tier_placement_info` for its storage pool when it has one."""

    def __init__(self, scraper: PageScraper, engine: str, pool: str = "", placement: Placement | None = None) -> None:
        self._scraper = scraper
        self._engine, self._pool, self._placement = engine, pool, placement

    def collect(self) -> list[Reading]:
        readings = self._scraper.collect()
        if self._placement is not None:
            readings.append(placement_info(self._engine, self._pool, self._placement))
        return readings
