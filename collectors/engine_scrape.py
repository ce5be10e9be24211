"""Scraping an engine's /metrics pages for the adapters built on engine_map (KVBM, Dynamo, LMCache, SGLang).

The HTTP client, the URL checks and the per-target health series are the vLLM adapter's
(collectors/vllm_metrics.py), so every engine target reports the same `kvscope_scrape_*` series with its
own `collector` label. A target that fails (connect, timeout, HTTP status, too large, cut off) gives no
engine readings for that cycle and does not affect the other targets; a series another target already
reported (same engine, model and dp rank) is dropped and counted as `duplicate_series`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kvscope.agent.catalogue import MetricSpec
from kvscope.agent.readings import Reading, Sample
from kvscope.collectors.engine_map import Normalised
from kvscope.collectors.exposition_scan import ExpositionScanner, ScanResult
from kvscope.collectors.http_scrape import Fetcher, ParallelScrape, ScrapeError, http_fetch, is_whole
from kvscope.collectors.storage_placement import Placement, placement_info
from kvscope.collectors.vllm_metrics import ERROR_KINDS, METRICS, check_url

log = logging.getLogger("kvscope.collectors.engines")

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


@dataclass
class _Target:
    url: str
    scanner: ExpositionScanner
    up: bool | None = None
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ERROR_KINDS, 0))
    malformed: int = 0
    response_bytes: int = 0
    reported_malformed: bool = False


class PageScraper:
    """Fetches each target, scans it for the dialect's samples and hands the page to `normalise`."""

    def __init__(self, collector: str, urls: Iterable[str], prefixes: tuple[str, ...], wanted: frozenset[str],
                 normalise: Callable[[str, ScanResult], Normalised], timeout: float, max_bytes: int,
                 fetch: Fetcher | None = None) -> None:
        self.collector = collector
        self._normalise = normalise
        self._targets = [_Target(url, ExpositionScanner(prefixes, wanted)) for url in urls]
        # all targets at once, each within its own deadline: a slow one costs the others nothing
        self._scrape_all = ParallelScrape([t.url for t in self._targets], fetch or http_fetch, timeout, max_bytes)

    def collect(self) -> list[Reading]:
        readings: list[Reading] = []
        claimed: set[tuple[str, tuple[str, ...]]] = set()
        for target, answer in zip(self._targets, self._scrape_all.cycle(), strict=True):
            self._scrape(target, answer, readings, claimed)
        for t in self._targets:
            labels = (self.collector, t.url)
            readings.append(Sample("kvscope_scrape_target_up", labels, 1.0 if t.up else 0.0))
            readings.append(Sample("kvscope_scrape_malformed_lines_total", labels, float(t.malformed)))
            readings.append(Sample("kvscope_scrape_response_bytes", labels, float(t.response_bytes)))
            readings.extend(Sample("kvscope_scrape_errors_total", (*labels, kind), float(n))
                            for kind, n in t.errors.items())
        return readings

    def _scrape(self, target: _Target, answer: bytes | ScrapeError, readings: list[Reading],
                claimed: set[tuple[str, tuple[str, ...]]]) -> None:
        try:
            if isinstance(answer, ScrapeError):
                raise answer
            target.response_bytes = len(answer)
            # a page HTTP vouches for (its Content-Length met) is whole even without a final newline
            page = target.scanner.scan(answer.decode("utf-8", errors="replace"), complete=is_whole(answer))
            if page.truncated:  # a cut-off page may lack some of the series summed into one: use none of it
                raise ScrapeError("truncated", "the body does not end with a newline")
        except ScrapeError as exc:
            target.errors[exc.kind] += 1
            if target.up is not False:
                log.warning("%s target %s: scrape failed (%s); retrying every cycle", self.collector, target.url, exc)
            target.up = False
            return
        if target.up is False:
            log.info("%s target %s: scraping again", self.collector, target.url)
        target.up = True
        result = self._normalise(target.url, page)
        target.malformed += page.malformed + result.dropped
        if (page.malformed or result.dropped) and not target.reported_malformed:
            target.reported_malformed = True
            log.warning("%s target %s: %d malformed line(s) and %d unusable sample(s) skipped (counted in "
                        "kvscope_scrape_malformed_lines_total, logged once); first: %s", self.collector,
                        target.url, page.malformed, result.dropped, page.first_problem or "-")
        duplicates = 0
        for reading in result.readings:
            key = (reading.name, reading.labels)
            if key in claimed:
                duplicates += 1
                continue
            claimed.add(key)
            readings.append(reading)
        if duplicates:
            target.errors["duplicate_series"] += 1
            if target.errors["duplicate_series"] == 1:
                log.warning("%s target %s: %d series already reported by another target were dropped; give "
                            "each target distinct engines", self.collector, target.url, duplicates)


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
