"""One scraped engine page and what is counted about it, shared by every adapter that scrapes an exposition
page (vLLM's own collector and the other engines' PageScraper): its failures by kind, its malformed lines,
the series another target already gave, and the health series `kvscope_scrape_*` of each target.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvscope.agent.core.readings import Reading, Sample
from kvscope.collectors.scrape.exposition import ExpositionScanner, ScanResult
from kvscope.collectors.scrape.fetch import ScrapeError, is_whole

log = logging.getLogger("kvscope.collectors.scrape")

ERROR_KINDS = ("connect", "timeout", "http_status", "too_large", "truncated", "protocol", "duplicate_series")
SeriesKey = tuple[str, tuple[str, ...]]


@dataclass
class ScrapeTarget:
    url: str
    scanner: ExpositionScanner
    up: bool | None = None
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ERROR_KINDS, 0))
    malformed: int = 0
    response_bytes: int = 0
    reported_malformed: bool = False
    reported_empty: bool = False  # a page without any series this collector reads has been logged
    held: dict[SeriesKey, Reading] = field(default_factory=dict)  # last readings a collector holds through gaps

    def page(self, collector: str, answer: bytes | ScrapeError) -> ScanResult | None:
        """The scanned page of a scrape's answer, or None when the scrape failed (counted and logged)."""
        if isinstance(answer, ScrapeError):
            self._failed(collector, answer)
            return None
        self.response_bytes = len(answer)
        # a page HTTP vouches for (its Content-Length met) is whole even without a final newline
        page = self.scanner.scan(answer.decode("utf-8", errors="replace"), complete=is_whole(answer))
        if page.truncated:  # a cut-off page may lack some of the series summed into one: use none of it
            self._failed(collector, ScrapeError("truncated", "the body does not end with a newline (and HTTP "
                                                "did not say its length)"))
            return None
        if self.up is False:
            log.info("%s target %s: scraping again", collector, self.url)
        self.up = True
        self._say_if_empty(collector, page)
        return page

    def _say_if_empty(self, collector: str, page: ScanResult) -> None:
        """A page that answers but holds nothing this collector reads (e.g. vLLM serving on after LMCache
        failed to start) is said once, and again when its series come back and go again."""
        if page.samples or page.malformed:
            if self.reported_empty:
                log.info("%s target %s: its series are on the page again", collector, self.url)
            self.reported_empty = False
        elif not self.reported_empty:
            self.reported_empty = True
            log.warning("%s target %s: the page answers but holds none of the series this collector reads; "
                        "is the part of the engine that exports them running?", collector, self.url)

    def _failed(self, collector: str, exc: ScrapeError) -> None:
        self.errors[exc.kind] += 1
        if self.up is not False:
            log.warning("%s target %s: scrape failed (%s); retrying every cycle", collector, self.url, exc)
        self.up = False

    def count_malformed(self, collector: str, page: ScanResult, dropped: int) -> None:
        """Lines the scanner could not read and samples the normaliser could not use (the first logged once)."""
        self.malformed += page.malformed + dropped
        if (page.malformed or dropped) and not self.reported_malformed:
            self.reported_malformed = True
            log.warning("%s target %s: %d malformed line(s) and %d unusable sample(s) skipped (counted in "
                        "kvscope_scrape_malformed_lines_total, logged once); first: %s", collector, self.url,
                        page.malformed, dropped, page.first_problem or "-")

    def claim(self, collector: str, readings: Iterable[Reading], claimed: set[SeriesKey], out: list[Reading],
              same: str) -> None:
        """Appends to `out` the readings whose series no earlier target of this cycle gave (`claimed`); the
        others are dropped and counted. `same`: what makes two series the same, for the log line."""
        duplicates = 0
        for reading in readings:
            key = (reading.name, reading.labels)
            if key in claimed:
                duplicates += 1
                continue
            claimed.add(key)
            out.append(reading)
        if duplicates:
            self.errors["duplicate_series"] += 1
            if self.errors["duplicate_series"] == 1:
                log.warning("%s target %s: %d series already reported by another target (%s) were dropped; "
                            "give each target distinct engines", collector, self.url, duplicates, same)


def target_health(collector: str, targets: Iterable[ScrapeTarget]) -> list[Reading]:
    """`kvscope_scrape_*` of each target: up, malformed lines, response size, errors by kind."""
    out: list[Reading] = []
    for t in targets:
        labels = (collector, t.url)
        out.append(Sample("kvscope_scrape_target_up", labels, 1.0 if t.up else 0.0))
        out.append(Sample("kvscope_scrape_malformed_lines_total", labels, float(t.malformed)))
        out.append(Sample("kvscope_scrape_response_bytes", labels, float(t.response_bytes)))
        out.extend(Sample("kvscope_scrape_errors_total", (*labels, kind), float(n)) for kind, n in t.errors.items())
    return out
