"""SGLang (HiCache) /metrics → kvscope contract: the name table (data) and the per-page decisions.

Facts: shared/facts/engines.md §3 and SGLang's `metrics/collector.py` / `observability/metrics_collector.py`.
Both prefixes are read (`sglang:` and `sglang_`, seen in releases); each rule takes the first with samples.

Hits per tier come from `cached_tokens_total`:
- with `cache_source` (releases with HiCache's split): `device` → G1, `host` → G2, `storage_<backend>` → the
  backend's tier (`storage_backend_tiers`; the `file` backend by its directory's mount, like KVBM's disk pool);
  SGLang writes the backend's class there (`storage_HiCacheNixl`) and its flag name in `storage_backend`
  labels (`nixl`): collectors/engines/sglang_backends.py reads both as one backend;
  `total` (SGLang's fallback when a request has no split) → the unsplit tier;
- without it (e.g. 0.5.10.post1: `{model_name,tp_rank}` only) → the unsplit tier: G1 when the page shows no
  HiCache series (the radix cache lives on the GPU), else `unattributed` — with HiCache on, a hit may have come
  from host or storage and the page does not say (`unsplit_hits_tier` overrides).
Transfers: `load_back_tokens_total` host → device, `hicache_backup_tokens_total` device → host, and storage
`prefetched_tokens_total` (storage → host) / `backuped_tokens_total` (host → storage), in tokens; bytes from the
engine's own byte counters where a build has them, else tokens × `kv_bytes_per_token`; seconds from the `_sum`
of `load_back_duration_seconds` and `hicache_backup_duration_seconds` (the host link's copy time, which with
the byte counters gives its bandwidth). `evicted_tokens_total` counts G1 slots freed by eviction. Of the per-pool
counters only `pool="kv"` (or no pool) is read: a hybrid model's `swa` pool holds the same tokens' other layers.
`tp_rank` is a tensor-parallel shard, not a data-parallel index: every shard counts the same tokens, so token
counts come from the lowest shard of each (model, dp_rank), and byte counts are summed over the shards.
"""

from __future__ import annotations

from kvscope.agent.core import contract as c
from kvscope.collectors.engines.contract_map import Dialect, HistogramRule, Rule
from kvscope.collectors.engines.sglang_backends import PLACEHOLDERS, backend_key
from kvscope.collectors.engines.vllm_map import USAGE_RATIO
from kvscope.collectors.scrape.exposition import Labels, ScanResult

PREFIXES = ("sglang:", "sglang_")
# series that exist only with HiCache on: their presence makes an unsplit hit unattributed
HICACHE_SERIES = ("hicache_host_total_tokens", "hicache_host_used_tokens", "load_back_tokens_total",
                  "hicache_backup_tokens_total", "prefetched_tokens_total", "backuped_tokens_total")
STORAGE = "storage"  # placeholder for the page's storage tier in the table below


def dialect(storage_tier: str) -> Dialect:
    def link(src: str, dst: str) -> tuple[str, str]:
        return tuple(storage_tier if t == STORAGE else t for t in (src, dst))  # type: ignore[return-value]

    moves = (("load_back_tokens_total", "load_back_bytes_total", "G2", "G1"),
             ("hicache_backup_tokens_total", "hicache_backup_bytes_total", "G1", "G2"),
             ("prefetched_tokens_total", "", STORAGE, "G2"),
             ("backuped_tokens_total", "", "G2", STORAGE))
    counters: list[Rule] = [
        Rule("evicted_tokens_total", c.KV_EVICTED_TOKENS, ("G1",)),
        Rule("load_back_duration_seconds_sum", c.KV_TRANSFER_SECONDS, ("G2", "G1")),
        Rule("hicache_backup_duration_seconds_sum", c.KV_TRANSFER_SECONDS, ("G1", "G2")),
        Rule("prompt_tokens_total", c.KV_LOOKUP_TOKENS),
        Rule("prompt_tokens_total", c.PROMPT_TOKENS),
        Rule("cached_tokens_total", c.KV_HIT_TOKENS, label="cache_source", resolve="cache_source"),
        Rule("realtime_tokens_total", c.KV_COMPUTED_TOKENS, label="mode", resolve="prefill_compute"),
        Rule("num_retracted_requests_total", c.PREEMPTIONS),
    ]
    for tokens, native_bytes, src, dst in moves:
        counters.append(Rule(tokens, c.KV_TRANSFER_TOKENS, link(src, dst), label="pool", resolve="kv_pool"))
        counters.append(Rule(tokens, c.KV_TRANSFER_BYTES, link(src, dst), label="pool", resolve="kv_pool",
                             unit="token_bytes", priority=1))
        if native_bytes:
            counters.append(Rule(native_bytes, c.KV_TRANSFER_BYTES, link(src, dst), shards="sum"))
    gauges = (
        Rule("cache_hit_rate", c.ENGINE_HIT_RATIO, ("all", "sglang:cache_hit_rate")),
        Rule("token_usage", USAGE_RATIO),
        Rule("max_total_num_tokens", c.TIER_CAPACITY_TOKENS, ("G1",)),
        Rule("hicache_host_total_tokens", c.TIER_CAPACITY_TOKENS, ("G2",)),
        Rule("hicache_host_used_tokens", c.TIER_USED_TOKENS, ("G2",)),
        Rule("num_running_reqs", c.REQUESTS_RUNNING),
        Rule("num_queue_reqs", c.REQUESTS_WAITING),
    )
    histograms = (
        HistogramRule("time_to_first_token_seconds", c.TTFT_SECONDS),
        HistogramRule("queue_time_seconds", c.QUEUE_SECONDS),
        HistogramRule("prefetch_bandwidth", c.KV_TRANSFER_BANDWIDTH, link(STORAGE, "G2"), unit="gb"),
        HistogramRule("backup_bandwidth", c.KV_TRANSFER_BANDWIDTH, link("G2", STORAGE), unit="gb"),
    )
    return Dialect(PREFIXES, tuple(counters), gauges, histograms)


def sglang_labels(labels: Labels, model: str = "") -> tuple[str, str, str]:
    """(model, dp_rank, shard): the shard is the tensor-parallel rank (and pipeline stage, where present); a
    sample without `model_name` takes `model`, the target's."""
    tp, pp = labels.get("tp_rank", "0"), labels.get("pp_rank")
    shard = tp if pp in (None, "0") else f"{pp}.{tp}"
    return labels.get("model_name") or model, labels.get("dp_rank", "0"), shard


def has_hicache(page: ScanResult) -> bool:
    return any(page.samples.get(p + name) for p in PREFIXES for name in HICACHE_SERIES)


def storage_backends(page: ScanResult) -> set[str]:
    """Backends the page names (sglang_backends.backend_key of `cache_source="storage_<class>"` values and of
    `storage_backend` labels), without SGLang's placeholders for no backend."""
    found: set[str] = set()
    for name, rows in page.samples.items():
        for labels, _ in rows:
            source = labels.get("cache_source", "")
            if source.startswith("storage_"):
                found.add(backend_key(source))
            if labels.get("storage_backend") and name.endswith(("prefetched_tokens_total", "backuped_tokens_total")):
                found.add(backend_key(labels["storage_backend"]))
    return found - PLACEHOLDERS

