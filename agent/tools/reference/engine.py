"""The reference engine: hash the prompt → queue → prefix lookup → fetch (real reads and copies) → room
for the new blocks → prefill on one device slot (time from the cost model × time_scale) → store the new
blocks down if G1 keeps nothing → first token → a few decode steps → release.

As in vLLM, the prompt's block hashes are computed when the request is created, before it is queued:
that time is in TTFT but in neither queue nor prefill time. Making room in G1/G2 and storing blocks down
happen inside the step here (the store is synchronous), so they sit in the prefill phase: the truth
records them as `offload_s`, apart from the fetch and the compute.

One device loop thread serves one request at a time, like a GPU running one prefill: the fetch is
synchronous inside the step (as a layer-wise connector loads; vLLM's OffloadingConnector loads before
the first schedule instead), so while a request fetches the device slot is idle — the fetch stall the
agent must detect. Everything it touches (directories, endpoints, clock, ZMQ context) comes from
EngineConfig or the constructor, so tests and `kvscope selftest` start it in-process with a temporary
directory and port 0 and stop it cleanly.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
from prometheus_client import CollectorRegistry

from kvscope.agent.core.tiers import Tier
from kvscope.agent.tools.reference.block_ages import BlockAges
from kvscope.agent.tools.reference.blocks import BlockId, chain_blocks
from kvscope.agent.tools.reference.compute_cost import CostModel
from kvscope.agent.tools.reference.geometry import KVGeometry, preset
from kvscope.agent.tools.reference.kv_publisher import KVEventPublisher, PublisherThread
from kvscope.agent.tools.reference.kvbm_dialect import KvbmMetrics
from kvscope.agent.tools.reference.tierstore import BlockEvent, TieredStore, TierSpec, Transfer
from kvscope.agent.tools.reference.tokenizer import output_piece
from kvscope.agent.tools.reference.tracing import RequestTracer, span_attributes
from kvscope.agent.tools.reference.truth import RequestTruth, TruthLog
from kvscope.agent.tools.reference.vllm_dialect import VllmMetrics

log = logging.getLogger("kvscope.reference.engine")


@dataclass
class EngineConfig:
    data_dir: Path  # G3 and G4 default to data_dir/g3 and data_dir/g4
    geometry: KVGeometry = field(default_factory=lambda: preset("gpt-oss-120b"))
    served_model_name: str = "openai/gpt-oss-120b"
    block_tokens: int = 256  # 9 MiB files for gpt-oss-120b: large sequential I/O, few files and events
    g1_blocks: int = 64
    g1_retain: bool = True
    g2_blocks: int = 0
    g2_retain: bool = True
    g3_blocks: int = 0
    g4_blocks: int = 1024
    g3_path: Path | None = None
    g4_path: Path | None = None  # any path: point it at a shared mount
    direct_io: bool = False
    write_behind_blocks: int = 32  # host buffers for asynchronous stores to G3/G4 (0: store inline)
    prefix_caching: bool = True  # False: a recompute baseline (no lookup)
    cost: CostModel = field(default_factory=CostModel)
    time_scale: float = 1.0  # multiplies compute and decode time (fetch I/O is real and never scaled)
    default_max_tokens: int = 16
    truth_path: Path | None = None
    kv_events_endpoint: str | None = "tcp://127.0.0.1:0"
    kv_events_replay_endpoint: str | None = "tcp://127.0.0.1:0"
    kv_events_topic: str = ""
    otlp_traces_endpoint: str | None = None
    engine_index: str = "0"
    vllm_version: tuple[int, int] = (0, 33)  # /metrics dialect: (0, 33) or (0, 14), the seeds' 0.14.1
    kvbm: bool = False  # also count KVBM's metrics (G2 its host pool, G3/G4 its disk pool): kvbm_dialect.py
    # announce every block a request reuses from G1 as BlockStored again, as vLLM does for a request with
    # kv_cache_report_mode=full: the KV events then carry the whole access stream (the what-if analysis needs it)
    kv_cache_report_full: bool = False

    @classmethod
    def seeds_g4(cls, data_dir: Path, **overrides: Any) -> EngineConfig:
        """The seeds' G4 test: G1 and G2 keep nothing, no local tier, every reuse comes from G4."""
        return cls(data_dir=data_dir, **{"g1_retain": False, "g2_blocks": 0, "g3_blocks": 0, **overrides})

    def tier_specs(self) -> dict[Tier, TierSpec]:
        return {
            Tier.G1: TierSpec(self.g1_blocks, self.g1_retain),
            Tier.G2: TierSpec(self.g2_blocks, self.g2_retain),
            Tier.G3: TierSpec(self.g3_blocks, True, self.g3_path or self.data_dir / "g3", self.direct_io),
            Tier.G4: TierSpec(self.g4_blocks, True, self.g4_path or self.data_dir / "g4", self.direct_io),
        }


@dataclass
class EngineRequest:
    request_id: str
    token_ids: Sequence[int]
    max_tokens: int
    arrival: float  # engine clock
    truth: RequestTruth
    blocks: list[BlockId] = field(default_factory=list)  # the prompt's full blocks, hashed at submit
    queued: float = 0.0  # engine clock, once hashed (vLLM's QUEUED)
    headers: Mapping[str, str] = field(default_factory=dict)
    temperature: float | None = None
    top_p: float | None = None
    # ("token", text) … then ("done", finish_reason) or ("error", message)
    out: queue.Queue[tuple[str, str]] = field(default_factory=queue.Queue)


class Engine:
    def __init__(self, config: EngineConfig, registry: CollectorRegistry | None = None,
                 zmq_context: zmq.Context[zmq.Socket[bytes]] | None = None,
                 clock: Callable[[], float] = time.perf_counter, wall: Callable[[], float] = time.time,
                 tracer: RequestTracer | None = None) -> None:
        self.config = config
        self.clock = clock
        self._mono0, self._wall0 = clock(), wall()
        geo, bt = config.geometry, config.block_tokens
        self.block_bytes = geo.block_bytes(bt)
        self.registry = registry or CollectorRegistry(auto_describe=True)
        has_connector = any(s.capacity_blocks > 0 for t, s in config.tier_specs().items() if t is not Tier.G1)
        self.has_connector = has_connector
        self.metrics = VllmMetrics(self.registry, config.served_model_name, config.engine_index,
                                   cache_info=self._cache_info(), offload_info=self._offload_info(),
                                   version=config.vllm_version)
        self.kvbm = KvbmMetrics(bt) if config.kvbm else None
        labels = self.metrics.labels
        # before the store: admitting its first blocks already reports them
        self.block_ages = BlockAges(clock, self.metrics.block_lifetime.labels(*labels),
                                    self.metrics.block_idle.labels(*labels),
                                    self.metrics.block_reuse_gap.labels(*labels))
        self.store = TieredStore(bt, self.block_bytes, config.tier_specs(), self, clock=clock,
                                 write_behind=config.write_behind_blocks)
        self._own_context = zmq_context is None
        self.zmq = zmq_context or zmq.Context()
        self.publisher: PublisherThread | None = None
        if config.kv_events_endpoint:
            self.publisher = PublisherThread(KVEventPublisher(
                self.zmq, config.kv_events_endpoint, topic=config.kv_events_topic,
                replay_endpoint=config.kv_events_replay_endpoint, data_parallel_rank=int(config.engine_index),
                clock=wall))
        self.tracer = tracer or (RequestTracer(config.otlp_traces_endpoint) if config.otlp_traces_endpoint
                                 else None)
        self.truth = TruthLog(config.truth_path)
        self.device_intervals: deque[tuple[float, float]] = deque(maxlen=100_000)  # wall-clock, compute
        self._queue: queue.Queue[EngineRequest | None] = queue.Queue()
        self._ids = itertools.count()
        self._current: RequestTruth | None = None
        self._events: list[BlockEvent] = []
        self._events_lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="reference-engine", daemon=True)
        self.max_prompt_tokens = config.g1_blocks * bt

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        if self.publisher is not None:
            self.publisher.start()
        self._thread.start()

    def stop(self) -> None:
        self._queue.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self.store.close()
        if self.publisher is not None:
            self.publisher.close()
        if self.tracer is not None:
            self.tracer.close()
        self.truth.close()
        if self._own_context:
            self.zmq.term()

    def wall_at(self, mono: float) -> float:
        return self._wall0 + (mono - self._mono0)

    # -- requests ----------------------------------------------------------------------------------------

    def submit(self, token_ids: Sequence[int], max_tokens: int | None = None, arrival: float | None = None,
               request_id: str | None = None, headers: Mapping[str, str] | None = None,
               temperature: float | None = None, top_p: float | None = None) -> EngineRequest:
        """Queues a request; `arrival` (engine clock) defaults to now. ValueError if it cannot run."""
        if not token_ids:
            raise ValueError("the prompt is empty")
        if len(token_ids) > self.max_prompt_tokens:
            raise ValueError(f"prompt of {len(token_ids)} tokens exceeds the G1 capacity of "
                             f"{self.max_prompt_tokens} tokens")
        arrival = self.clock() if arrival is None else arrival
        rid = request_id or f"ref-{next(self._ids)}"
        truth = RequestTruth(rid, self.wall_at(arrival), len(token_ids), time_scale=self.config.time_scale)
        blocks = chain_blocks(token_ids, self.config.block_tokens)
        queued = self.clock()
        truth.queued_ts = self.wall_at(queued)
        req = EngineRequest(rid, token_ids, max_tokens or self.config.default_max_tokens, arrival, truth,
                            blocks, queued, headers or {}, temperature, top_p)
        self.metrics.queued(+1)
        self._queue.put(req)
        return req

    def generate(self, token_ids: Sequence[int], max_tokens: int | None = None) -> RequestTruth:
        """Submits and waits until done (scenarios and tests)."""
        req = self.submit(token_ids, max_tokens)
        while req.out.get()[0] == "token":
            pass
        return req.truth

    def clear_cache(self) -> None:
        """Empties every tier; call while idle. Publishes the removals and AllBlocksCleared."""
        self.store.clear()
        self._flush_events()
        if self.publisher is not None:
            self.publisher.clear_all()

    # -- StoreObserver -----------------------------------------------------------------------------------

    def transfer(self, t: Transfer) -> None:
        self.metrics.transfer(t)
        if self.kvbm is not None:
            self.kvbm.transfer(t)
        if self._current is not None and not t.background:
            link = f"{t.src}->{t.dst}"
            tr = self._current
            tr.bytes_by_link[link] = tr.bytes_by_link.get(link, 0) + t.bytes
            tr.seconds_by_link[link] = tr.seconds_by_link.get(link, 0.0) + t.seconds

    def block_event(self, e: BlockEvent) -> None:
        self.block_ages.event(e)
        if e.kind == "reused" and not self.config.kv_cache_report_full:
            return
        if threading.current_thread() is self._thread or self.publisher is None:
            with self._events_lock:
                self._events.append(e)  # published as one batch at the end of the step
        else:  # the write-behind thread: publish now, it has no steps
            self.publisher.publish_block_events([e])

    def error(self, tier: Tier, kind: str) -> None:
        self.metrics.block_errors.labels(*self.metrics.labels, str(tier), kind).inc()
        self.metrics.failed(tier, kind)
        if self._current is not None:
            self._current.block_errors += 1

    # -- the device loop -----------------------------------------------------------------------------------

    def _loop(self) -> None:
        while (req := self._queue.get()) is not None:
            try:
                self._process(req)
            except Exception as exc:  # one bad request must not stop the engine
                log.exception("request %s failed", req.request_id)
                self.store.release()
                self._current = None
                req.out.put(("error", str(exc)))
            finally:
                self.metrics.running.labels(*self.metrics.labels).set(0)

    def _process(self, req: EngineRequest) -> None:
        m, L, cfg, bt = self.metrics, self.metrics.labels, self.config, self.config.block_tokens
        tr = self._current = req.truth
        scheduled = self.clock()
        self.store.begin_request()
        m.queued(-1)
        m.running.labels(*L).set(1)
        tr.scheduled_ts, tr.queue_s = self.wall_at(scheduled), scheduled - req.queued
        blocks = req.blocks
        # like vLLM, at least the last prompt token is computed, so a hit covers at most n-1 tokens
        usable = blocks[:(len(req.token_ids) - 1) // bt]
        lookups: dict[Tier, list[float]] = {}
        tiers = self.store.lookup(usable, lookups) if cfg.prefix_caching else []
        m.looked_up(lookups)
        hit_tokens = {t: tiers.count(t) * bt for t in set(tiers)}
        m.admitted(len(req.token_ids), hit_tokens, self.has_connector)
        if self.kvbm is not None:
            self.kvbm.looked_up(len(req.token_ids), hit_tokens)
        fetched = self.store.fetch(usable[:len(tiers)], tiers)
        m.pinned(self.store.g2_pinned_share())
        self._flush_events()
        for tier, n in fetched.blocks_by_tier.items():
            tr.tokens_by_tier[str(tier)] = n * bt
            tr.fetch_s[str(tier)] = fetched.seconds_by_tier.get(tier, 0.0)
            tr.fetch_bytes[str(tier)] = fetched.bytes_by_tier.get(tier, 0)
        reused = fetched.loaded * bt
        new = len(req.token_ids) - reused
        tr.computed_tokens = new
        tr.prefill_model_s = cfg.cost.compute(new, reused)
        tr.recompute_s = cfg.cost.recompute(len(req.token_ids)) * cfg.time_scale
        computed = blocks[fetched.loaded:]
        self.store.reserve(sum(not self.store.holds(Tier.G1, b.key) for b in computed))

        def write_kv() -> None:  # prefill produces the new blocks' KV in G1
            for b in computed:
                self.store.put_computed(b)

        start, end = self._device(tr.prefill_model_s * cfg.time_scale, write_kv)
        tr.prefill_compute_s = end - start
        tr.device_busy.append([self.wall_at(start), self.wall_at(end)])
        if not cfg.g1_retain:
            self.store.offload_computed(computed)
        tr.offload_s = self.store.take_offload()
        self._flush_events()
        local = fetched.blocks_by_tier.get(Tier.G1, 0) * bt
        m.prefilled(len(req.token_ids), local, reused - local)
        req.out.put(("token", output_piece(0)))
        first = self.clock()
        tr.first_token_ts, tr.ttft_s, tr.prefill_s = self.wall_at(first), first - req.arrival, first - scheduled
        tr.frontend_s = tr.ttft_s - tr.queue_s - tr.prefill_s
        tr.other_s = tr.prefill_s - tr.fetch_total_s - tr.offload_s - tr.prefill_compute_s
        itls, last = [], first
        for i in range(1, req.max_tokens):
            start, end = self._device(cfg.cost.decode_step * cfg.time_scale)
            tr.device_busy.append([self.wall_at(start), self.wall_at(end)])
            req.out.put(("token", output_piece(i)))
            now = self.clock()
            itls.append(now - last)
            last = now
        tr.completion_tokens = req.max_tokens
        tr.decode_s = last - first
        self.store.release()
        m.pinned(0.0)
        self._flush_events()
        done = self.clock()
        tr.finished_ts, tr.e2e_s = self.wall_at(done), done - req.arrival
        m.finished(tr.ttft_s, tr.queue_s, tr.prefill_s, tr.decode_s, tr.e2e_s, itls, tr.completion_tokens,
                   tr.finish_reason, tr.computed_tokens)
        m.usage.labels(*L).set(0.0)
        self._current = None
        self.truth.write(tr)
        if self.tracer is not None:
            self.tracer.record(req.headers, int(tr.arrival_ts * 1e9), int(tr.finished_ts * 1e9), span_attributes(
                req.request_id, tr.ttft_s, tr.e2e_s, tr.queue_s, tr.prefill_s, tr.decode_s, tr.prompt_tokens,
                tr.completion_tokens, req.max_tokens, req.temperature, req.top_p, reused, tr.fetch_total_s,
                tr.offload_s))
        req.out.put(("done", tr.finish_reason))

    def _device(self, seconds: float, work: Callable[[], object] | None = None) -> tuple[float, float]:
        """Holds the device slot busy for `seconds` while `work` (the host's stand-in for what the kernels
        write) runs; returns its busy span.

        The slot is busy from `start` to `start + seconds`, as a GPU finishes its kernels on time. When this
        thread gets there later (the OS woke it late, or `work` waited for the store's lock or a CPU on a
        starved host), the delay is the host's: an idle device and the truth's `other`, not compute. Counted
        as compute, it would make the truth's own recompute time (the cost model's) disagree with the compute
        it reports, and teach the agent's cost model a slower engine than this one.
        """
        m, L = self.metrics, self.metrics.labels
        start = self.clock()
        m.busy.labels(*L).set(1)
        m.usage.labels(*L).set(len(self.store.pinned) / max(1, self.config.g1_blocks))
        if work is not None:
            work()
        worked = self.clock()
        remaining = seconds - (worked - start)
        if remaining > 0:
            time.sleep(remaining)
        end = start + seconds
        m.busy.labels(*L).set(0)
        m.busy_seconds.labels(*L).inc(end - start)
        self.device_intervals.append((self.wall_at(start), self.wall_at(end)))
        return start, end

    def _flush_events(self) -> None:
        with self._events_lock:
            events, self._events = self._events, []
        if events and self.publisher is not None:
            self.publisher.publish_block_events(events)

    def _cache_info(self) -> dict[str, str]:
        c = self.config
        return {"block_size": str(c.block_tokens), "cache_dtype": c.geometry.dtype,
                "enable_prefix_caching": str(c.prefix_caching), "num_gpu_blocks": str(c.g1_blocks),
                "num_cpu_blocks": str(c.g2_blocks), "prefix_caching_hash_algo": "sha256"}

    def _offload_info(self) -> dict[str, str] | None:
        c = self.config
        if not any((c.g2_blocks, c.g3_blocks, c.g4_blocks)):
            return None
        bpb = self.block_bytes
        return {"cpu_num_chunks": str(c.g2_blocks), "cpu_blocks_per_chunk": "1",
                "cpu_kv_cache_size_bytes": str(c.g2_blocks * bpb),
                "cpu_kv_cache_size_tokens": str(c.g2_blocks * c.block_tokens),
                "fs_1_kv_cache_size_bytes": str(c.g3_blocks * bpb),
                "fs_2_kv_cache_size_bytes": str(c.g4_blocks * bpb)}
