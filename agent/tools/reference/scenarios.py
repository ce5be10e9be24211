"""The seeds' two experiments at laptop scale, deterministic for a seed, run in-process on the engine.

- ttft-sweep: prompts across a range of lengths, each sent cold (computed) and then warm (reused).
  With the seeds' configuration (G1 and G2 keep nothing, no G3) every warm block comes from G4.
- shared-prompts: N requests drawn from M prompts (each used N/M times, shuffled, as AIPerf's default
  sampling does) at concurrency C, cache starting empty; once with the cache and once as a recompute
  baseline (no prefix caching, no offload). RPS, total time and the speedup, like the seeds' table.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from kvscope.agent.tools.reference.engine import Engine, EngineConfig
from kvscope.agent.tools.reference.tokenizer import VOCAB
from kvscope.agent.tools.reference.truth import RequestTruth


@contextmanager
def running_engine(config: EngineConfig) -> Iterator[Engine]:
    """The default engine factory; `kvscope selftest` passes one that also attaches the agent."""
    engine = Engine(config)
    engine.start()
    try:
        yield engine
    finally:
        engine.stop()


def _prompt(rng: np.random.Generator, tokens: int) -> list[int]:
    return [int(t) for t in rng.integers(0, VOCAB, tokens)]


def _blocks(tokens: int, block_tokens: int) -> int:
    return -(-tokens // block_tokens) + 1


@dataclass(frozen=True, slots=True)
class SweepRow:
    prompt_tokens: int
    cold: RequestTruth
    warm: RequestTruth

    @property
    def speedup(self) -> float:
        return self.cold.ttft_s / self.warm.ttft_s if self.warm.ttft_s else 0.0


EngineFactory = Callable[[EngineConfig], AbstractContextManager[Engine]]


def sweep_config(base: EngineConfig, lengths: list[int]) -> EngineConfig:
    """`base` with G1 large enough for the longest prompt and G4 for all of them."""
    bt = base.block_tokens
    return replace(base, g1_blocks=max(base.g1_blocks, _blocks(max(lengths), bt)),
                   g4_blocks=max(base.g4_blocks, sum(_blocks(n, bt) for n in lengths)))


def recompute_sweep(base: EngineConfig, lengths: list[int], seed: int = 0,
                    engine_factory: EngineFactory = running_engine) -> list[RequestTruth]:
    """The sweep's prompts (the same as ttft_sweep's for a seed), each sent once to the engine without a
    cache: what every length costs when nothing is reused."""
    rng = np.random.default_rng(seed)
    with engine_factory(recompute_config(sweep_config(base, lengths))) as engine:
        return [engine.generate(_prompt(rng, n)) for n in lengths]


def ttft_sweep(base: EngineConfig, lengths: list[int], seed: int = 0,
               engine_factory: EngineFactory = running_engine) -> list[SweepRow]:
    config = sweep_config(base, lengths)
    rng = np.random.default_rng(seed)
    rows = []
    with engine_factory(config) as engine:
        engine.clear_cache()
        for n in lengths:
            tokens = _prompt(rng, n)
            cold = engine.generate(tokens)
            engine.store.flush()  # the seeds' test reads back a filled cache: let the stores land
            rows.append(SweepRow(n, cold, engine.generate(tokens)))
    return rows


def format_sweep(rows: list[SweepRow]) -> str:
    out = [f"{'tokens':>8} {'cold TTFT s':>12} {'cold offload s':>15} {'warm TTFT s':>12} {'speedup':>8} "
           f"{'reused':>8} {'fetch s':>8} {'fetch GB/s':>10} {'compute s':>10}"]
    for r in rows:
        w = r.warm
        fetch, moved = w.fetch_total_s, sum(w.fetch_bytes.values())
        out.append(f"{r.prompt_tokens:>8} {r.cold.ttft_s:>12.3f} {r.cold.offload_s:>15.3f} {w.ttft_s:>12.3f} "
                   f"{r.speedup:>7.1f}x {sum(w.tokens_by_tier.values()):>8} {fetch:>8.3f} "
                   f"{moved / fetch / 1e9 if fetch else 0:>10.2f} {w.prefill_compute_s:>10.3f}")
    return "\n".join(out) + "\n"


@dataclass(frozen=True, slots=True)
class LoadResult:
    label: str
    requests: int
    seconds: float
    truths: list[RequestTruth]

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    @property
    def mean_ttft(self) -> float:
        return sum(t.ttft_s for t in self.truths) / len(self.truths)

    @property
    def reused_share(self) -> float:
        prompt = sum(t.prompt_tokens for t in self.truths)
        return sum(sum(t.tokens_by_tier.values()) for t in self.truths) / prompt


def _drive(engine: Engine, order: list[list[int]], concurrency: int,
           clock: Callable[[], float] = time.perf_counter) -> tuple[float, list[RequestTruth]]:
    """C closed-loop clients, each sending its next request when the previous one finishes."""
    lock = threading.Lock()
    pending = iter(order)
    truths: list[RequestTruth] = []

    def client() -> None:
        while True:
            with lock:
                tokens = next(pending, None)
            if tokens is None:
                return
            truth = engine.generate(tokens)
            with lock:
                truths.append(truth)

    start = clock()
    threads = [threading.Thread(target=client, name=f"client-{i}") for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return clock() - start, truths


def prompt_order(requests: int, prompts: int, prompt_tokens: int, seed: int = 0,
                 min_tokens: int | None = None) -> list[list[int]]:
    """N requests drawn from M prompts, each used N/M times in a seeded shuffle. Prompts are `prompt_tokens`
    long, or of lengths drawn uniformly from [min_tokens, prompt_tokens] when min_tokens is given."""
    rng = np.random.default_rng(seed)
    lengths = ([prompt_tokens] * prompts if min_tokens is None
               else [int(n) for n in rng.integers(min_tokens, prompt_tokens + 1, prompts)])
    pool = [_prompt(rng, n) for n in lengths]
    order = [pool[i % prompts] for i in range(requests)]
    rng.shuffle(order)
    return order


def prefix_order(requests: int, seed: int = 0, systems: int = 2, system_tokens: int = 64, documents: int = 16,
                 document_tokens: tuple[int, int] = (128, 512), question_tokens: tuple[int, int] = (8, 32),
                 answer_tokens: tuple[int, int] = (16, 48), turns: tuple[int, int] = (2, 6), active: int = 6,
                 zipf: float = 1.0) -> list[list[int]]:
    """Prompts that share prefixes at several popularities, as a chat service over documents sees them.

    Each conversation starts with a system prompt (one of `systems`, Zipf-popular: shared by nearly every
    request), then a document (one of `documents`, Zipf-popular: shared by many conversations), then a
    question; each later turn (`turns` in all) resends the whole conversation with the previous answer and a
    new question appended (reused by that conversation's next turn only). `active` conversations are open at
    once and each request continues one of them at random, so a history is reused after the other
    conversations' requests: how long it survives is what the cache's size decides. A document's KV depends on
    the system prompt before it, so each (system, document) pair is a prefix of its own."""
    rng = np.random.default_rng(seed)
    system = [_prompt(rng, system_tokens) for _ in range(systems)]
    docs = [_prompt(rng, int(rng.integers(document_tokens[0], document_tokens[1] + 1))) for _ in range(documents)]

    def popular(n: int) -> int:
        weights = 1.0 / np.arange(1, n + 1) ** zipf
        return int(rng.choice(n, p=weights / weights.sum()))

    def tokens(span: tuple[int, int]) -> list[int]:
        return _prompt(rng, int(rng.integers(span[0], span[1] + 1)))

    open_: list[tuple[list[int], int]] = []  # (history, turns left)
    order: list[list[int]] = []
    while len(order) < requests:
        while len(open_) < active:
            open_.append((system[popular(systems)] + docs[popular(documents)], int(rng.integers(turns[0],
                                                                                              turns[1] + 1))))
        i = int(rng.integers(len(open_)))
        history, left = open_[i]
        prompt = history + tokens(question_tokens)
        order.append(prompt)
        if left > 1:
            open_[i] = (prompt + tokens(answer_tokens), left - 1)
        else:
            open_.pop(i)
    return order


def cache_config(base: EngineConfig, prompts: int, prompt_tokens: int) -> EngineConfig:
    """`base` with G1 large enough for one prompt and G4 for all of them."""
    bt = base.block_tokens
    return replace(base, g1_blocks=max(base.g1_blocks, _blocks(prompt_tokens, bt)),
                   g4_blocks=max(base.g4_blocks, prompts * _blocks(prompt_tokens, bt)))


def recompute_config(config: EngineConfig) -> EngineConfig:
    """The same engine without the cache: no prefix caching, no tier keeps anything."""
    return replace(config, prefix_caching=False, g1_retain=False, g2_blocks=0, g3_blocks=0, g4_blocks=0)


def run_load(config: EngineConfig, label: str, order: list[list[int]], concurrency: int,
             engine_factory: EngineFactory = running_engine) -> LoadResult:
    """One engine, cache starting empty, the requests of `order` from `concurrency` closed-loop clients."""
    with engine_factory(config) as engine:
        engine.clear_cache()
        seconds, truths = _drive(engine, order, concurrency)
    return LoadResult(label, len(order), seconds, truths)


def shared_prompts(base: EngineConfig, requests: int, prompts: int, concurrency: int, prompt_tokens: int,
                   seed: int = 0, engine_factory: EngineFactory = running_engine) -> tuple[LoadResult, LoadResult]:
    order = prompt_order(requests, prompts, prompt_tokens, seed)
    cached = cache_config(base, prompts, prompt_tokens)
    return (run_load(cached, "G4 cache", order, concurrency, engine_factory),
            run_load(recompute_config(cached), "recompute", order, concurrency, engine_factory))


def format_load(cache: LoadResult, recompute: LoadResult) -> str:
    out = [f"{'run':<10} {'requests':>8} {'total s':>8} {'RPS':>7} {'mean TTFT s':>12} {'reused':>7}"]
    for r in (recompute, cache):
        out.append(f"{r.label:<10} {r.requests:>8} {r.seconds:>8.2f} {r.rps:>7.2f} {r.mean_ttft:>12.3f} "
                   f"{100 * r.reused_share:>6.1f}%")
    out.append(f"speedup {recompute.seconds / cache.seconds:.2f}x including the cold fill "
               f"(seeds, one GPU against 8-node Storage Scale: 22x)")
    return "\n".join(out) + "\n"


@contextmanager
def data_dir(path: Path | None) -> Iterator[Path]:
    """The given directory, or a temporary one removed afterwards."""
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="kvscope-reference-") as tmp:
        yield Path(tmp)
