"""Pages captured from real SGLang, LMCache and Dynamo servers (tests/fixtures/<engine>/captured/, each source in
the folder's README) → the engine's adapter and engine autodetection, served over real HTTP. Every figure expected
below is read off the page's text; the cases are the rows of the READMEs' tables."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from kvscope.agent.core.readings import HistogramSample, Reading, Sample
from kvscope.collectors.engines import lmcache, sglang_map
from kvscope.collectors.engines.contract_map import Dialect, HistogramRule, Rule
from kvscope.collectors.engines.discovery import DISCOVERED, DiscoveryCollector, DiscoveryOptions
from kvscope.collectors.engines.dynamo_frontend import DIALECT as DYNAMO_DIALECT
from kvscope.collectors.engines.dynamo_frontend import DynamoCollector, DynamoOptions
from kvscope.collectors.engines.dynamo_kvbm import block_size_of
from kvscope.collectors.engines.lmcache import LmcacheCollector, LmcacheOptions
from kvscope.collectors.engines.sglang import SglangCollector, SglangOptions
from kvscope.collectors.scrape.exposition import ExpositionScanner
from testkit.engine_pages import FIXTURES, page, serving

INF = float("inf")


@dataclass(frozen=True)
class Adapter:
    collector: Callable[[str], SglangCollector | LmcacheCollector | DynamoCollector]
    dialect: Dialect  # the name table of the adapter as the collector above builds it


ADAPTERS = {
    "sglang": Adapter(lambda url: SglangCollector(SglangOptions(urls=[url])), sglang_map.dialect("G3")),
    "lmcache": Adapter(lambda url: LmcacheCollector(LmcacheOptions(urls=[url])),
                       lmcache.dialect("unattributed", "G3", "G4", engine_totals=False)),
    "dynamo": Adapter(lambda url: DynamoCollector(DynamoOptions(urls=[url])), DYNAMO_DIALECT),
}


@dataclass(frozen=True)
class Expected:
    """The adapter's series for one page, exactly: (name, *labels) → value, and histograms → (count, sum, edges)."""

    samples: dict[tuple[str, ...], float] = field(default_factory=dict)
    histograms: dict[tuple[str, ...], tuple[float, float, list[float]]] = field(default_factory=dict)


LLAMA = ("sglang", "meta-llama/Llama-3.1-8B-Instruct", "0")
OPT = ("sglang", "facebook/opt-125m", "0")
QWEN32 = ("sglang", "Qwen-32B", "0")
LLAMA3 = ("sglang", "/shared/public/models/Meta-Llama-3-8B-Instruct", "0")
QWEN3 = ("lmcache", "Qwen/Qwen3-8B", "0")
QWEN25 = ("lmcache", "/mnt/models/Qwen-2.5-0.5b", "0")
OPT_MP = ("lmcache", "facebook/opt-125m", "0")
SGLANG_TTFT_EDGES = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                     15.0, 20.0, 25.0, 30.0, INF]

EXPECTED: dict[str, Expected] = {
    "docs-example-model-name-only.prom": Expected(
        {("kvscope_prompt_tokens_total", *LLAMA): 8.128902e6,
         ("kvscope_kv_lookup_tokens_total", *LLAMA): 8.128902e6,
         ("kvscope_kv_cache_usage_ratio", *LLAMA): 0.28,
         ("kvscope_engine_hit_ratio", *LLAMA, "all", "sglang:cache_hit_rate"): 0.007507552643049313,
         ("kvscope_requests_running", *LLAMA): 162,
         ("kvscope_requests_waiting", *LLAMA): 2826},
        {("kvscope_ttft_seconds", *LLAMA): (11008, 2.3518979474117756e6, SGLANG_TTFT_EDGES)}),
    # no cache_source and no HiCache series: the radix cache's hits are G1's
    "v0.5.10.post1-datadog.prom": Expected(
        {("kvscope_prompt_tokens_total", *OPT): 5,
         ("kvscope_kv_lookup_tokens_total", *OPT): 5,
         ("kvscope_kv_hit_tokens_total", *OPT, "G1"): 1,
         ("kvscope_kv_cache_usage_ratio", *OPT): 0.25,
         ("kvscope_engine_hit_ratio", *OPT, "all", "sglang:cache_hit_rate"): 0.2,
         ("kvscope_tier_capacity_tokens", *OPT, "G1"): 430839,
         ("kvscope_requests_running", *OPT): 0,
         ("kvscope_requests_waiting", *OPT): 0},
        {("kvscope_ttft_seconds", *OPT): (1, 0.02, [0.1, INF]),
         ("kvscope_queue_time_seconds", *OPT): (1, 0, [0.001, INF])}),
    "v0.5.1-issue-13485.prom": Expected(
        {("kvscope_requests_running", *QWEN32): 1, ("kvscope_kv_cache_usage_ratio", *QWEN32): 0}),
    "pr-4444-engine-type.prom": Expected(
        {("kvscope_requests_running", *LLAMA3): 0, ("kvscope_kv_cache_usage_ratio", *LLAMA3): 0}),
    # SGLang in gRPC mode re-exposed by SMG: `sglang_` prefix, SMG's worker_addr label beside SGLang's own
    "smg-pr-813-grpc-sidecar.prom": Expected(
        {("kvscope_kv_computed_tokens_total", *LLAMA): 55,
         ("kvscope_engine_hit_ratio", *LLAMA, "all", "sglang:cache_hit_rate"): 0}),
    # dp_rank is the data-parallel index: one series per rank, not summed or dropped
    "dp8-issue-aibrix-1614.prom": Expected(
        {("kvscope_requests_waiting", "sglang", "deepseek-r1", "1"): 0,
         ("kvscope_requests_waiting", "sglang", "deepseek-r1", "3"): 0}),
    # LMCache's hits are not placed in a tier; its prompt tokens are the vLLM adapter's (engine_totals off)
    "on-vllm-0.11.0-drrip-grep.prom": Expected(
        {("kvscope_kv_hit_tokens_total", *QWEN3, "unattributed"): 1529,
         ("kvscope_connector_hit_tokens_total", *QWEN3): 1529}),
    # HELP/TYPE of num_requested_tokens without a sample, `_created` declared a gauge: nothing to read, nothing bad
    "internal-api-pr-1318.prom": Expected(),
    "on-vllm-pr-1100.prom": Expected(
        {("kvscope_kv_hit_tokens_total", *QWEN25, "unattributed"): 0,
         ("kvscope_connector_hit_tokens_total", *QWEN25): 0,
         ("kvscope_connector_lookup_tokens_total", *QWEN25): 0,
         ("kvscope_kv_transfer_bytes_total", *QWEN25, "G4", "G2"): 0}),
    # LMCache's MP server: lookups and hits over L1 and L2 together, so not placed in a tier; cache_salt="" summed
    "mp-server-issue-3640-cpu-smoke.prom": Expected(
        {("kvscope_connector_lookup_tokens_total", *OPT_MP): 960,
         ("kvscope_connector_hit_tokens_total", *OPT_MP): 640,
         ("kvscope_kv_hit_tokens_total", *OPT_MP, "unattributed"): 640}),
    # request counters only: the vllm:* lines are the vLLM adapter's
    "worker-vllm-aicr-2026-03.prom": Expected(),
    # a block size without model_total_kv_blocks is no capacity
    "frontend-mocker-kthena-913.prom": Expected(),
}
BLOCK_SIZES = {"frontend-mocker-kthena-913.prom": 64}


def readme_rows(engine: str) -> list[tuple[str, frozenset[str]]]:
    """(file, engine kinds autodetection names) per row of the folder's table; `\\|` inside a cell is text."""
    rows = []
    for line in (FIXTURES / engine / "captured" / "README.md").read_text().splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if cells and cells[0].startswith("`") and cells[0].endswith(".prom`"):
            rows.append((cells[0].strip("`"), frozenset(k.strip() for k in cells[-1].split(","))))
    return rows


CASES = [pytest.param(engine, name, kinds, id=f"{engine}/{name}")
         for engine in ADAPTERS for name, kinds in readme_rows(engine)]
PAGES = [pytest.param(engine, name, id=f"{engine}/{name}") for engine in ADAPTERS for name, _ in readme_rows(engine)]


@pytest.mark.parametrize("engine", ADAPTERS)
def test_each_readme_lists_every_captured_page(engine: str) -> None:
    folder = FIXTURES / engine / "captured"
    files = {p.name for p in folder.glob("*.prom")}
    assert {name for name, _ in readme_rows(engine)} == files and files <= EXPECTED.keys()
    assert all((folder / name).stat().st_size < 200_000 for name in files)


def read(readings: list[Reading], engine: str) -> tuple[dict[tuple[str, ...], float], dict[tuple[str, ...], tuple[
        float, float, list[float]]]]:
    samples, histograms = {}, {}
    for r in readings:
        if r.name.startswith("kvscope_scrape_") or r.labels[0] != engine:
            continue
        if isinstance(r, HistogramSample):
            histograms[(r.name, *r.labels)] = (r.count, r.sum, [edge for edge, _ in r.buckets])
        else:
            assert isinstance(r, Sample)
            samples[(r.name, *r.labels)] = r.value
    return samples, histograms


@pytest.mark.parametrize(("engine", "name", "kinds"), CASES)
def test_captured_page_over_http(engine: str, name: str, kinds: frozenset[str]) -> None:
    body = page(engine, f"captured/{name}")
    with serving(body) as (server,):
        url = server.url()
        readings = ADAPTERS[engine].collector(url).collect()
        discovered = DiscoveryCollector(DiscoveryOptions(candidates=[url])).collect()
    health = {(r.name, *r.labels): r.value for r in readings if isinstance(r, Sample)}
    assert health[("kvscope_scrape_target_up", engine, url)] == 1
    assert health[("kvscope_scrape_malformed_lines_total", engine, url)] == 0
    assert health[("kvscope_scrape_response_bytes", engine, url)] == len(body)
    samples, histograms = read(readings, engine)
    expected = EXPECTED[name]
    assert samples.keys() == expected.samples.keys()
    assert all(math.isclose(samples[k], v, rel_tol=1e-12) for k, v in expected.samples.items()), samples
    assert histograms.keys() == expected.histograms.keys()
    for key, (count, total, edges) in expected.histograms.items():
        assert histograms[key][0] == count and histograms[key][2] == edges
        assert math.isclose(histograms[key][1], total, rel_tol=1e-12)
    assert {r.labels[0] for r in discovered if r.name == DISCOVERED} == kinds


def collected(engine: str, name: str) -> list[Reading]:
    with serving(page(engine, f"captured/{name}")) as (server,):
        return ADAPTERS[engine].collector(server.url()).collect()


@pytest.mark.parametrize(("engine", "name"), PAGES)
def test_families_the_page_has_and_the_map_knows_are_mapped(engine: str, name: str) -> None:
    table = ADAPTERS[engine].dialect
    found = ExpositionScanner(table.prefixes).scan(page(engine, f"captured/{name}").decode()).samples
    samples, histograms = read(collected(engine, name), engine)
    produced = {key[0] for key in (*samples, *histograms)}
    rules: tuple[Rule | HistogramRule, ...] = (*table.counters, *table.gauges, *table.histograms)
    for rule in rules:
        suffix = "_count" if isinstance(rule, HistogramRule) else ""
        if any(found.get(prefix + rule.name + suffix) for prefix in table.prefixes):
            assert rule.metric in produced, (rule.name, rule.metric)


@pytest.mark.parametrize("name", BLOCK_SIZES)
def test_block_size_is_learned_from_a_captured_frontend_page(name: str) -> None:
    """What autodetection hands KVBM's adapter: tokens per block from the frontend's own gauge."""
    found = ExpositionScanner(("dynamo_",)).scan(page("dynamo", f"captured/{name}").decode())
    assert block_size_of(found) == BLOCK_SIZES[name]
