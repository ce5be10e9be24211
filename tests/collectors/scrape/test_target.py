"""A target whose page answers without any series the collector reads is said once, not silently empty."""

from __future__ import annotations

import logging

import pytest

from kvscope.collectors.scrape.exposition import ExpositionScanner
from kvscope.collectors.scrape.target import ScrapeTarget

# vLLM 0.32's page after LMCache failed to start (docs/lmcache.md): vLLM's families, no lmcache: series
WITHOUT_LMCACHE = b"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 0.0
"""
WITH_LMCACHE = WITHOUT_LMCACHE + b"""# HELP lmcache:num_hit_tokens Number of hit tokens
# TYPE lmcache:num_hit_tokens counter
lmcache:num_hit_tokens_total{model_name="tiny",worker_id="0"} 64.0
"""


def _target() -> ScrapeTarget:
    return ScrapeTarget("http://127.0.0.1:8000/metrics",
                        ExpositionScanner(("lmcache:",), {"lmcache:num_hit_tokens_total"}))


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_page_without_the_collectors_series_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    target = _target()
    with caplog.at_level(logging.INFO, logger="kvscope.collectors.scrape"):
        for _ in range(3):
            page = target.page("lmcache", WITHOUT_LMCACHE)
            assert page is not None and not page.samples and target.up
    assert len(_warnings(caplog)) == 1 and "holds none of the series" in _warnings(caplog)[0]


def test_series_that_come_back_are_said_and_a_new_absence_warned_again(caplog: pytest.LogCaptureFixture) -> None:
    target = _target()
    with caplog.at_level(logging.INFO, logger="kvscope.collectors.scrape"):
        target.page("lmcache", WITHOUT_LMCACHE)
        page = target.page("lmcache", WITH_LMCACHE)
        assert page is not None and page.samples
        target.page("lmcache", WITHOUT_LMCACHE)
    assert len(_warnings(caplog)) == 2
    assert any("on the page again" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)


def test_a_page_with_the_series_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    target = _target()
    with caplog.at_level(logging.INFO, logger="kvscope.collectors.scrape"):
        target.page("lmcache", WITH_LMCACHE)
    assert not caplog.records
