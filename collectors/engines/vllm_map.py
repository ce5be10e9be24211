"""vLLM /metrics → kvscope contract: the name tables (data) and the pure normaliser over a scanned page.

The reasoning behind every row (which series gives hits per tier, when a deprecated or alias name is
used, what a tiering read of the primary tier means) is in collectors/engines/vllm_metrics.py's docstring.
Each rule names one exposed vLLM sample; the normaliser turns matching samples into readings with
labels (engine, model, dp_rank, *extra). Two levels of precedence stop double counting:

- `group`/`rank`: within one engine, of the rules sharing a group only those of the lowest rank that
  has any sample on the page are used (hits by source, else G1 hits + external hits);
- `priority`: within one output series, only the contributions of the lowest priority present are
  used (new names over deprecated ones over aliases); those of equal priority are summed.
"""

from __future__ import annotations

import fnmatch
import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kvscope.agent.core import contract as c
from kvscope.agent.core.readings import HistogramSample, Reading, Sample
from kvscope.agent.core.tiers import Tier
from kvscope.collectors.scrape.exposition import ScanResult

USAGE_RATIO = "kvscope_kv_cache_usage_ratio"
REQUESTS_FINISHED = "kvscope_requests_finished_total"
# vLLM's newer families (docs/vllm.md, "Newer families"): eviction and reuse as the engine measures them,
# waiting requests by reason, the offload tier's space pinned by transfers, tier lookups and failed jobs
BLOCK_LIFETIME = c.KV_LIFETIME_SECONDS  # one family with LMCache MP's (agent/core/contract.py)
BLOCK_IDLE_BEFORE_EVICT = c.KV_IDLE_BEFORE_EVICT_SECONDS
BLOCK_REUSE_GAP = c.KV_REUSE_GAP_SECONDS
REQUESTS_WAITING_BY_REASON = "kvscope_requests_waiting_by_reason"
TIER_PINNED_RATIO = "kvscope_tier_transfer_pinned_ratio"
TIER_LOOKUP_DELAY = "kvscope_tier_lookup_delay_seconds"
TRANSFER_FAILED_JOBS = "kvscope_kv_transfer_failed_jobs_total"

# A source tier value meaning "another adapter reports these hits": the KV connector's own adapter (Dynamo
# KVBM, LMCache) places them in tiers, so the vLLM adapter leaves them out instead of counting them twice.
CONNECTOR = "connector"
# Cache-hit `source` (vLLM CacheHitSource, facts §1.2) → tier. Configurable; unknown values → unattributed.
DEFAULT_SOURCE_TIERS: dict[str, str] = {
    "device": "G1",
    "host": "G2",
    "disk": "G3",
    "p2p": "unattributed",
    "external_unspecified": "unattributed",
}
# Tiering `tier` label ("0:primary", "<idx+1>:<type>", facts §1.3) → tier. Exact keys first, then the
# glob patterns in table order; no match → unattributed (logged once per value). Configurable: the type
# strings are unconfirmed, and tier managers named by class ("1:StripedFileSystemTierManager") are seen in
# the field. The rule: index 0 is the primary (G2); a shared, remote or object store is G4; the first file
# system below the primary is local (G3), a deeper one is taken as shared (G4).
DEFAULT_TIERING_TIERS: dict[str, str] = {
    "0:primary": "G2", "1:fs": "G3", "2:fs": "G4",
    "*:obj": "G4", "0:*": "G2",
    "*:*Shared*": "G4", "*:*Remote*": "G4", "*:*[Oo]bj*": "G4", "*:*S3*": "G4",
    "1:*File[Ss]ystem*": "G3", "[2-9]:*File[Ss]ystem*": "G4",
}

Extra = tuple[str, ...]
# A resolver reads one vLLM label value: (extra label values, priority), or None to ignore the sample.
Resolver = Callable[[str], tuple[Extra, int] | None]


@dataclass(frozen=True, slots=True)
class Rule:
    sample: str  # exposed vLLM sample name
    metric: str  # kvscope metric
    extra: Extra = ()  # fixed extra label values (when `label` is empty)
    label: str = ""  # vLLM label whose value gives the extra labels through resolver `resolve`
    resolve: str = ""
    priority: int = 0
    group: str = ""
    rank: int = 0


G1, G2 = Tier.G1.value, Tier.G2.value
HITS = "hits"
V = "vllm:"

COUNTER_RULES: tuple[Rule, ...] = (
    Rule(f"{V}prefix_cache_queries_total", c.KV_LOOKUP_TOKENS),
    Rule(f"{V}gpu_prefix_cache_queries_total", c.KV_LOOKUP_TOKENS, priority=1),  # ≤0.11 alias
    Rule(f"{V}prompt_tokens_cached_by_source_total", c.KV_HIT_TOKENS, label="source", resolve="source",
         group=HITS, rank=0),
    Rule(f"{V}prefix_cache_hits_total", c.KV_HIT_TOKENS, (G1,), group=HITS, rank=1),
    Rule(f"{V}gpu_prefix_cache_hits_total", c.KV_HIT_TOKENS, (G1,), priority=1, group=HITS, rank=1),
    Rule(f"{V}external_prefix_cache_hits_total", c.KV_HIT_TOKENS, label="", resolve="external",
         group=HITS, rank=1),
    Rule(f"{V}prompt_tokens_by_source_total", c.KV_COMPUTED_TOKENS, label="source", resolve="computed"),
    Rule(f"{V}request_prefill_kv_computed_tokens_sum", c.KV_COMPUTED_TOKENS, priority=1),
    Rule(f"{V}prompt_tokens_total", c.PROMPT_TOKENS),
    Rule(f"{V}request_success_total", REQUESTS_FINISHED, label="finished_reason", resolve="verbatim"),
    Rule(f"{V}kv_offload_load_bytes_total", c.KV_TRANSFER_BYTES, (G2, G1)),
    Rule(f"{V}kv_offload_load_time_total", c.KV_TRANSFER_SECONDS, (G2, G1)),
    Rule(f"{V}kv_offload_store_bytes_total", c.KV_TRANSFER_BYTES, (G1, G2)),
    Rule(f"{V}kv_offload_store_time_total", c.KV_TRANSFER_SECONDS, (G1, G2)),
    Rule(f"{V}kv_offload_total_bytes_total", c.KV_TRANSFER_BYTES, label="transfer_type", resolve="transfer_type"),
    Rule(f"{V}kv_offload_total_time_total", c.KV_TRANSFER_SECONDS, label="transfer_type", resolve="transfer_type"),
    Rule(f"{V}kv_offload_tiering_read_bytes_total", c.KV_TRANSFER_BYTES, label="tier", resolve="tiering_read"),
    Rule(f"{V}kv_offload_tiering_read_time_total", c.KV_TRANSFER_SECONDS, label="tier", resolve="tiering_read"),
    Rule(f"{V}kv_offload_tiering_write_bytes_total", c.KV_TRANSFER_BYTES, label="tier", resolve="tiering_write"),
    Rule(f"{V}kv_offload_tiering_write_time_total", c.KV_TRANSFER_SECONDS, label="tier", resolve="tiering_write"),
    Rule(f"{V}num_preemptions_total", c.PREEMPTIONS),
    # disaggregated prefill: KV pulled from a peer engine over NIXL (a histogram's _sum is its running total)
    Rule(f"{V}nixl_bytes_transferred_sum", c.PEER_TRANSFER_BYTES),
    Rule(f"{V}nixl_xfer_time_seconds_sum", c.PEER_TRANSFER_SECONDS),
    Rule(f"{V}nixl_num_failed_transfers_total", c.PEER_TRANSFER_FAILURES, ("transfer",)),
    Rule(f"{V}nixl_num_failed_notifications_total", c.PEER_TRANSFER_FAILURES, ("notification",)),
    # tiering: a promotion reads tier T into the primary (T→G2), a cascade writes the primary down (G2→T)
    Rule(f"{V}kv_offload_tiering_promotion_job_failures_total", TRANSFER_FAILED_JOBS, label="tier",
         resolve="tiering_read"),
    Rule(f"{V}kv_offload_tiering_cascade_job_failures_total", TRANSFER_FAILED_JOBS, label="tier",
         resolve="tiering_write"),
)
GAUGE_RULES: tuple[Rule, ...] = (
    Rule(f"{V}num_requests_running", c.REQUESTS_RUNNING),
    Rule(f"{V}num_requests_waiting", c.REQUESTS_WAITING),
    Rule(f"{V}kv_cache_usage_perc", USAGE_RATIO),
    Rule(f"{V}gpu_cache_usage_perc", USAGE_RATIO, priority=1),  # ≤0.11 alias
    Rule(f"{V}num_requests_waiting_by_reason", REQUESTS_WAITING_BY_REASON, label="reason", resolve="verbatim"),
    # the CPU offload tier's chunks pinned by in-flight stores and loads, not how full the tier is
    Rule(f"{V}kv_offload_cpu_cache_usage_perc", TIER_PINNED_RATIO, (G2,)),
)
HISTOGRAM_RULES: dict[str, str] = {  # vLLM family → kvscope histogram (vLLM's bucket edges kept)
    f"{V}time_to_first_token_seconds": c.TTFT_SECONDS,
    f"{V}request_queue_time_seconds": c.QUEUE_SECONDS,
    f"{V}request_prefill_time_seconds": c.PREFILL_SECONDS,
}
# Histograms with extra labels. vLLM's kv_block_* histograms (--kv-cache-metrics, sampled by
# --kv-cache-metrics-sample) watch the GPU block pool: G1. Lookup delays per tiering tier, by mode.
LABELLED_HISTOGRAM_RULES: tuple[Rule, ...] = (
    Rule(f"{V}kv_block_lifetime_seconds", BLOCK_LIFETIME, (G1,)),
    Rule(f"{V}kv_block_idle_before_evict_seconds", BLOCK_IDLE_BEFORE_EVICT, (G1,)),
    Rule(f"{V}kv_block_reuse_gap_seconds", BLOCK_REUSE_GAP, (G1,)),
    Rule(f"{V}kv_offload_tiering_lookup_sync_delay_seconds", TIER_LOOKUP_DELAY, label="tier", resolve="lookup_sync"),
    Rule(f"{V}kv_offload_tiering_lookup_async_delay_seconds", TIER_LOOKUP_DELAY, label="tier",
         resolve="lookup_async"),
)
HISTOGRAM_TABLE = (*(Rule(family, metric) for family, metric in HISTOGRAM_RULES.items()), *LABELLED_HISTOGRAM_RULES)
CACHE_CONFIG = f"{V}cache_config_info"
# vLLM's V1 engine, from these counters' first release until PR #18003 (May 2025, before 0.9), counted
# in blocks and said so in the HELP of these two families ("in terms of number of queried blocks" / "cached
# blocks"); it has counted tokens since, and says tokens. Such a page's readings are scaled by its block size.
BLOCK_COUNTED = frozenset({f"{V}gpu_prefix_cache_queries_total", f"{V}gpu_prefix_cache_hits_total"})
BLOCK_COUNTED_HELP = b"in terms of number of queried blocks"
OFFLOAD_CONFIG = f"{V}kv_offload_config_info"


def wanted_samples() -> frozenset[str]:
    """Every exposed sample name the normaliser reads (the scanner skips the rest)."""
    names = {r.sample for r in (*COUNTER_RULES, *GAUGE_RULES)} | {CACHE_CONFIG, OFFLOAD_CONFIG}
    for family in (*HISTOGRAM_RULES, *(r.sample for r in LABELLED_HISTOGRAM_RULES)):
        names |= {f"{family}_bucket", f"{family}_sum", f"{family}_count"}
    return frozenset(names)


class TierTable:
    """Label value → tier: exact entries, then glob patterns in order, else unattributed (cached)."""

    def __init__(self, table: Mapping[str, str]) -> None:
        self._exact = {k: v for k, v in table.items() if not any(ch in k for ch in "*?[")}
        self._patterns = [(k, v) for k, v in table.items() if k not in self._exact]
        self._cache: dict[str, str] = {}

    def __call__(self, value: str) -> str:
        tier = self._cache.get(value)
        if tier is None:
            tier = self._exact.get(value)
            if tier is None:
                tier = next((t for p, t in self._patterns if fnmatch.fnmatchcase(value, p)), Tier.UNATTRIBUTED.value)
            if len(self._cache) < 1024:
                self._cache[value] = tier
        return tier


@dataclass
class Normalised:
    readings: list[Reading] = field(default_factory=list)
    dropped: int = 0  # samples the contract cannot take (non-finite counters, broken histograms)
    unscaled: int = 0  # block-counted samples left out: no block size on the page for their dp rank


def _block_sizes(samples: Mapping[str, list[tuple[Mapping[str, str], float]]]) -> dict[str, float]:
    """Tokens per GPU block by dp rank, from `vllm:cache_config_info{block_size}`."""
    sizes: dict[str, float] = {}
    for labels, _ in samples.get(CACHE_CONFIG, ()):
        size = labels.get("block_size", "")
        if _is_number(size) and float(size) > 0:
            sizes[labels.get("engine", "0")] = float(size)
    return sizes


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


class Normaliser:
    """Turns one scanned page into contract readings. Holds only configuration (and lookup caches)."""

    def __init__(self, engine: str, source_tiers: Mapping[str, str], tiering_tiers: Mapping[str, str],
                 on_unknown_tier: Callable[[str], None] = lambda _value: None) -> None:
        self.engine = engine
        source = TierTable({**DEFAULT_SOURCE_TIERS, **source_tiers})
        tiering_table = {**DEFAULT_TIERING_TIERS, **tiering_tiers}
        tiering = TierTable(tiering_table)

        def tiering_tier(value: str) -> str:
            tier = tiering(value)
            if tier == Tier.UNATTRIBUTED.value and tiering_table.get(value) != tier:
                on_unknown_tier(value)  # no rule placed it: say so, never drop it silently
            return tier

        def tiering_read(value: str) -> tuple[Extra, int]:
            tier = tiering_tier(value)  # a read of the primary (G2) is G2→G1, used only without kv_offload_load
            return ((G2, G1), 2) if tier == G2 else ((tier, G2), 0)

        def tiering_write(value: str) -> tuple[Extra, int]:
            tier = tiering_tier(value)
            return ((G1, G2), 2) if tier == G2 else ((G2, tier), 0)

        def source_tier(value: str) -> tuple[Extra, int] | None:
            tier = source(value)
            return None if tier == CONNECTOR else ((tier,), 0)

        directions = {"CPU_to_GPU": (G2, G1), "GPU_to_CPU": (G1, G2)}
        self._resolvers: dict[str, Resolver] = {
            "source": source_tier,
            "external": lambda _: source_tier("external_unspecified"),
            "computed": lambda v: ((), 0) if v == "local_compute" else None,
            "verbatim": lambda v: ((v,), 0),
            "transfer_type": lambda v: (directions[v], 1) if v in directions else None,
            "tiering_read": tiering_read,
            "tiering_write": tiering_write,
            "lookup_sync": lambda v: ((tiering_tier(v), "sync"), 0),
            "lookup_async": lambda v: ((tiering_tier(v), "async"), 0),
        }

    def normalise(self, page: ScanResult, counted_in_blocks: bool = False) -> Normalised:
        """`counted_in_blocks`: the page's HELP says its GPU prefix cache counts blocks (BLOCK_COUNTED_HELP):
        those samples are turned into tokens by the block size of `vllm:cache_config_info`."""
        out = Normalised()
        samples = page.samples
        models: dict[str, str] = {}  # dp rank → model, for info series that carry no model_name
        entries: list[tuple[tuple[str, ...], str, int, str, tuple[str, ...], int, float]] = []
        block_sizes = _block_sizes(samples) if counted_in_blocks else {}
        for rule in (*COUNTER_RULES, *GAUGE_RULES):
            rows = samples.get(rule.sample)
            if not rows:
                continue
            resolver = self._resolvers[rule.resolve] if rule.resolve else None
            counter = rule.metric.endswith("_total")
            in_blocks = counted_in_blocks and rule.sample in BLOCK_COUNTED
            for labels, value in rows:
                dp = labels.get("engine", "0")
                model = labels.get("model_name", "")
                if model:
                    models.setdefault(dp, model)
                if math.isnan(value) or (counter and math.isinf(value)):
                    out.dropped += 1
                    continue
                if in_blocks:
                    size = block_sizes.get(dp)
                    if size is None:
                        out.unscaled += 1
                        continue
                    value *= size
                extra, priority = rule.extra, rule.priority
                if resolver is not None:
                    resolved = resolver(labels.get(rule.label, ""))
                    if resolved is None:
                        continue
                    extra, priority = resolved[0], max(priority, resolved[1])
                base = (self.engine, model, dp)
                entries.append((base, rule.group, rule.rank, rule.metric, (*base, *extra), priority, value))
        out.readings.extend(resolve_entries(entries))
        out.readings.extend(self._histograms(samples, models, out))
        out.readings.extend(self._capacities(samples, models))
        return out

    def _histograms(self, samples: Mapping[str, list[tuple[Mapping[str, str], float]]],
                    models: dict[str, str], out: Normalised) -> list[Reading]:
        """Histograms whose vLLM series land on one kvscope series (two tiering tiers taken as G4) are
        added bucket by bucket; with different bucket edges only the first is kept (the rest dropped)."""
        merged: dict[tuple[str, tuple[str, ...]], tuple[list[tuple[float, float]], float, float]] = {}
        for rule in HISTOGRAM_TABLE:
            resolver = self._resolvers[rule.resolve] if rule.resolve else None

            def source(labels: Mapping[str, str], rule: Rule = rule) -> tuple[str, ...]:
                return (*self._base(labels, models), labels.get(rule.label, "")) if rule.label else \
                    self._base(labels, models)

            for key, buckets, total, count in _valid_histograms(samples, rule.sample, source, out):
                extra = rule.extra
                if resolver is not None:
                    resolved = resolver(key[3])
                    if resolved is None:
                        continue
                    extra = resolved[0]
                series = (rule.metric, (*key[:3], *extra))
                known = merged.get(series)
                if known is None:
                    merged[series] = (buckets, total, count)
                elif [e for e, _ in known[0]] == [e for e, _ in buckets]:
                    merged[series] = ([(e, n + m) for (e, n), (_, m) in zip(known[0], buckets, strict=True)],
                                      known[1] + total, known[2] + count)
                else:
                    out.dropped += 1
        return [HistogramSample(metric, labels, tuple(buckets), total, count)
                for (metric, labels), (buckets, total, count) in merged.items()]

    def _capacities(self, samples: Mapping[str, list[tuple[Mapping[str, str], float]]],
                    models: dict[str, str]) -> list[Reading]:
        readings: list[Reading] = []
        for labels, _ in samples.get(CACHE_CONFIG, ()):
            blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
            if _is_number(blocks) and _is_number(size):  # num_gpu_blocks is "None" before profiling
                base = self._base(labels, models)
                readings.append(Sample(c.TIER_CAPACITY_TOKENS, (*base, G1), float(blocks) * float(size)))
        for labels, _ in samples.get(OFFLOAD_CONFIG, ()):
            base = self._base(labels, models)
            for key, metric in (("cpu_kv_cache_size_bytes", c.TIER_CAPACITY_BYTES),
                                ("cpu_kv_cache_size_tokens", c.TIER_CAPACITY_TOKENS)):
                if _is_number(labels.get(key, "")):
                    readings.append(Sample(metric, (*base, G2), float(labels[key])))
        return readings

    def _base(self, labels: Mapping[str, str], models: Mapping[str, str]) -> tuple[str, ...]:
        dp = labels.get("engine", "0")
        return (self.engine, labels.get("model_name") or models.get(dp, ""), dp)


def _valid_histograms(samples: Mapping[str, list[tuple[Mapping[str, str], float]]], family: str,
                      source: Callable[[Mapping[str, str]], tuple[str, ...]], out: Normalised,
                      ) -> list[tuple[tuple[str, ...], list[tuple[float, float]], float, float]]:
    """The family's series, by `source` key, as (key, buckets, sum, count); inconsistent ones counted in
    out.dropped (unsorted or missing edges, decreasing counts, count ≠ +Inf bucket, no finite sum)."""
    series: dict[tuple[str, ...], list[tuple[float, float]]] = {}
    for labels, value in samples.get(f"{family}_bucket", ()):
        try:
            series.setdefault(source(labels), []).append((float(labels["le"]), value))
        except (KeyError, ValueError):
            series.setdefault(source(labels), []).append((math.nan, value))
    sums = {source(lb): v for lb, v in samples.get(f"{family}_sum", ())}
    counts = {source(lb): v for lb, v in samples.get(f"{family}_count", ())}
    out.dropped += len((sums.keys() | counts.keys()) - series.keys())  # _sum/_count without buckets
    valid = []
    for key, buckets in series.items():
        total, count = sums.get(key), counts.get(key, buckets[-1][1])
        edges = [b for b, _ in buckets]
        cumulative = [n for _, n in buckets]
        if (total is None or not math.isfinite(total) or edges[-1] != math.inf
                or any(not a < b for a, b in itertools.pairwise(edges))
                or any(not a <= b for a, b in itertools.pairwise(cumulative))
                or not all(math.isfinite(n) for n in cumulative) or count != cumulative[-1]):
            out.dropped += 1
            continue
        valid.append((key, buckets, total, count))
    return valid


def resolve_entries(entries: list[tuple[tuple[str, ...], str, int, str, tuple[str, ...], int, float]]) -> list[Reading]:
    """Applies group ranks, then per-series priorities, and sums what is left per series."""
    best_rank: dict[tuple[tuple[str, ...], str], int] = {}
    for base, group, rank, *_ in entries:
        if group:
            best_rank[(base, group)] = min(rank, best_rank.get((base, group), rank))
    best_priority: dict[tuple[str, tuple[str, ...]], int] = {}
    kept = []
    for base, group, rank, metric, labels, priority, value in entries:
        if group and rank != best_rank[(base, group)]:
            continue
        series = (metric, labels)
        best_priority[series] = min(priority, best_priority.get(series, priority))
        kept.append((series, priority, value))
    totals: dict[tuple[str, tuple[str, ...]], float] = {}
    for series, priority, value in kept:
        if priority == best_priority[series]:
            totals[series] = totals.get(series, 0.0) + value
    return [Sample(metric, labels, value) for (metric, labels), value in totals.items()]
