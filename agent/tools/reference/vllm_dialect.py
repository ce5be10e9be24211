"""The reference engine's /metrics, in vLLM's dialect (shared/facts/vllm.md §1), on its own registry.

Names, label names and buckets are vLLM 0.33's. Tier mapping (the part vLLM has no single word for):
- G1 prefix hits are vLLM's local prefix cache (`prefix_cache_hits`, source="device");
- G2/G3/G4 hits come through a KV connector (`external_prefix_cache_*`, `prompt_tokens_by_source`
  "external_kv_transfer"); `prompt_tokens_cached_by_source` says G2 = "host", G3 = "disk" and
  G4 = "external_unspecified" (vLLM's value for a connector that does not name its tier, e.g. LMCache):
  a scraper must be told `external_unspecified` → G4 for this engine (docs/reference-pipeline.md);
- G2 → G1 and G1 → G2 copies are the OffloadingConnector's `kv_offload_load_*` / `kv_offload_store_*`;
- G3/G4 ↔ host I/O is the TieringOffloadingSpec's `kv_offload_tiering_{read,write}_{bytes,time}` with
  tier="1:fs" (G3) and tier="2:fs" (G4).
- vLLM's newer families, from what the store does: `kv_block_{lifetime,idle_before_evict,reuse_gap}_seconds`
  for G1 (block_ages.py, every block, as `--kv-cache-metrics-sample 1` would); `num_requests_waiting_by_reason`
  (all "capacity"); `kv_offload_cpu_cache_usage_perc`, G2 slots held for the request in flight;
  `kv_offload_tiering_lookup_sync_delay_seconds{tier}`, the time of each block's lookup in G3/G4 (an index
  in memory, so microseconds); `kv_offload_tiering_{promotion,cascade}_job_failures{tier}`, block files that
  could not be read up or written down.
With `version=(0, 14)` it speaks vLLM 0.14.1, the seeds' version (facts/vllm.md appendix): no
`prompt_tokens_by_source`, `prompt_tokens_cached`, `prompt_tokens_cached_by_source` and no `kv_offload_*`
families (its connector, e.g. Dynamo KVBM, reports its own tiers); recomputed tokens are only in the
`request_prefill_kv_computed_tokens` histogram, which both versions have.
Two non-vLLM series describe the fake device: `kvscope_reference_device_busy` (0/1) and
`kvscope_reference_device_busy_seconds_total`, plus `kvscope_reference_block_errors_total{tier,kind}`.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kvscope.agent.core.tiers import Tier
from kvscope.agent.tools.reference.tierstore import Transfer

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
REQUEST_TOKENS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
OFFLOAD_SIZE_BUCKETS = (1e6, 5e6, 10e6, 20e6, 40e6, 60e6, 80e6, 100e6, 150e6, 200e6)
RESIDENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600,
                     1200, 1800)  # vllm/v1/metrics/buckets.py KV_CACHE_RESIDENCY_BUCKETS
LOOKUP_SYNC_BUCKETS = (0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1)  # tiering/spec.py

CACHED_SOURCE = {Tier.G1: "device", Tier.G2: "host", Tier.G3: "disk", Tier.G4: "external_unspecified"}
ALL_CACHED_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
TIERING_LABEL = {Tier.G3: "1:fs", Tier.G4: "2:fs"}
BASE = ["model_name", "engine"]


class VllmMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str, engine: str = "0",
                 cache_info: dict[str, str] | None = None, offload_info: dict[str, str] | None = None,
                 version: tuple[int, int] = (0, 33)) -> None:
        self.labels = (model_name, engine)
        self.by_source = version >= (0, 32)  # prompt_tokens_{by_source,cached,cached_by_source}
        self.offload = version >= (0, 33)  # kv_offload_* (0.14's offloading connector reports none)
        r = registry

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, [*BASE, *extra], registry=r)

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, BASE, buckets=buckets, registry=r)

        self.running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                             BASE, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                             BASE, registry=r)
        # every waiting request waits for capacity here: nothing defers one
        self.waiting_by_reason = Gauge("vllm:num_requests_waiting_by_reason", "Number of waiting requests by "
                                       "reason.", [*BASE, "reason"], registry=r) if version >= (0, 20) else None
        self.usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", BASE,
                           registry=r)
        self.queries = counter("vllm:prefix_cache_queries",
                               "Prefix cache queries, in terms of number of queried tokens.")
        self.hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self.ext_queries = counter("vllm:external_prefix_cache_queries",
                                   "External prefix cache queries from KV connector cross-instance cache "
                                   "sharing, in terms of number of queried tokens.")
        self.ext_hits = counter("vllm:external_prefix_cache_hits",
                                "External prefix cache hits from KV connector cross-instance cache sharing, "
                                "in terms of number of cached tokens.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        if self.by_source:
            self.prompt_by_source = counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.",
                                            ("source",))
            self.prompt_cached = counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens.")
            self.cached_by_source = counter("vllm:prompt_tokens_cached_by_source",
                                            "Prefix-cache hit tokens by the cache tier that supplied them.",
                                            ("source",))
        self.computed = Histogram("vllm:request_prefill_kv_computed_tokens",
                                  "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
                                  BASE, buckets=REQUEST_TOKENS_BUCKETS, registry=r)
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.success = counter("vllm:request_success", "Count of successfully processed requests.",
                               ("finished_reason",))
        self.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                         TTFT_BUCKETS)
        self.queue = hist("vllm:request_queue_time_seconds",
                          "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.prefill = hist("vllm:request_prefill_time_seconds",
                            "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS)
        self.decode = hist("vllm:request_decode_time_seconds",
                           "Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY_BUCKETS)
        self.inference = hist("vllm:request_inference_time_seconds",
                              "Histogram of time spent in RUNNING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                        REQUEST_LATENCY_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                        ITL_BUCKETS)
        # --kv-cache-metrics (0.14.1 and 0.33): G1 block ages (block_ages.py)
        self.block_lifetime = hist("vllm:kv_block_lifetime_seconds", "Histogram of KV cache block lifetime from "
                                   "allocation to eviction.", RESIDENCY_BUCKETS)
        self.block_idle = hist("vllm:kv_block_idle_before_evict_seconds", "Histogram of idle time before KV cache "
                               "block eviction.", RESIDENCY_BUCKETS)
        self.block_reuse_gap = hist("vllm:kv_block_reuse_gap_seconds", "Histogram of time gaps between "
                                    "consecutive KV cache block accesses.", RESIDENCY_BUCKETS)
        if self.offload:
            self._offload_families(r, counter)
        self.busy = Gauge("kvscope_reference_device_busy", "1 while the reference device slot computes.", BASE,
                          registry=r)
        self.busy_seconds = counter("kvscope_reference_device_busy_seconds",
                                    "Seconds the reference device slot spent computing.")
        self.block_errors = counter("kvscope_reference_block_errors",
                                    "Block files that could not be used (a miss, never data).", ("tier", "kind"))
        if cache_info is not None:
            info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                         [*sorted(cache_info), "engine"], registry=r)
            info.labels(*[cache_info[k] for k in sorted(cache_info)], engine).set(1)
        if offload_info is not None and self.offload:
            oinfo = Gauge("vllm:kv_offload_config_info", "KV offloading configuration.",
                          [*BASE, *sorted(offload_info)], registry=r)
            oinfo.labels(*self.labels, *[offload_info[k] for k in sorted(offload_info)]).set(1)
        self._touch_children()

    def _offload_families(self, r: CollectorRegistry, counter: Callable[..., Counter]) -> None:
        self.load_bytes = counter("vllm:kv_offload_load_bytes", "Total bytes loaded from offload to GPU.")
        self.load_time = counter("vllm:kv_offload_load_time", "Total time loading from offload to GPU (s).")
        self.load_size = Histogram("vllm:kv_offload_load_size", "Bytes per load.", BASE,
                                   buckets=OFFLOAD_SIZE_BUCKETS, registry=r)
        self.store_bytes = counter("vllm:kv_offload_store_bytes", "Total bytes stored from GPU to offload.")
        self.store_time = counter("vllm:kv_offload_store_time", "Total time storing from GPU to offload (s).")
        self.store_size = Histogram("vllm:kv_offload_store_size", "Bytes per store.", BASE,
                                    buckets=OFFLOAD_SIZE_BUCKETS, registry=r)
        self.tier_read_bytes = counter("vllm:kv_offload_tiering_read_bytes", "Bytes read from the tier.",
                                       ("tier",))
        self.tier_read_time = counter("vllm:kv_offload_tiering_read_time", "Seconds reading from the tier.",
                                      ("tier",))
        self.tier_write_bytes = counter("vllm:kv_offload_tiering_write_bytes", "Bytes written to the tier.",
                                        ("tier",))
        self.tier_write_time = counter("vllm:kv_offload_tiering_write_time", "Seconds writing to the tier.",
                                       ("tier",))
        self.promotion_failures = counter("vllm:kv_offload_tiering_promotion_job_failures",
                                          "Number of failed secondary-tier promotion jobs, labeled by tier.", ("tier",))
        self.cascade_failures = counter("vllm:kv_offload_tiering_cascade_job_failures",
                                        "Number of failed secondary-tier cascade jobs, labeled by tier.", ("tier",))
        self.lookup_sync = Histogram("vllm:kv_offload_tiering_lookup_sync_delay_seconds", "Blocking time of a "
                                     "per-block tier lookup, labeled by tier, in seconds.", [*BASE, "tier"],
                                     buckets=LOOKUP_SYNC_BUCKETS, registry=r)
        self.cpu_pinned = Gauge("vllm:kv_offload_cpu_cache_usage_perc", "Fraction of CPU KV-cache space currently "
                                "pinned by active transfers.", BASE, registry=r)

    def _touch_children(self) -> None:
        """Every series exists from the start at 0, as vLLM creates its children up front."""
        for metric in (self.queries, self.hits, self.ext_queries, self.ext_hits, self.prompt_tokens,
                       self.generation_tokens, self.preemptions, self.busy_seconds, self.running, self.waiting,
                       self.usage, self.busy):
            metric.labels(*self.labels)
        for reason in ("stop", "length", "abort", "error", "repetition"):
            self.success.labels(*self.labels, reason)
        if self.waiting_by_reason is not None:
            for reason in ("capacity", "deferred"):
                self.waiting_by_reason.labels(*self.labels, reason)
        if self.by_source:
            self.prompt_cached.labels(*self.labels)
            for source in ("local_compute", "local_cache_hit", "external_kv_transfer"):
                self.prompt_by_source.labels(*self.labels, source)
            for source in ALL_CACHED_SOURCES:
                self.cached_by_source.labels(*self.labels, source)
        if self.offload:
            for metric in (self.load_bytes, self.load_time, self.store_bytes, self.store_time):
                metric.labels(*self.labels)
            for tier in TIERING_LABEL.values():
                for m in (self.tier_read_bytes, self.tier_read_time, self.tier_write_bytes, self.tier_write_time,
                          self.promotion_failures, self.cascade_failures):
                    m.labels(*self.labels, tier)
            self.cpu_pinned.labels(*self.labels)

    def queued(self, delta: int) -> None:
        """A request joined (+1) or left (-1) the waiting queue."""
        self.waiting.labels(*self.labels).inc(delta)
        if self.waiting_by_reason is not None:
            self.waiting_by_reason.labels(*self.labels, "capacity").inc(delta)

    def failed(self, tier: Tier, kind: str) -> None:
        """A block file the store could not use: a failed cascade (writing it down, or reading it to write it
        further down) or promotion (reading it up)."""
        if self.offload and tier in TIERING_LABEL:
            failures = self.cascade_failures if kind in ("write", "cascade_read") else self.promotion_failures
            failures.labels(*self.labels, TIERING_LABEL[tier]).inc()

    def pinned(self, share: float) -> None:
        if self.offload:
            self.cpu_pinned.labels(*self.labels).set(share)

    def looked_up(self, seconds_by_tier: dict[Tier, list[float]]) -> None:
        if self.offload:
            for tier, seconds in seconds_by_tier.items():
                if tier in TIERING_LABEL:
                    child = self.lookup_sync.labels(*self.labels, TIERING_LABEL[tier])
                    for x in seconds:
                        child.observe(x)

    def admitted(self, prompt_tokens: int, hit_tokens: dict[Tier, int], has_connector: bool) -> None:
        """At the first schedule: what the prefix lookup found (counted at admission, as vLLM does)."""
        local = hit_tokens.get(Tier.G1, 0)
        external = sum(v for t, v in hit_tokens.items() if t is not Tier.G1)
        self.queries.labels(*self.labels).inc(prompt_tokens)
        self.hits.labels(*self.labels).inc(local)
        if has_connector:
            self.ext_queries.labels(*self.labels).inc(prompt_tokens - local)
            self.ext_hits.labels(*self.labels).inc(external)
        if self.by_source:
            for tier, tokens in hit_tokens.items():
                if tokens:
                    self.cached_by_source.labels(*self.labels, CACHED_SOURCE[tier]).inc(tokens)

    def prefilled(self, prompt_tokens: int, local: int, external: int) -> None:
        self.prompt_tokens.labels(*self.labels).inc(prompt_tokens)
        if self.by_source:
            self.prompt_cached.labels(*self.labels).inc(local + external)
            self.prompt_by_source.labels(*self.labels, "local_cache_hit").inc(local)
            self.prompt_by_source.labels(*self.labels, "external_kv_transfer").inc(external)
            self.prompt_by_source.labels(*self.labels, "local_compute").inc(prompt_tokens - local - external)

    def transfer(self, t: Transfer) -> None:
        if not self.offload:
            return
        if t.dst is Tier.G1:
            self.load_bytes.labels(*self.labels).inc(t.bytes)
            self.load_time.labels(*self.labels).inc(t.seconds)
            self.load_size.labels(*self.labels).observe(t.bytes)
        elif t.src is Tier.G1:
            self.store_bytes.labels(*self.labels).inc(t.bytes)
            self.store_time.labels(*self.labels).inc(t.seconds)
            self.store_size.labels(*self.labels).observe(t.bytes)
        elif t.src in TIERING_LABEL:
            self.tier_read_bytes.labels(*self.labels, TIERING_LABEL[t.src]).inc(t.bytes)
            self.tier_read_time.labels(*self.labels, TIERING_LABEL[t.src]).inc(t.seconds)
        elif t.dst in TIERING_LABEL:
            self.tier_write_bytes.labels(*self.labels, TIERING_LABEL[t.dst]).inc(t.bytes)
            self.tier_write_time.labels(*self.labels, TIERING_LABEL[t.dst]).inc(t.seconds)

    def finished(self, ttft: float, queue: float, prefill: float, decode: float, e2e: float,
                 itls: list[float], generated: int, reason: str, computed: int = 0) -> None:
        L = self.labels
        self.computed.labels(*L).observe(computed)  # vLLM counts a request's computed tokens when it finishes
        self.ttft.labels(*L).observe(ttft)
        self.queue.labels(*L).observe(queue)
        self.prefill.labels(*L).observe(prefill)
        self.decode.labels(*L).observe(decode)
        self.inference.labels(*L).observe(prefill + decode)
        self.e2e.labels(*L).observe(e2e)
        for x in itls:
            self.itl.labels(*L).observe(x)
        self.generation_tokens.labels(*L).inc(generated)
        self.success.labels(*L, reason).inc()
