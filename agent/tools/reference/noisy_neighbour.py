"""The noisy-neighbour scenario: shared prompts served from G4, once quiet and once with competing I/O
on G4's device, the agent attached (the seeds' test: 200 GB/s of unrelated traffic on the fabric took
4.26 RPS down to 3.6).

`run_noisy_neighbour` runs the reference engine with the noise of `agent.reference.noise` and the agent
of `agent.reference.attached_agent`, and reads, per run, what the agent's store says (`PhaseView`).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, replace

import numpy as np

from kvscope.agent.core import contract
from kvscope.agent.core.records import COMPONENTS
from kvscope.agent.tools.reference.attached_agent import AttachedAgent, Window
from kvscope.agent.tools.reference.engine import EngineConfig
from kvscope.agent.tools.reference.noise import NoiseInjector, NoiseSpec
from kvscope.agent.tools.reference.openai_server import ReferenceServer
from kvscope.agent.tools.reference.scenarios import LoadResult, _drive, _prompt, running_engine
from kvscope.collectors.host.inputs import block_device_of

# How long a run's end waits for its last requests' attribution (released within a scrape or two of the
# engine observing their phases; the aggregate's own hold ends by 30 s at most).
SETTLE_DEADLINE_SECONDS = 35.0


@dataclass(frozen=True, slots=True)
class PhaseView:
    """What the agent's store says about one run: growth of its totals between the run's two ends."""

    label: str
    requests: float  # TTFT histogram count
    ttft: float  # TTFT histogram sum, seconds
    components: dict[str, float]  # aggregate attribution per component (seconds)
    g4_bytes: float  # G4 -> G2 transfer bytes (the fetch off G4)
    g4_seconds: float
    windows: list[Window]
    settled: bool  # every request of the run was counted and its TTFT wholly attributed at the end

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


def _growth(start: dict[str, float], end: dict[str, float], key: str) -> float:
    return end.get(key, 0.0) - start.get(key, 0.0)


def _attributed(start: dict[str, float], end: dict[str, float], requests: int) -> bool:
    """Every request of the run counted, and the components of the aggregate attribution add up to its TTFT
    (a window whose TTFTs are ahead of their queue and prefill times is held back until they come)."""
    ttft = _growth(start, end, "ttft")
    parts = sum(_growth(start, end, c) for c in COMPONENTS)
    return _growth(start, end, "requests") == requests and abs(parts - ttft) <= 1e-6 * max(ttft, 1.0)


def _settled_snapshot(attached: AttachedAgent, key: tuple[str, str, str], start: dict[str, float],
                      requests: int, interval: float, deadline: float = SETTLE_DEADLINE_SECONDS
                      ) -> tuple[dict[str, float], bool]:
    """The totals once the run is wholly attributed: the engine observes a request's queue and prefill time a
    moment after its client has the last token, so the window read right then is still held. Steps (as a
    reader does) until it is released; (totals, settled) — not settled at the deadline."""
    phase, attached.phase = attached.phase, "settle"  # the windows stepped here belong to neither run
    try:
        ends = time.monotonic() + deadline
        while True:
            attached.step()
            end = _snapshot(attached, key)
            if _attributed(start, end, requests):
                return end, True
            if time.monotonic() > ends:
                return end, False
            time.sleep(interval)
    finally:
        attached.phase = phase


def _view(label: str, start: dict[str, float], end: dict[str, float], windows: list[Window],
          settled: bool) -> PhaseView:
    def d(k: str) -> float:
        return _growth(start, end, k)

    return PhaseView(label, d("requests"), d("ttft"), {c: d(c) for c in COMPONENTS},
                     d("g4_bytes"), d("g4_seconds"), [w for w in windows if w.phase == label], settled)


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
        settled: dict[str, bool] = {}
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
                    attached.step()  # the run's last window, then (outside it) until its attribution is whole
                    marks[f"{label} end"], settled[label] = _settled_snapshot(attached, key, marks[label],
                                                                              requests, interval)
                results.append(LoadResult(label, requests, seconds, truths))
        finally:
            attached.close()
            server.stop()
    injector.path.unlink(missing_ok=True)
    views = [_view(p, marks[p], marks[f"{p} end"], attached.windows, settled[p]) for p in ("quiet", "noisy")]
    return NoisyNeighbourResult(device, results[0], results[1], views[0], views[1], injector.bytes_moved,
                                (injector.stopped_at or 0.0) - (injector.started_at or 0.0), injector.direct)


def format_noisy(r: NoisyNeighbourResult) -> str:
    how = "O_DIRECT" if r.noise_direct else "fsync"
    rows = [f"G4 on {r.device}; noise {r.noise_bytes / 1e9:.2f} GB in {r.noise_seconds:.1f} s "
            f"({r.noise_bytes / max(r.noise_seconds, 1e-9) / 1e9:.2f} GB/s, {how})",
            f"{'run':<6} {'RPS':>6} {'TTFT s':>7} {'fetch share':>11} {'truth':>6} {'frontend':>8} "
            f"{'queue':>6} {'fetch':>6} {'prefill':>7} {'other':>6} {'G4 GB/s':>7} {'raised':>9} {'max drop':>8} "
            f"{'non-KV':>6}"]
    for load, v in ((r.quiet, r.quiet_view), (r.noisy, r.noisy_view)):
        truth = sum(t.fetch_total_s for t in load.truths) / sum(t.ttft_s for t in load.truths)
        n = max(v.requests, 1.0)
        drops = [w.bandwidth_drop for w in v.windows if w.bandwidth_drop is not None]
        non_kv = [w.non_kv_share for w in v.windows if w.non_kv_share is not None]
        rows.append(f"{load.label:<6} {load.rps:>6.2f} {v.ttft / n:>7.3f} {v.fetch_share:>11.1%} {truth:>6.1%} "
                    + " ".join(f"{v.components[c] / n:>{w}.3f}" for c, w in
                               (("frontend", 8), ("queue", 6), ("fetch", 6), ("prefill", 7), ("other", 6)))
                    + f" {v.g4_bytes / v.g4_seconds / 1e9 if v.g4_seconds else 0:>7.2f}"
                    + f" {v.raised:>3}/{len(v.windows):<3}   {max(drops, default=0):>8.2f} "
                    + f"{max(non_kv, default=0):>6.2f}")
    rows.append(f"per-request seconds; RPS {r.quiet.rps:.2f} -> {r.noisy.rps:.2f} "
                f"({1 - r.noisy.rps / r.quiet.rps:.1%} lower; seeds: 4.26 -> 3.6 RPS with 200 GB/s of "
                "unrelated traffic)")
    return "\n".join(rows) + "\n"
