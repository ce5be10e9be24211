"""A noisy neighbour for the G4 path: competing I/O on the same filesystem and device as G4, and the
agent attached to the engine to see it (the seeds' test: 200 GB/s of unrelated traffic on the fabric
took 4.26 RPS down to 3.6).

`NoiseInjector` runs threads doing large sequential reads and/or writes of one big file beside G4.
They bypass the page cache (O_DIRECT, or, where the filesystem refuses it, buffered I/O with fsync
after writes and POSIX_FADV_DONTNEED after reads), so every byte crosses the device the block files
live on, as unrelated traffic on a shared storage path would. Intensity: the number of threads, the
I/O size and an optional cap in bytes/s.

`AttachedAgent` is the kvscope agent built by `agent.wiring.build_agent` from TOML text — the `vllm`
scraper on the engine's /metrics (`engine = "reference"`), `disk` on G4's device and `correlation`
with `paths` mapping G4 to that disk's read and written bytes — clocked by the caller: each `step()`
runs the three collectors in that order and ingests their readings, so a correlation window always
sees the engine's and the disk's counters of the same instant (the scheduler's threads would let the
two drift by up to one interval, which blurs the KV share of the path's traffic).
"""

from __future__ import annotations

import json
import mmap
import os
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np

from kvscope.agent import contract
from kvscope.agent.config import load_config
from kvscope.agent.reference.engine import EngineConfig
from kvscope.agent.reference.openai_server import ReferenceServer
from kvscope.agent.reference.scenarios import LoadResult, _drive, _prompt, running_engine
from kvscope.agent.wiring import Agent, build_agent, components
from kvscope.collectors.host_inputs import block_device_of

MIB = 1 << 20
Mode = Literal["read", "write", "mixed"]


@dataclass(frozen=True, slots=True)
class NoiseSpec:
    threads: int = 2  # concurrent streams; each works on its own region of the file
    mode: Mode = "read"  # "mixed": even threads read, odd threads write
    io_bytes: int = 4 * MIB  # bytes per read/write call
    file_bytes: int = 512 * MIB  # the competing file; large enough that streams do not revisit soon
    bytes_per_second: float = 0.0  # total cap over all threads; 0 = as fast as the device allows
    direct: bool = True  # O_DIRECT where the filesystem allows it

    def __post_init__(self) -> None:
        if self.threads < 1 or self.io_bytes < 4096 or self.io_bytes % 4096:
            raise ValueError("threads >= 1 and io_bytes a positive multiple of 4096")
        if self.file_bytes < self.io_bytes * self.threads:
            raise ValueError("file_bytes must hold at least one I/O per thread")
        if self.mode not in ("read", "write", "mixed"):
            raise ValueError(f"mode: read, write or mixed, not {self.mode!r}")


class NoiseInjector:
    """Competing I/O in `directory`. `prepare()` writes the file (slow: do it before timing anything);
    `start()`/`stop()` or `with injector:` run the streams; `bytes_read`/`bytes_written` count them."""

    def __init__(self, directory: Path, spec: NoiseSpec = NoiseSpec(),
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.spec = spec
        self.path = directory / "kvscope-noise.dat"
        self._clock, self._sleep = clock, sleep
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.bytes_read = 0
        self.bytes_written = 0
        self.direct = spec.direct and hasattr(os, "O_DIRECT")
        self.errors: list[str] = []
        self.started_at: float | None = None
        self.stopped_at: float | None = None

    def _open(self, flags: int) -> int:
        if self.direct:
            try:
                return os.open(self.path, flags | os.O_DIRECT, 0o644)
            except OSError:
                self.direct = False  # tmpfs and some overlays refuse O_DIRECT: fall back, keep going
        return os.open(self.path, flags, 0o644)

    def prepare(self) -> None:
        """Writes the whole file with real data (unwritten extents would be read back without any I/O)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        buf = mmap.mmap(-1, self.spec.io_bytes)  # page-aligned, as O_DIRECT needs
        buf.write(os.urandom(min(self.spec.io_bytes, MIB)) * max(1, self.spec.io_bytes // MIB))
        fd = self._open(os.O_WRONLY | os.O_CREAT)
        try:
            for offset in range(0, self.spec.file_bytes, self.spec.io_bytes):
                os.pwritev(fd, [buf], offset)
            os.fsync(fd)
        finally:
            os.close(fd)

    def start(self) -> None:
        if not self.path.exists() or self.path.stat().st_size < self.spec.file_bytes:
            self.prepare()
        self._stop.clear()
        self.started_at, self.stopped_at = self._clock(), None
        region = self.spec.file_bytes // self.spec.threads // self.spec.io_bytes * self.spec.io_bytes
        for i in range(self.spec.threads):
            write = self.spec.mode == "write" or (self.spec.mode == "mixed" and i % 2 == 1)
            t = threading.Thread(target=self._stream, args=(i * region, region, write), name=f"noise-{i}",
                                 daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)
        self._threads.clear()
        self.stopped_at = self._clock()

    def __enter__(self) -> NoiseInjector:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    @property
    def bytes_moved(self) -> int:
        return self.bytes_read + self.bytes_written

    def _stream(self, first: int, length: int, write: bool) -> None:
        spec = self.spec
        per_thread = spec.bytes_per_second / spec.threads if spec.bytes_per_second > 0 else 0.0
        buf = mmap.mmap(-1, spec.io_bytes)
        if write:
            buf.write(os.urandom(spec.io_bytes))
        try:
            fd = self._open(os.O_RDWR)
        except OSError as exc:
            self.errors.append(f"open {self.path}: {exc}")
            return
        began, moved, offset = self._clock(), 0, 0
        try:
            while not self._stop.is_set():
                if per_thread:  # pace: never ahead of the cap
                    ahead = moved / per_thread - (self._clock() - began)
                    if ahead > 0:
                        self._sleep(min(ahead, 0.05))
                        continue
                at = first + offset
                if write:
                    n = os.pwritev(fd, [buf], at)
                    if not self.direct:
                        os.fsync(fd)  # buffered writes must reach the device now, not at writeback
                else:
                    n = os.preadv(fd, [buf], at)
                    if not self.direct:
                        os.posix_fadvise(fd, at, n, os.POSIX_FADV_DONTNEED)  # next pass reads the device
                moved += n
                with self._lock:
                    if write:
                        self.bytes_written += n
                    else:
                        self.bytes_read += n
                offset = (offset + spec.io_bytes) % length
        except OSError as exc:
            self.errors.append(f"{'write' if write else 'read'} {self.path}: {exc}")
        finally:
            os.close(fd)


# -- the agent, attached to a running engine -------------------------------------------------------

ORDER = ("vllm", "disk", "correlation")  # engine and disk counters first, then the window over them


def agent_toml(metrics_url: str, device: str, interval: float = 0.25, requests_jsonl: str = "") -> str:
    """The agent's configuration: vLLM scraper on the engine, disk on G4's device, correlation with G4's path."""
    path = [f'kvscope_disk_read_bytes_total{{device="{device}"}}',
            f'kvscope_disk_written_bytes_total{{device="{device}"}}']
    lines = ["[exporters.prometheus]", "enabled = false", ""]
    if requests_jsonl:
        lines += ["[exporters.jsonl]", "enabled = true", f"path = {json.dumps(requests_jsonl)}", ""]
    lines += ["[analyses.correlation]", f"interval = {interval}",
              "paths = { G4 = [" + ", ".join(f"'{p}'" for p in path) + "] }", ""]
    for name in components().collectors:
        lines.append(f"[collectors.{name}]")
        lines.append(f"enabled = {'true' if name in ORDER else 'false'}")
        if name in ORDER:
            lines.append(f"interval = {interval}")
        if name == "vllm":
            lines += [f"urls = [{json.dumps(metrics_url)}]", 'engine = "reference"',
                      # the reference engine reports G4 hits as vLLM's "external_unspecified" source
                      'cache_hit_source_tiers = { external_unspecified = "G4" }']
        elif name == "disk":
            lines.append(f"include = [{json.dumps(device)}]")
        lines.append("")
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Window:
    """What the correlation engine concluded for G4 at the end of one window."""

    phase: str
    wall: float
    noisy_neighbour: float | None
    bandwidth_drop: float | None
    non_kv_share: float | None
    utilisation: float | None
    path_bps: float  # the device's read + written bytes/s over the window (what the agent's disk series say)
    fetch_bps: float | None  # G4 -> G2 bytes / seconds over the window (None: no fetch ended in it)


@dataclass
class AttachedAgent:
    """The agent, stepped by the caller (see the module docstring) and optionally by a ticker thread."""

    agent: Agent
    wall: Callable[[], float] = time.time
    windows: list[Window] = field(default_factory=list)
    phase: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _ticker: threading.Thread | None = None
    _last: tuple[float, tuple[float, float, float]] | None = None

    @classmethod
    def build(cls, metrics_url: str, device: str, requests_jsonl: str = "") -> AttachedAgent:
        config = load_config(agent_toml(metrics_url, device, requests_jsonl=requests_jsonl), components(),
                             environ={})
        return cls(build_agent(config))

    def step(self) -> None:
        with self._lock:
            for name in ORDER:
                collector = self.agent.collectors.get(name)
                readings = list(collector.collect() if collector is not None else self.agent.analyses[name].run())
                self.agent.store.ingest(name, readings, self.wall())
            now, totals = self.wall(), self._path_totals()
            last, self._last = self._last, (now, totals)
            if last is None or now <= last[0]:
                return
            dt = now - last[0]
            moved, spent = totals[1] - last[1][1], totals[2] - last[1][2]
            self.windows.append(Window(
                self.phase, now, self.gauge("kvscope_tier_noisy_neighbour"),
                self.gauge("kvscope_tier_fetch_bandwidth_drop_ratio"),
                self.gauge("kvscope_tier_path_non_kv_share_ratio"), self.gauge("kvscope_tier_path_utilisation_ratio"),
                (totals[0] - last[1][0]) / dt, moved / spent if spent > 0 else None))

    def _path_totals(self) -> tuple[float, float, float]:
        """(disk bytes read + written, G4 -> G2 bytes, G4 -> G2 seconds) as the store holds them now."""
        store = self.agent.store
        disk = sum(sum(store.values(n).values()) for n in
                   ("kvscope_disk_read_bytes_total", "kvscope_disk_written_bytes_total"))
        moved = sum(v for k, v in store.values(contract.KV_TRANSFER_BYTES).items() if k[3:] == ("G4", "G2"))
        spent = sum(v for k, v in store.values(contract.KV_TRANSFER_SECONDS).items() if k[3:] == ("G4", "G2"))
        return disk, moved, spent

    def gauge(self, name: str, tier: str = "G4") -> float | None:
        return self.agent.store.values(name).get((tier,))

    def totals(self, name: str) -> dict[tuple[str, ...], float]:
        return dict(self.agent.store.values(name))

    def start_ticking(self, interval: float) -> None:
        def tick() -> None:
            while not self._stop.wait(interval):
                self.step()

        self._stop.clear()
        self._ticker = threading.Thread(target=tick, name="agent-ticker", daemon=True)
        self._ticker.start()

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=10)
        for job in self.agent.scheduler.jobs:
            if job.close is not None:
                job.close()


# -- the scenario: shared prompts quiet, then with noise, the agent watching -------------------------


@dataclass(frozen=True, slots=True)
class PhaseView:
    """What the agent's store says about one run: growth of its totals between the run's two ends."""

    label: str
    requests: float  # TTFT histogram count
    ttft: float  # TTFT histogram sum, seconds
    components: dict[str, float]  # aggregate attribution: queue, fetch, prefill, other (seconds)
    g4_bytes: float  # G4 -> G2 transfer bytes (the fetch off G4)
    g4_seconds: float
    windows: list[Window]

    @property
    def fetch_share(self) -> float:
        return self.components.get("fetch", 0.0) / self.ttft if self.ttft else 0.0

    @property
    def raised(self) -> int:
        return sum(1 for w in self.windows if w.noisy_neighbour == 1.0)


@dataclass(frozen=True, slots=True)
class NoisyNeighbourResult:
    device: str
    quiet: LoadResult
    noisy: LoadResult
    quiet_view: PhaseView
    noisy_view: PhaseView
    noise_bytes: int
    noise_seconds: float
    noise_direct: bool


def _snapshot(attached: AttachedAgent, key: tuple[str, str, str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, v in attached.totals("kvscope_ttft_attributed_seconds_total").items():
        if labels[:3] == key:
            out[labels[3]] = out.get(labels[3], 0.0) + v
    store = attached.agent.store
    if key in store.values(contract.TTFT_SECONDS):
        _, _, total, count = store.histogram(contract.TTFT_SECONDS, key)
        out["ttft"], out["requests"] = total, count
    moved = (*key, "G4", "G2")
    out["g4_bytes"] = store.values(contract.KV_TRANSFER_BYTES).get(moved, 0.0)
    out["g4_seconds"] = store.values(contract.KV_TRANSFER_SECONDS).get(moved, 0.0)
    return out


def _view(label: str, start: dict[str, float], end: dict[str, float], windows: list[Window]) -> PhaseView:
    def d(k: str) -> float:
        return end.get(k, 0.0) - start.get(k, 0.0)

    return PhaseView(label, d("requests"), d("ttft"), {c: d(c) for c in ("queue", "fetch", "prefill", "other")},
                     d("g4_bytes"), d("g4_seconds"), [w for w in windows if w.phase == label])


def run_noisy_neighbour(base: EngineConfig, requests: int, prompts: int, concurrency: int, prompt_tokens: int,
                        noise: NoiseSpec, seed: int = 0, interval: float = 0.25) -> NoisyNeighbourResult:
    """The scenario with the agent attached. G4 uses O_DIRECT block files, so fetches hit the device."""
    bt = base.block_tokens
    blocks = -(-prompt_tokens // bt) + 1
    config = replace(base, g1_blocks=max(base.g1_blocks, blocks), g4_blocks=max(base.g4_blocks, prompts * blocks),
                     direct_io=True, kv_events_endpoint=None, kv_events_replay_endpoint=None)
    g4 = config.g4_path or config.data_dir / "g4"
    g4.mkdir(parents=True, exist_ok=True)
    device = block_device_of(g4)
    if device is None:
        raise RuntimeError(f"G4 ({g4}) is not on a block device kvscope's disk collector can see")
    injector = NoiseInjector(g4.parent, noise)
    injector.prepare()  # before anything is timed
    rng = np.random.default_rng(seed)
    pool = [_prompt(rng, prompt_tokens) for _ in range(prompts)]
    order = [pool[i % prompts] for i in range(requests)]
    rng.shuffle(order)
    with running_engine(config) as engine:
        server = ReferenceServer(engine, "127.0.0.1", 0)
        server.start()
        attached = AttachedAgent.build(server.url + "/metrics", device)
        key = ("reference", config.served_model_name, config.engine_index)
        marks: dict[str, dict[str, float]] = {}
        results: list[LoadResult] = []
        try:
            attached.step()  # the first window only establishes the totals
            attached.start_ticking(interval)
            for label in ("quiet", "noisy"):
                engine.clear_cache()
                attached.phase = "fill"
                for tokens in pool:  # the fill, quiet and untimed: both runs measure reuse from G4
                    engine.generate(tokens)
                engine.store.flush()
                attached.phase = label
                attached.step()
                marks[label] = _snapshot(attached, key)
                with injector if label == "noisy" else nullcontext():
                    seconds, truths = _drive(engine, order, concurrency)
                    attached.step()
                    marks[f"{label} end"] = _snapshot(attached, key)
                results.append(LoadResult(label, requests, seconds, truths))
        finally:
            attached.close()
            server.stop()
    injector.path.unlink(missing_ok=True)
    views = [_view(p, marks[p], marks[f"{p} end"], attached.windows) for p in ("quiet", "noisy")]
    return NoisyNeighbourResult(device, results[0], results[1], views[0], views[1], injector.bytes_moved,
                                (injector.stopped_at or 0.0) - (injector.started_at or 0.0), injector.direct)


def format_noisy(r: NoisyNeighbourResult) -> str:
    how = "O_DIRECT" if r.noise_direct else "fsync"
    rows = [f"G4 on {r.device}; noise {r.noise_bytes / 1e9:.2f} GB in {r.noise_seconds:.1f} s "
            f"({r.noise_bytes / max(r.noise_seconds, 1e-9) / 1e9:.2f} GB/s, {how})",
            f"{'run':<6} {'RPS':>6} {'TTFT s':>7} {'fetch share':>11} {'truth':>6} {'queue':>6} {'fetch':>6} "
            f"{'prefill':>7} {'other':>6} {'G4 GB/s':>7} {'raised':>9} {'max drop':>8} {'non-KV':>6}"]
    for load, v in ((r.quiet, r.quiet_view), (r.noisy, r.noisy_view)):
        truth = sum(t.fetch_total_s for t in load.truths) / sum(t.ttft_s for t in load.truths)
        n = max(v.requests, 1.0)
        drops = [w.bandwidth_drop for w in v.windows if w.bandwidth_drop is not None]
        non_kv = [w.non_kv_share for w in v.windows if w.non_kv_share is not None]
        rows.append(f"{load.label:<6} {load.rps:>6.2f} {v.ttft / n:>7.3f} {v.fetch_share:>11.1%} {truth:>6.1%} "
                    + " ".join(f"{v.components[c] / n:>{w}.3f}" for c, w in
                               (("queue", 6), ("fetch", 6), ("prefill", 7), ("other", 6)))
                    + f" {v.g4_bytes / v.g4_seconds / 1e9 if v.g4_seconds else 0:>7.2f}"
                    + f" {v.raised:>3}/{len(v.windows):<3}   {max(drops, default=0):>8.2f} "
                    + f"{max(non_kv, default=0):>6.2f}")
    rows.append(f"per-request seconds; RPS {r.quiet.rps:.2f} -> {r.noisy.rps:.2f} "
                f"({1 - r.noisy.rps / r.quiet.rps:.1%} lower; seeds: 4.26 -> 3.6 RPS with 200 GB/s of "
                "unrelated traffic)")
    return "\n".join(rows) + "\n"
