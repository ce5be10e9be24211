"""NVIDIA Dynamo's frontend and worker /metrics (`dynamo_frontend_*`, `dynamo_component_*`), normalised to the
engine contract under `engine="dynamo"`.

Facts: shared/facts/engines.md §1.3 and its appendix on real captures. The frontend (`python -m
dynamo.frontend`) serves /metrics on `DYN_HTTP_PORT` (8000); a worker on `DYN_SYSTEM_PORT` (often 8081), with
the engine's own lines (`vllm:*`, `sglang:*`) passed through on the same page.

- frontend TTFT (`dynamo_frontend_time_to_first_token_seconds{model}`) → `kvscope_ttft_seconds`, Dynamo's bucket
  edges kept (0 … 480 s); it includes routing, so it is not the engine's TTFT;
- `dynamo_frontend_input_sequence_tokens` (`_sum`) → `kvscope_prompt_tokens_total`;
- `dynamo_frontend_requests_total{status}` → `kvscope_requests_finished_total{reason}` (success, error);
- `dynamo_frontend_cached_tokens` (`_sum`) → `kvscope_kv_cached_tokens_total`: the router's predicted overlap
  (a live 1.6.1 frontend's equals its router's `kv_selected_cached_prefix_tokens_total`), not an engine's hits;
- `dynamo_frontend_kv_hit_rate` (older builds; 1.6.1 serves none) and the workers' `gpu_prefix_cache_hit_rate`
  → `kvscope_engine_hit_ratio{tier="G1"}`;
- `dynamo_frontend_model_total_kv_blocks` × `model_kv_cache_block_size` → `kvscope_tier_capacity_tokens{G1}`:
  one worker's G1 (each worker serving the model has as many), not the sum over workers;
- the workers' `gpu_cache_usage_percent` (a 0–1 ratio despite the name; `kvstats_` in some builds; 1.6.1's
  workers serve none: their engine's `vllm:kv_cache_usage_perc` is the vLLM adapter's) →
  `kvscope_kv_cache_usage_ratio`.

No double counting: this adapter reads only `dynamo_*` names, so the `vllm:*` lines of a worker page are the
vLLM adapter's alone (point both at the page), and series in the `kvbm_connector_leader` namespace (older
builds' KVBM counters) are the `dynamo_kvbm` adapter's. Hits per tier are not taken from Dynamo: the engine
adapters and KVBM report them.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.agent.core import contract as c
from kvscope.agent.core.pipeline import CollectorContext, CollectorSpec
from kvscope.agent.core.readings import Sample
from kvscope.collectors.engines.contract_map import Dialect, EngineNormaliser, HistogramRule, Normalised, Rule
from kvscope.collectors.engines.kvbm_map import LEGACY_NAMESPACE
from kvscope.collectors.engines.page_scrape import SCRAPE_METRICS, EngineCollector, PageScraper, ScrapeOptions
from kvscope.collectors.engines.vllm_map import REQUESTS_FINISHED, USAGE_RATIO
from kvscope.collectors.engines.vllm_metrics import METRICS as VLLM_METRICS
from kvscope.collectors.scrape.exposition import Labels, ScanResult
from kvscope.collectors.scrape.fetch import Fetcher

NAME = "dynamo"
PREFIX = "dynamo_"
TOTAL_BLOCKS = "frontend_model_total_kv_blocks"
BLOCK_SIZE = "frontend_model_kv_cache_block_size"

DIALECT = Dialect(
    (PREFIX,),
    counters=(
        Rule("frontend_input_sequence_tokens_sum", c.PROMPT_TOKENS),
        Rule("frontend_cached_tokens_sum", c.KV_CACHED_TOKENS),
        Rule("frontend_requests_total", REQUESTS_FINISHED, label="status", resolve="verbatim"),
    ),
    gauges=(
        Rule("frontend_kv_hit_rate", c.ENGINE_HIT_RATIO, ("G1", "dynamo_frontend_kv_hit_rate")),
        Rule("component_gpu_cache_usage_percent", USAGE_RATIO),
        Rule("component_kvstats_gpu_cache_usage_percent", USAGE_RATIO, priority=1),
        Rule("component_gpu_prefix_cache_hit_rate", c.ENGINE_HIT_RATIO,
             ("G1", "dynamo_component_gpu_prefix_cache_hit_rate")),
        Rule("component_kvstats_gpu_prefix_cache_hit_rate", c.ENGINE_HIT_RATIO,
             ("G1", "dynamo_component_kvstats_gpu_prefix_cache_hit_rate")),
    ),
    histograms=(HistogramRule("frontend_time_to_first_token_seconds", c.TTFT_SECONDS),),
)
METRICS = (*SCRAPE_METRICS, *(m for m in VLLM_METRICS if m.name in (REQUESTS_FINISHED, USAGE_RATIO)),
           *(m for m in c.ENGINE_EXTRA_METRICS if m.name in (c.KV_CACHED_TOKENS, c.ENGINE_HIT_RATIO)))


def dynamo_labels(labels: Labels) -> tuple[str, str, str] | None:
    """(model, dp_rank, shard) of a Dynamo series; None for KVBM's namespace (the dynamo_kvbm adapter's)."""
    if labels.get("dynamo_namespace") == LEGACY_NAMESPACE:
        return None
    return labels.get("model") or labels.get("model_name", ""), labels.get("dp_rank", "0"), "0"


@dataclass
class DynamoOptions(ScrapeOptions):
    engine: str = "dynamo"  # frontend and worker pages in urls, e.g. http://127.0.0.1:8000/metrics

    def validate(self, path: str) -> None:
        self.check_scrape(NAME)


class DynamoNormaliser:
    def __init__(self, engine: str) -> None:
        self.engine = engine
        self._rules = EngineNormaliser(engine, DIALECT, dynamo_labels, {"verbatim": lambda v: ((v,), 0)})

    def normalise(self, page: ScanResult) -> Normalised:
        out = self._rules.normalise(page)
        blocks = {dynamo_labels(lb): v for lb, v in page.samples.get(PREFIX + TOTAL_BLOCKS, ())}
        for labels, size in page.samples.get(PREFIX + BLOCK_SIZE, ()):
            base = dynamo_labels(labels)
            if base is not None and base in blocks:
                out.readings.append(Sample(c.TIER_CAPACITY_TOKENS, (self.engine, *base[:2], "G1"),
                                           blocks[base] * size))
        return out

    @staticmethod
    def wanted() -> frozenset[str]:
        return DIALECT.wanted() | {PREFIX + TOTAL_BLOCKS, PREFIX + BLOCK_SIZE}


class DynamoCollector(EngineCollector):
    def __init__(self, options: DynamoOptions, fetch: Fetcher | None = None) -> None:
        normaliser = DynamoNormaliser(options.engine)
        super().__init__(PageScraper(NAME, options.urls, (PREFIX,), normaliser.wanted(),
                                     lambda _url, page: normaliser.normalise(page), options.scrape_timeout_seconds,
                                     options.max_response_bytes, fetch), options.engine)


def _factory(options: DynamoOptions, context: CollectorContext) -> DynamoCollector:
    return DynamoCollector(options)


SPEC = CollectorSpec(
    name=NAME,
    description="NVIDIA Dynamo frontend and worker /metrics (frontend TTFT, prompt tokens, requests, G1 "
                "capacity, the router's and workers' own hit rates)",
    options=DynamoOptions,
    factory=_factory,
    metrics=METRICS,
    enabled_by_default=False,
)
