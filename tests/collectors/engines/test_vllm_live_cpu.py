"""The vLLM collector on a whole /metrics page captured from a live vLLM 0.32.0 (CPU build) with prefix caching
(tests/fixtures/vllm/live-cpu-0.32.0/README.md), served byte for byte over HTTP. Every expected figure is read
off the page with prometheus_client's parser, not written here: the test fails if kvscope reads the page
differently, and if a hit the page places in a tier is left unattributed."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from kvscope.collectors.engines.vllm_metrics import VllmMetricsCollector, VllmOptions
from testkit.engine_pages import FIXTURES, as_dict, histogram, series, serving, value

PAGE = FIXTURES / "vllm" / "live-cpu-0.32.0" / "metrics.prom"
TIER_OF_CACHED_SOURCE = {"device": "G1", "host": "G2", "disk": "G3"}  # vLLM 0.32 prompt_tokens_cached_by_source


def page_values() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(PAGE.read_text()):
        for s in family.samples:
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("engine", "model_name"))))] = (
                s.value)
    return out


def test_live_cpu_page_read_into_the_contract() -> None:
    p = page_values()
    model = next(s.labels["model_name"] for f in text_string_to_metric_families(PAGE.read_text())
                 for s in f.samples if "model_name" in s.labels)
    lab = ("vllm", model, "0")
    with serving(PAGE.read_bytes()) as (server,):
        r = as_dict(VllmMetricsCollector(VllmOptions(urls=[server.url()])).collect())
    assert value(r, "kvscope_kv_lookup_tokens_total", *lab) == p[("vllm:prefix_cache_queries_total", ())]
    assert value(r, "kvscope_prompt_tokens_total", *lab) == p[("vllm:prompt_tokens_total", ())]
    assert value(r, "kvscope_kv_computed_tokens_total", *lab) == p[
        ("vllm:prompt_tokens_by_source_total", (("source", "local_compute"),))]
    # hits per tier as the page splits them; none left unattributed, and together all the cached tokens
    hits = {labels[3]: value(r, "kvscope_kv_hit_tokens_total", *labels)
            for labels in series(r, "kvscope_kv_hit_tokens_total")}
    for source, tier in TIER_OF_CACHED_SOURCE.items():
        assert hits[tier] == p[("vllm:prompt_tokens_cached_by_source_total", (("source", source),))], source
    assert hits["G1"] == p[("vllm:prefix_cache_hits_total", ())] > 0
    assert hits["unattributed"] == p[("vllm:external_prefix_cache_hits_total", ())] == 0
    assert sum(hits.values()) == p[("vllm:prompt_tokens_cached_total", ())]
    ttft = histogram(r, "kvscope_ttft_seconds", *lab)
    assert (ttft.count, ttft.sum) == (p[("vllm:time_to_first_token_seconds_count", ())],
                                      p[("vllm:time_to_first_token_seconds_sum", ())])
    assert value(r, "kvscope_requests_finished_total", *lab, "length") == p[
        ("vllm:request_success_total", (("finished_reason", "length"),))]
    config = next(labels for (name, labels) in p if name == "vllm:cache_config_info")
    block, blocks = dict(config)["block_size"], dict(config)["num_gpu_blocks"]
    assert value(r, "kvscope_tier_capacity_tokens", *lab, "G1") == int(block) * int(blocks) == int(
        dict(config)["kv_cache_size_tokens"])
    assert value(r, "kvscope_scrape_malformed_lines_total", "vllm", server.url()) == 0
