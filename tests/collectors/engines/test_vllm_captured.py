"""The vLLM collector on /metrics pages captured from real vLLM servers (tests/fixtures/vllm/captured/).

One case per row of that folder's README table: the page is served byte for byte over HTTP on 127.0.0.1 and
scraped by the real collector. Every expected figure is a sample line of the page, quoted below, and the test
first checks that the line is on the page: the numbers come from the captured text, not from kvscope.
"""

from __future__ import annotations

import re

import pytest

from kvscope.agent.core import contract as c
from kvscope.collectors.engines.vllm_map import (
    CACHE_CONFIG,
    COUNTER_RULES,
    GAUGE_RULES,
    HISTOGRAM_RULES,
    OFFLOAD_CONFIG,
)
from kvscope.collectors.engines.vllm_metrics import VllmMetricsCollector, VllmOptions
from kvscope.collectors.scrape.exposition import ExpositionScanner
from testkit.engine_pages import FIXTURES, Readings, as_dict, histogram, serving, value

CAPTURED = FIXTURES / "vllm" / "captured"
USAGE = "kvscope_kv_cache_usage_ratio"
FINISHED = "kvscope_requests_finished_total"


def table_files() -> list[str]:
    """The file column of the README table (a cell that is a backticked .prom name)."""
    rows = re.findall(r"^\| `([^`]+\.prom)` \|", (CAPTURED / "README.md").read_text(), re.MULTILINE)
    assert rows, "no table rows in tests/fixtures/vllm/captured/README.md"
    return rows


# Per page: (page line, kvscope metric, extra labels after (engine, model, dp rank), expected value). The
# value is the line's own number, except where a line gives a capacity (block_size x num_gpu_blocks).
Figure = tuple[str, str, tuple[str, ...], float]
V0 = 'model_name="Qwen/Qwen3-0.6B"'
FIGURES: dict[str, tuple[str, list[Figure]]] = {
    "v0-engine-cpu-multiprocess-whole.prom": ("Qwen/Qwen3-0.6B", [
        (f"vllm:num_requests_running{{{V0}}} 0.0", c.REQUESTS_RUNNING, (), 0.0),
        (f"vllm:num_requests_waiting{{{V0}}} 0.0", c.REQUESTS_WAITING, (), 0.0),
        (f"vllm:gpu_cache_usage_perc{{{V0}}} 0.0", USAGE, (), 0.0),
        (f"vllm:prompt_tokens_total{{{V0}}} 43952.0", c.PROMPT_TOKENS, (), 43952.0),
        (f"vllm:num_preemptions_total{{{V0}}} 0.0", c.PREEMPTIONS, (), 0.0),
        (f'vllm:request_success_total{{finished_reason="length",{V0}}} 38.0', FINISHED, ("length",), 38.0),
        ('vllm:cache_config_info{block_size="16",', c.TIER_CAPACITY_TOKENS, ("G1",), 16 * 2340.0),
        ('num_gpu_blocks="2340"', c.TIER_CAPACITY_TOKENS, ("G1",), 16 * 2340.0),  # the same line's other half
    ]),
    "production-stack-318-v1-fragment.prom": ("Qwen/Qwen2.5-Coder-32B-Instruct", [
        ('vllm:num_requests_running{model_name="Qwen/Qwen2.5-Coder-32B-Instruct"} 0.0', c.REQUESTS_RUNNING, (), 0.0),
        ('vllm:num_requests_waiting{model_name="Qwen/Qwen2.5-Coder-32B-Instruct"} 0.0', c.REQUESTS_WAITING, (), 0.0),
        ('vllm:gpu_cache_usage_perc{model_name="Qwen/Qwen2.5-Coder-32B-Instruct"} 0.0', USAGE, (), 0.0),
    ]),
    "production-stack-617-v0.10.0-fragment.prom": ("zai-org/GLM-4.5", [
        ('vllm:prefix_cache_queries_total{engine="0",model_name="zai-org/GLM-4.5"} 32.0',
         c.KV_LOOKUP_TOKENS, (), 32.0),
        ('vllm:gpu_prefix_cache_hits_total{engine="0",model_name="zai-org/GLM-4.5"} 0.0',
         c.KV_HIT_TOKENS, ("G1",), 0.0),
        ('vllm:kv_cache_usage_perc{engine="0",model_name="zai-org/GLM-4.5"} 9.75010481363281e-06',
         USAGE, (), 9.75010481363281e-06),
    ]),
    "kserve-openshift-tutorial-head40-fragment.prom": ("llama-vllm-single", [
        ('vllm:num_requests_running{engine="0",model_name="llama-vllm-single"} 0.0', c.REQUESTS_RUNNING, (), 0.0),
        ('vllm:num_requests_waiting{engine="0",model_name="llama-vllm-single"} 0.0', c.REQUESTS_WAITING, (), 0.0),
        ('vllm:kv_cache_usage_perc{engine="0",model_name="llama-vllm-single"} 0.0', USAGE, (), 0.0),
        ('vllm:prefix_cache_queries_total{engine="0",model_name="llama-vllm-single"} 0.0',
         c.KV_LOOKUP_TOKENS, (), 0.0),
        ('vllm:prefix_cache_hits_total{engine="0",model_name="llama-vllm-single"} 0.0',
         c.KV_HIT_TOKENS, ("G1",), 0.0),
        ('vllm:prompt_tokens_total{engine="0",model_name="llama-vllm-single"} 0.0', c.PROMPT_TOKENS, (), 0.0),
        ('vllm:num_preemptions_total{engine="0",model_name="llama-vllm-single"} 0.0', c.PREEMPTIONS, (), 0.0),
    ]),
}

# Histograms (page's _count and _sum lines, count, sum) for the pages that have the families kvscope reads.
HISTOGRAMS: dict[str, list[tuple[str, str, float, float]]] = {
    "v0-engine-cpu-multiprocess-whole.prom": [
        ("vllm:time_to_first_token_seconds", c.TTFT_SECONDS, 69.0, 4941.843970537186),
        ("vllm:request_queue_time_seconds", c.QUEUE_SECONDS, 38.0, 0.017765522003173828),
        ("vllm:request_prefill_time_seconds", c.PREFILL_SECONDS, 38.0, 239.16777801513672),
    ],
}

# The kvscope metric each exposed vLLM sample the collector reads lands in.
MAPPED: dict[str, str] = {
    **{rule.sample: rule.metric for rule in (*COUNTER_RULES, *GAUGE_RULES)},
    **{f"{family}_{part}": metric for family, metric in HISTOGRAM_RULES.items() for part in ("bucket", "sum", "count")},
    CACHE_CONFIG: c.TIER_CAPACITY_TOKENS,
    OFFLOAD_CONFIG: c.TIER_CAPACITY_BYTES,
}
_SAMPLE_NAME = re.compile(r"^(vllm:[A-Za-z0-9_:]+)[{ ]", re.MULTILINE)


def scraped(name: str) -> tuple[str, bytes, Readings]:
    """The page served over HTTP and scraped once by the collector: (its URL, its bytes, the readings)."""
    body = (CAPTURED / name).read_bytes()
    with serving(body) as (server,):
        url = server.url()
        readings = as_dict(VllmMetricsCollector(VllmOptions(urls=[url])).collect())
    return url, body, readings


def test_every_page_is_in_the_table_and_has_figures() -> None:
    pages = sorted(p.name for p in CAPTURED.glob("*.prom"))
    assert sorted(table_files()) == pages
    assert sorted(FIGURES) == pages
    assert all(p.stat().st_size < 200_000 for p in CAPTURED.glob("*.prom"))


@pytest.mark.parametrize("name", table_files())
def test_figures_read_off_the_page(name: str) -> None:
    url, body, readings = scraped(name)
    text = body.decode()
    model, figures = FIGURES[name]
    for line, metric, extra, expected in figures:
        assert line in text, f"{name}: the figure's line is not on the page: {line}"
        assert value(readings, metric, "vllm", model, "0", *extra) == expected, (name, line)
    for family, metric, count, total in HISTOGRAMS.get(name, []):
        assert f"{family}_count{{{V0}}} {count}" in text and f"{family}_sum{{{V0}}} {total!r}" in text
        got = histogram(readings, metric, "vllm", model, "0")
        assert (got.count, got.sum) == (count, total), (name, family)
        assert got.buckets[-1] == (float("inf"), count)
    assert value(readings, "kvscope_scrape_target_up", "vllm", url) == 1.0
    assert value(readings, "kvscope_scrape_response_bytes", "vllm", url) == len(body)


@pytest.mark.parametrize("name", table_files())
def test_no_vllm_line_is_malformed(name: str) -> None:
    """Every page here ends on a whole line (a cut-off last line was left out, README), so no line of a
    vllm: family, read or not, may count as malformed."""
    url, body, readings = scraped(name)
    assert value(readings, "kvscope_scrape_malformed_lines_total", "vllm", url) == 0.0
    page = ExpositionScanner(("vllm:",)).scan(body.decode())  # every vllm: family, not only those read
    assert (page.malformed, page.truncated) == (0, False), page.first_problem
    assert page.samples, name


@pytest.mark.parametrize("name", table_files())
def test_every_family_the_map_knows_is_mapped(name: str) -> None:
    _, body, readings = scraped(name)
    on_page = set(_SAMPLE_NAME.findall(body.decode()))
    known = on_page & MAPPED.keys()
    assert known, f"{name}: no family on the page is one the collector reads"
    exported = {metric for metric, labels in readings if labels[:1] == ("vllm",)}
    missing = {sample: MAPPED[sample] for sample in known if MAPPED[sample] not in exported}
    assert not missing, f"{name}: on the page and in the map, but not exported: {missing}"


# -- vLLM 0.8's V1 engine counted its GPU prefix cache in blocks -----------------------------------------------
# The 318 page (captured) ends inside its `gpu_prefix_cache_queries_total` sample line, after the HELP that
# says "blocks". The lines added here follow vLLM 0.8's loggers (the hits HELP is its text) and the
# captured V0 page's `cache_config_info` line; the values are ours.
QWEN = 'model_name="Qwen/Qwen2.5-Coder-32B-Instruct"'
BLOCK_COUNTED_TAIL = (
    f"vllm:gpu_prefix_cache_queries_total{{{QWEN}}} 1000.0\n"
    "# HELP vllm:gpu_prefix_cache_hits_total GPU prefix cache hits, in terms of number of cached blocks.\n"
    "# TYPE vllm:gpu_prefix_cache_hits_total counter\n"
    f"vllm:gpu_prefix_cache_hits_total{{{QWEN}}} 250.0\n"
)
CACHE_CONFIG_LINES = (
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",'
    'num_gpu_blocks="2340"} 1.0\n'
)


def scrape_text(text: str) -> tuple[str, Readings]:
    with serving(text.encode()) as (server,):
        url = server.url()
        return url, as_dict(VllmMetricsCollector(VllmOptions(urls=[url])).collect())


def test_a_prefix_cache_counted_in_blocks_is_turned_into_tokens_by_the_block_size() -> None:
    captured = (CAPTURED / "production-stack-318-v1-fragment.prom").read_text()
    assert captured.endswith("queried blocks.\n# TYPE vllm:gpu_prefix_cache_queries_total counter\n")
    _, readings = scrape_text(captured + BLOCK_COUNTED_TAIL + CACHE_CONFIG_LINES)
    model = "Qwen/Qwen2.5-Coder-32B-Instruct"
    assert value(readings, c.KV_LOOKUP_TOKENS, "vllm", model, "0") == 1000 * 16
    assert value(readings, c.KV_HIT_TOKENS, "vllm", model, "0", "G1") == 250 * 16
    # the same page saying tokens, as every vLLM since 0.9 does: taken as it is
    in_tokens = captured.replace("queried blocks", "queried tokens") + BLOCK_COUNTED_TAIL.replace(
        "cached blocks", "cached tokens") + CACHE_CONFIG_LINES
    _, readings = scrape_text(in_tokens)
    assert value(readings, c.KV_LOOKUP_TOKENS, "vllm", model, "0") == 1000
    assert value(readings, c.KV_HIT_TOKENS, "vllm", model, "0", "G1") == 250


def test_blocks_without_a_block_size_are_left_out_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    captured = (CAPTURED / "production-stack-318-v1-fragment.prom").read_text()
    text = captured + BLOCK_COUNTED_TAIL
    with serving(text.encode()) as (server,):
        url = server.url()
        collector = VllmMetricsCollector(VllmOptions(urls=[url]))
        with caplog.at_level("WARNING", logger="kvscope.collectors.vllm"):
            first, second = as_dict(collector.collect()), as_dict(collector.collect())
    for readings in (first, second):
        assert not {m for m, _ in readings} & {c.KV_LOOKUP_TOKENS, c.KV_HIT_TOKENS}
        assert value(readings, c.REQUESTS_RUNNING, "vllm", "Qwen/Qwen2.5-Coder-32B-Instruct", "0") == 0.0
        assert value(readings, "kvscope_scrape_malformed_lines_total", "vllm", url) == 0.0
    said = [r for r in caplog.records if "counts blocks" in r.getMessage()]
    assert len(said) == 1 and url in said[0].getMessage()
