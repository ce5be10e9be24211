"""vLLM's Prometheus /metrics, scraped and normalised to the engine contract (agent/core/contract.py).

Facts: shared/facts/vllm.md §1 (0.33 names, 0.20 deprecated names, 0.11 aliases) and its appendix
(0.14.1). Labels: vLLM's `engine` (the data-parallel index) → `dp_rank`, `model_name` → `model`, and
our `engine` is the configured engine kind (default "vllm"; the reference engine speaks the same
dialect and is scraped with the same code under its own kind).

How hits per tier are derived, without counting a token twice:
- `vllm:prefix_cache_queries` counts every prompt token looked up in the GPU prefix cache, which is
  where every lookup starts → `kvscope_kv_lookup_tokens_total`. `external_prefix_cache_queries` is
  the subset G1 missed, asked of the connector: not added again.
- 0.32+: `vllm:prompt_tokens_cached_by_source{source}` splits all hits by the tier that supplied them
  and sums to `prefix_cache_hits + external_prefix_cache_hits`; `source="device"` *is* the G1 hit
  count. So when an engine shows any `cached_by_source` sample, hits per tier come from it alone,
  through the source→tier table (device G1, host G2, disk G3, p2p and external_unspecified
  unattributed); adding `prefix_cache_hits` as well would count G1 twice. The choice is made for the
  whole hit family at once, per engine (not per tier), because a source that has not been hit yet
  may have no sample while `external_prefix_cache_hits` already holds its tokens.
- Older engines (0.14.1, 0.20): G1 hits = `prefix_cache_hits` (alias `gpu_prefix_cache_hits` in
  0.11), and `external_prefix_cache_hits` goes through the table as `external_unspecified`
  (unattributed by default): the connector says nothing about which tier served it.
- vLLM's V1 engine until PR #18003 (before 0.9) counted `gpu_prefix_cache_queries/hits` in blocks, and
  its HELP says so: such a page's two are multiplied by `cache_config_info`'s block_size (left out when
  the page has none).
- Computed (recomputed) tokens: `vllm:prompt_tokens_by_source{source="local_compute"}`; the other two
  sources are hits already counted above. Without it (≤0.30) the `_sum` of the histogram
  `vllm:request_prefill_kv_computed_tokens` (prompt − cached tokens per finished request) is used: a
  true counter too, but it lags: it is counted when a request finishes.

Transfers (bytes and seconds, per link):
- `vllm:kv_offload_load_*` → G2→G1, `kv_offload_store_*` → G1→G2 (the offload target of the
  OffloadingConnector is host memory; with TieringOffloadingSpec it is the CPU primary tier).
- Deprecated `vllm:kv_offload_total_*{transfer_type=CPU_to_GPU|GPU_to_CPU}` (the only names in 0.20,
  still emitted beside the new ones in 0.33) count the same transfers: used for a link only when
  the new name has no sample for that engine and link.
- Tiering `vllm:kv_offload_tiering_{read,write}_*{tier}`, tier label → tier by a table (`0:primary`
  G2, `1:fs` G3, `2:fs` G4, `*:obj` G4, else unattributed): a read of tier T moves T→G2 (promotion
  into the primary), a write G2→T (cascade). The primary itself is G2: its reads can only feed G1
  and its writes can only come from G1, which are the transfers `kv_offload_load/store` already
  count; so they give G2→G1 / G1→G2 only for an engine that has neither new nor deprecated names.
- Several vLLM series that land on one kvscope series (p2p + external_unspecified → unattributed;
  two tiers mapped to G4) are summed; all of them come from one process, so they reset together.

Also: TTFT, queue and prefill histograms with vLLM's bucket edges; running/waiting requests;
`vllm:prompt_tokens` → `kvscope_prompt_tokens_total`; `vllm:request_success{finished_reason}` →
`kvscope_requests_finished_total{reason}`; `vllm:kv_cache_usage_perc` (alias `gpu_cache_usage_perc`)
→ `kvscope_kv_cache_usage_ratio` (blocks pinned by running requests, *not* residency, so it is not
`kvscope_tier_used_bytes`: no series on the page gives residency, which comes from KV events);
capacities from `vllm:cache_config_info` (num_gpu_blocks × block_size → G1 tokens) and
`vllm:kv_offload_config_info` (cpu_kv_cache_size_bytes/_tokens → G2).

Newer families (0.33, docs/vllm.md "Newer families"): the `--kv-cache-metrics` block histograms
(lifetime, idle before eviction, reuse gap) as G1 histograms; waiting requests by reason;
`kv_offload_cpu_cache_usage_perc` as the share of G2 pinned by transfers (not used bytes: evictable
chunks count as free); tiering lookup delays per tier and mode; failed promotion (T→G2) and cascade
(G2→T) jobs per link.

Readings are vLLM's own cumulative totals; the store makes them reset-safe (an engine restart).
A restart is not always a decrease: a vLLM that served as many requests between two scrapes after its
restart as before it shows the same totals again. So each target's `process_start_time_seconds` (the
API server's, on every single-process page) is watched: when it changes, every reading of that page
is preceded by a zero of itself, so the store takes the page's values as growth from zero (a reset).
Histograms and capacities that a restarted engine has not reported yet are held at their last reading
while the engine is on the page (`_with_held`), so they do not leave the exposition in the gap; at a
restart that is known the held histograms are zeroed (the new life has observed nothing yet).

Targets are scraped in parallel, each with a deadline on its whole request (collectors/scrape/fetch.py).
A target that fails (connect, timeout, HTTP status, larger than `max_response_bytes`, a body cut
off mid-line) contributes no new readings this cycle and shows `kvscope_scrape_target_up 0`; its last
counters and histograms are given again, unchanged, so their totals stay exported through an engine
restart of any length (and go on from there), while its gauges leave. The other targets are
unaffected, and so is the collector's own `kvscope_collector_up`.
"""

from __future__ import annotations

import logging
import re
import urllib.parse
from dataclasses import dataclass, field, replace

from kvscope.agent.core import contract as c
from kvscope.agent.core.catalogue import counter, gauge, histogram
from kvscope.agent.core.contract import ENGINE_LABELS
from kvscope.agent.core.pipeline import CollectorContext, CollectorSpec
from kvscope.agent.core.readings import HistogramSample, Reading, Sample
from kvscope.agent.core.tiers import Tier, parse_tier
from kvscope.collectors.engines.vllm_map import (
    BLOCK_COUNTED,
    BLOCK_COUNTED_HELP,
    BLOCK_IDLE_BEFORE_EVICT,
    BLOCK_LIFETIME,
    BLOCK_REUSE_GAP,
    CONNECTOR,
    DEFAULT_SOURCE_TIERS,
    DEFAULT_TIERING_TIERS,
    REQUESTS_FINISHED,
    REQUESTS_WAITING_BY_REASON,
    TIER_LOOKUP_DELAY,
    TIER_PINNED_RATIO,
    TRANSFER_FAILED_JOBS,
    USAGE_RATIO,
    Normaliser,
    wanted_samples,
)
from kvscope.collectors.scrape.exposition import ExpositionScanner
from kvscope.collectors.scrape.fetch import Fetcher, ParallelScrape, http_fetch
from kvscope.collectors.scrape.target import ScrapeTarget, SeriesKey, target_health

log = logging.getLogger("kvscope.collectors.vllm")

_VLLM = "vllm /metrics"
NEWER_FAMILY_METRICS = (
    *(m for m in c.ENGINE_EXTRA_METRICS if m.name in (BLOCK_LIFETIME, BLOCK_IDLE_BEFORE_EVICT, BLOCK_REUSE_GAP)),
    gauge(REQUESTS_WAITING_BY_REASON, "requests", (*ENGINE_LABELS, "reason"),
          "Requests waiting, by why (vLLM num_requests_waiting_by_reason: capacity = waiting for scheduling "
          "capacity, deferred = held by LoRA budget, KV transfer or a blocked status); the reasons add up to "
          "kvscope_requests_waiting.", _VLLM),
    gauge(TIER_PINNED_RATIO, "ratio", (*ENGINE_LABELS, "tier"),
          "Fraction of the offload tier's space pinned by in-flight stores and loads (vLLM "
          "kv_offload_cpu_cache_usage_perc: G2). Not how full the tier is: evictable cached chunks count as "
          "free; sustained high values mean transfers may be dropped.", _VLLM),
    histogram(TIER_LOOKUP_DELAY, "seconds", (*ENGINE_LABELS, "tier", "mode"),
              "Time a per-chunk lookup in an offload tier took (vLLM kv_offload_tiering_lookup_{sync,async}_delay"
              "_seconds): mode=sync, blocking time of a lookup that resolved; mode=async, from its first "
              "retry to its resolution.", _VLLM),
    counter(TRANSFER_FAILED_JOBS, "", (*ENGINE_LABELS, "src", "dst"),
            "Offload transfer jobs that failed, by link (vLLM kv_offload_tiering_promotion_job_failures: "
            "tier→G2, cascade_job_failures: G2→tier).", _VLLM),
)

NAME = "vllm"
MIB = 1 << 20
_T = ("collector", "target")

METRICS = (
    gauge("kvscope_scrape_target_up", "", _T,
          "1 when the target's last scrape succeeded, 0 when it failed (see kvscope_scrape_errors_total).",
          "HTTP scrape"),
    counter("kvscope_scrape_errors_total", "", (*_T, "kind"),
            "Failed scrapes by kind: connect, timeout, http_status, too_large, truncated, protocol; "
            "duplicate_series counts scrapes whose series another target already reported.", "HTTP scrape"),
    counter("kvscope_scrape_malformed_lines_total", "", _T,
            "Sample lines of read families that could not be parsed, and samples the contract cannot take "
            "(NaN counters, inconsistent histograms); skipped.", "HTTP scrape"),
    gauge("kvscope_scrape_response_bytes", "bytes", _T, "Size of the target's last response body.", "HTTP scrape"),
    gauge(USAGE_RATIO, "ratio", ENGINE_LABELS,
          "Fraction of G1 KV blocks held by running requests (vLLM kv_cache_usage_perc); evictable cached "
          "blocks count as free, so this is not residency.", "vllm /metrics"),
    counter(REQUESTS_FINISHED, "requests", (*ENGINE_LABELS, "reason"),
            "Finished requests by finish reason (vLLM request_success).", "vllm /metrics"),
    *(m for m in c.ENGINE_EXTRA_METRICS if m.name in (
        c.PREEMPTIONS, c.PEER_TRANSFER_BYTES, c.PEER_TRANSFER_SECONDS, c.PEER_TRANSFER_FAILURES)),
    *NEWER_FAMILY_METRICS,
)
# the engine's counters among the readings (histograms are told by their type): held while a target is down
_CUMULATIVE = frozenset(spec.name for spec in (*c.CONTRACT_METRICS, *METRICS)
                        if spec.type == "counter" and not spec.name.startswith("kvscope_scrape_"))


@dataclass
class VllmOptions:
    urls: list[str] = field(default_factory=list)  # e.g. ["http://127.0.0.1:8000/metrics"]
    engine: str = "vllm"  # the `engine` label (engine kind) of every series
    # whole request per target (connect, headers, body), all targets at once: keep it below the collector's
    # timeout (agent.timeout, 5 s by default)
    scrape_timeout_seconds: float = 2.0
    max_response_bytes: int = 8 * MIB  # a larger body fails that target (kind="too_large")
    # cache-hit source → tier; entries given override the defaults one by one
    cache_hit_source_tiers: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_SOURCE_TIERS))
    # tiering `tier` label → tier (exact, then glob patterns; no match → unattributed); overrides per entry
    tiering_tiers: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_TIERING_TIERS))

    def validate(self, path: str) -> None:
        if not self.urls:
            raise ValueError('urls: the vllm collector is enabled but has no URL to scrape; set urls = '
                             '["http://127.0.0.1:8000/metrics"] (vLLM serves /metrics on its API port) '
                             "or disable it")
        for url in self.urls:
            check_url(url)
        if len(set(self.urls)) != len(self.urls):
            raise ValueError("urls: a URL is listed twice")
        if not self.engine:
            raise ValueError("engine: must not be empty")
        if self.scrape_timeout_seconds <= 0:
            raise ValueError(f"scrape_timeout_seconds: must be > 0, got {self.scrape_timeout_seconds}")
        if self.max_response_bytes < 1024:
            raise ValueError(f"max_response_bytes: must be >= 1024, got {self.max_response_bytes}")
        for key, value in self.cache_hit_source_tiers.items():
            if value != CONNECTOR:  # left to the KV connector's own adapter
                parse_tier_option(f"cache_hit_source_tiers.{key}", value)
        for key, value in self.tiering_tiers.items():
            if parse_tier_option(f"tiering_tiers.{key}", value) == Tier.G1:
                raise ValueError(f"tiering_tiers.{key}: offload tiers are below G1 (G2, G3, G4 or unattributed)")


def parse_tier_option(key: str, value: str) -> Tier:
    try:
        return parse_tier(value)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None


def check_url(url: str) -> None:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"urls: {url!r} is not an http(s)://HOST[:PORT]/PATH URL")
    if parts.username or parts.password:
        raise ValueError(f"urls: {url!r}: credentials in URLs are not supported")


# Series an engine reports only once it has something to report (a histogram before its first observation
# in vLLM's multiprocess mode, the offload config after a restart): held through an engine restart.
_HELD_GAUGES = frozenset({c.TIER_CAPACITY_BYTES, c.TIER_CAPACITY_TOKENS})
# the API server's start time (prometheus_client's process collector; absent in multiprocess mode)
_STARTED = re.compile(rb"^process_start_time_seconds(?:\{[^}\n]*\})?[ \t]+([0-9.eE+-]+)", re.MULTILINE)


def start_time(page: bytes) -> float | None:
    """The page's process_start_time_seconds, or None when it has none (or an unreadable one)."""
    match = _STARTED.search(page)
    if match is None:
        return None
    try:
        return float(match.group(1))
    except ValueError:
        return None


def zero(reading: Reading) -> Reading:
    """`reading` at zero: a counter or histogram of a process that has just started."""
    if isinstance(reading, HistogramSample):
        return replace(reading, buckets=tuple((bound, 0.0) for bound, _ in reading.buckets), sum=0.0, count=0.0)
    return Sample(reading.name, reading.labels, 0.0, reading.wrap_modulus)


class VllmMetricsCollector:
    """Scrapes its targets in parallel, each with its own whole-request deadline, so one slow target can
    take neither another target's series nor the collector's own health; each failure is counted on its
    target. A request that outlives its cycle is not repeated until it returns (its answer, too old by
    then, is dropped)."""

    def __init__(self, options: VllmOptions, fetch: Fetcher | None = None) -> None:
        self._options = options
        self._unknown_tiers: set[str] = set()
        self._unscaled_reported: set[str] = set()  # targets whose block-counted prefix cache was logged
        self._normaliser = Normaliser(options.engine, options.cache_hit_source_tiers, options.tiering_tiers,
                                      self._unknown_tier)
        wanted = wanted_samples()
        self._targets = [ScrapeTarget(url, ExpositionScanner(("vllm:",), wanted)) for url in options.urls]
        self._scrape = ParallelScrape(options.urls, fetch or http_fetch, options.scrape_timeout_seconds,
                                      options.max_response_bytes)
        self._started: dict[str, float] = {}  # per target URL: the engine's process start time, last seen
        # per target URL: its last page's counters and histograms, re-sent while it cannot be scraped
        self._totals: dict[str, list[Reading]] = {}

    def _unknown_tier(self, value: str) -> None:
        if value not in self._unknown_tiers and len(self._unknown_tiers) < 64:
            self._unknown_tiers.add(value)
            log.warning("vllm: tiering tier %r matches no rule of tiering_tiers; its bytes are exported as "
                        "tier 'unattributed' (map it with tiering_tiers = { %r = \"G3\" } or G4)", value, value)

    def _restarted(self, url: str, page: bytes) -> bool:
        """Whether the target's engine started again since its last page (its process start time moved)."""
        started = start_time(page)
        if started is None:
            return False
        before = self._started.get(url)
        self._started[url] = started
        if before is None or started == before:
            return False
        log.info("%s target %s: the engine restarted (process start time %.3f, was %.3f): its counters count "
                 "from zero again", NAME, url, started, before)
        return True

    def collect(self) -> list[Reading]:
        readings: list[Reading] = []
        claimed: set[SeriesKey] = set()  # series keys already given by a target
        for target, answer in zip(self._targets, self._scrape.cycle(), strict=True):
            page = target.page(NAME, answer)
            if page is None:  # down (a restarting engine takes minutes): its totals stay, unchanged
                target.claim(NAME, self._totals.get(target.url, ()), claimed, readings, "same model and dp rank")
                continue
            # the HELP says which unit an old engine counted its prefix cache in (read only when it has those)
            in_blocks = (isinstance(answer, bytes) and not page.samples.keys().isdisjoint(BLOCK_COUNTED)
                         and BLOCK_COUNTED_HELP in answer)
            result = self._normaliser.normalise(page, in_blocks)
            if result.unscaled and target.url not in self._unscaled_reported:
                self._unscaled_reported.add(target.url)
                log.warning("%s target %s: its prefix cache counts blocks (vLLM before 0.9), and the page has "
                            "no vllm:cache_config_info block_size to turn them into tokens: prefix cache "
                            "lookups and hits are not exported for it (logged once)", NAME, target.url)
            target.count_malformed(NAME, page, result.dropped)
            restarted = isinstance(answer, bytes) and self._restarted(target.url, answer)
            if restarted:
                target.held = {key: zero(r) if isinstance(r, HistogramSample) else r for key, r in target.held.items()}
            given: list[Reading] = []
            target.claim(NAME, _with_held(target.held, result.readings), claimed, given, "same model and dp rank")
            if restarted:  # each value counted from zero: the store sees a reset, then the new life's growth
                readings.extend(zero(r) for r in given)
            readings.extend(given)
            self._totals[target.url] = [r for r in given if isinstance(r, HistogramSample) or r.name in _CUMULATIVE]
        readings.extend(target_health(NAME, self._targets))
        return readings


def _with_held(held: dict[SeriesKey, Reading], readings: list[Reading]) -> list[Reading]:
    """`readings`, plus the held histograms and capacities of engines still on the page that this page
    lacks. A restarted vLLM shows a histogram again only after its first observation (and its offload
    config only once the connector reports); until then the last reading stands in, unchanged, so the
    store keeps the series' totals exported, and the first real value after it is taken as the reset it
    is. An engine gone from the page takes its held series with it."""
    present = {(r.name, r.labels) for r in readings}
    engines = {r.labels[:3] for r in readings}
    out = list(readings)
    for key, reading in list(held.items()):
        if key in present:
            continue
        if reading.labels[:3] in engines:
            out.append(reading)
        else:
            del held[key]
    for r in readings:
        if isinstance(r, HistogramSample) or r.name in _HELD_GAUGES:
            held[(r.name, r.labels)] = r
    return out


def _factory(options: VllmOptions, context: CollectorContext) -> VllmMetricsCollector:
    return VllmMetricsCollector(options)


SPEC = CollectorSpec(
    name=NAME,
    description="vLLM /metrics (prefix-cache hits per tier, offload transfers, TTFT/queue/prefill, capacities)",
    options=VllmOptions,
    factory=_factory,
    metrics=METRICS,
    enabled_by_default=False,
)
