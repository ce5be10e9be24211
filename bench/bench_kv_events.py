"""Benchmark of the vLLM KV-event subscriber (collectors/kv_events/collector.py), issue 16 goal 3.

(a) Decode + aggregate rate of our pipeline (frame checks, msgspec decode, sequence check, residency and
    reuse distance, the what-if analysis' access stream: everything `handle()` does for a live message, in the
    agent's default configuration) on one core (the process is pinned to
    one CPU), next to msgspec's raw typed decode of the same batches in the same run: the full vLLM
    schema (the reference of shared/facts/perf-baselines.md §3) and the subset of fields we decode.
    Batches: 32 events, full-range uint64 hashes, parent = previous hash, 16 token ids below 128256,
    block_size 16, medium GPU. Variants: all new blocks; half the stores re-announce blocks
    (kv_cache_report_mode=full style); 25 % BlockRemoved; vLLM <= 0.23's array-form events. Rounds
    interleave every variant, so a load change hits all of them alike. Goal: >= 1 M block events/s for new
    blocks with the default configuration, on the median round.
(b) The whole agent (`kvscope run`, bench/kv_live.py) subscribed to a publisher process over loopback TCP at
    50 k, 200 k and 1 M events/s in batches of 16 and of 512 events: its CPU per block event and share of a
    core (everything: ZMQ's I/O thread, the socket thread, scrapes once a second), RSS, scrape latency and
    loss counters. Beside it a bare subscriber (a SUB socket that only receives the frames, looking as often
    as the agent would) at 50 k events/s in both batch sizes, each run right after the agent's at that rate
    and size (this VM's speed drifts from minute to minute): the floor that ZMQ and Python set before any
    decoding. Goal: <= 1 µs per block event,
    50 k events/s within 5 % of one core, in batches of 16 and of 512 (median of rounds).

Run: .venv/bin/python bench/bench_kv_events.py [--quick]   (about 4 minutes; --quick about 1.5)
"""

from __future__ import annotations

import logging
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "lib"))  # testkit; kvscope itself is installed
sys.path.insert(0, str(Path(__file__).resolve().parent))

import msgspec
import zmq

from kvscope.agent.core.kv_access import KvAccessLog
from kvscope.agent.tools.reference.vllm_kv_wire import (
    Vllm020Batch,
    Vllm020BlockStored,
    Vllm033Batch,
    Vllm033BlockRemoved,
    Vllm033BlockStored,
)
from kvscope.collectors.kv_events.collector import VllmKvEventsCollector, VllmKvEventsOptions
from kvscope.collectors.kv_events.schema import GpuStoresBatch, LegacyBatch, MapBatch

EVENTS_PER_BATCH = 32
GOAL = 1_000_000  # block events/s, decode + aggregate, one core
SMALL_BATCH_ABOVE_FLOOR_US = 1.0  # 16-event batches: CPU per event above a bare subscriber at the same rate
LARGE_BATCH_US = 1.5  # 512-event batches: CPU per event, all in
DEFAULT_RATE = VllmKvEventsOptions.reuse_sample_rate


def make_payloads(n: int, seed: int, removed: int = 0, legacy: bool = False) -> list[bytes]:
    """n batches of EVENTS_PER_BATCH events: `removed` BlockRemoved of the previous batch's first blocks
    (an engine step evicts, then caches), then BlockStored of new blocks."""
    rng = random.Random(seed)
    enc = msgspec.msgpack.Encoder()
    out = []
    previous: list[int] = [rng.getrandbits(64) for _ in range(removed)]
    for _ in range(n):
        parent = None
        events: list[Any] = [Vllm033BlockRemoved([h], "GPU") for h in previous[:removed]]
        stored: list[int] = []
        for _ in range(EVENTS_PER_BATCH - removed):
            h = rng.getrandbits(64)
            tokens = [rng.randrange(128256) for _ in range(16)]
            cls = Vllm020BlockStored if legacy else Vllm033BlockStored
            events.append(cls([h], parent, tokens, 16, None, "GPU", None))
            stored.append(h)
            parent = h
        previous = stored
        batch = Vllm020Batch(time.time(), events, 0) if legacy else Vllm033Batch(time.time(), events, 0)
        out.append(enc.encode(batch))
    return out


def options(endpoint: str = "tcp://127.0.0.1:1", rcvhwm: int = 100000,
            rate: float = DEFAULT_RATE) -> VllmKvEventsOptions:
    return VllmKvEventsOptions(endpoint=endpoint, model="bench", rcvhwm=rcvhwm, reuse_sample_rate=rate)


# -- (a) decode + aggregate ------------------------------------------------------------------------------


def run_pipeline(ctx: zmq.Context[Any], frames: list[list[bytes]], rate: float, what_if: bool = True) -> float:
    """Events/s of collector.handle() over `frames` with a fresh collector (a new subscriber). `what_if`: the
    agent's default, the what-if analysis on, so the collector also hands its sampled G1 stores to an access
    log (nothing drains it here: its bounded queue stays full, as when the analysis falls behind)."""
    collector = VllmKvEventsCollector(options(rate=rate), ctx, access_log=KvAccessLog(1 << 16) if what_if else None)
    stream = collector.streams[0]
    handle = collector.handle
    t0 = time.perf_counter()
    for f in frames:
        handle(stream, f)
    dt = time.perf_counter() - t0
    events = sum(stream.residency.events)
    assert events == len(frames) * EVENTS_PER_BATCH and stream.malformed == 0
    return events / dt


def run_raw(decoder: msgspec.msgpack.Decoder[Any], payloads: list[bytes]) -> float:
    decode = decoder.decode
    t0 = time.perf_counter()
    n = 0
    for p in payloads:
        n += len(decode(p).events)
    return n / (time.perf_counter() - t0)


def seq_frames(payloads: list[bytes], repeat: int = 1) -> list[list[bytes]]:
    return [[b"", i.to_bytes(8, "big"), payloads[i % len(payloads)]] for i in range(repeat * len(payloads))]


def fmt(xs: list[float]) -> str:
    return f"{min(xs) / 1e6:.2f} / {statistics.median(xs) / 1e6:.2f} / {max(xs) / 1e6:.2f} M"


def bench_decode(ctx: zmq.Context[Any], rounds: int = 15) -> None:
    new = make_payloads(2048, seed=1)
    mixed = make_payloads(2048, seed=3, removed=EVENTS_PER_BATCH // 4)
    legacy = make_payloads(2048, seed=4, legacy=True)
    full33, sub33 = msgspec.msgpack.Decoder(Vllm033Batch), msgspec.msgpack.Decoder(MapBatch)
    gpu33 = msgspec.msgpack.Decoder(GpuStoresBatch)
    full20, sub20 = msgspec.msgpack.Decoder(Vllm020Batch), msgspec.msgpack.Decoder(LegacyBatch)
    rate = f"rate 1/{1 / DEFAULT_RATE:.0f}"
    goal_case = f"kvscope, new blocks ({rate}, the default)"
    # (name, run, reference case for the ratio column)
    ref33, ref_mixed, ref20 = ("raw msgspec decode, full 0.33 schema (reference)",
                               "raw msgspec decode, full schema, 25 % removed",
                               "raw msgspec decode, full 0.20 array schema")
    cases: list[tuple[str, Callable[[], float], str]] = [
        (ref33, lambda: run_raw(full33, new), ref33),
        ("raw msgspec decode, subset structs (MapBatch)", lambda: run_raw(sub33, new), ref33),
        ("raw msgspec decode, GPU-stores subset (ours here)", lambda: run_raw(gpu33, new), ref33),
        (goal_case, lambda: run_pipeline(ctx, seq_frames(new), DEFAULT_RATE), ref33),
        ("kvscope, new blocks (default, what-if analysis off)",
         lambda: run_pipeline(ctx, seq_frames(new), DEFAULT_RATE, what_if=False), ref33),
        ("kvscope, new blocks (exact reuse, rate 1)", lambda: run_pipeline(ctx, seq_frames(new), 1.0), ref33),
        (f"kvscope, half the stores are reuses ({rate})",
         lambda: run_pipeline(ctx, seq_frames(new, 2), DEFAULT_RATE), ref33),
        ("kvscope, half the stores are reuses (rate 1)", lambda: run_pipeline(ctx, seq_frames(new, 2), 1.0),
         ref33),
        (ref_mixed, lambda: run_raw(full33, mixed), ref_mixed),
        (f"kvscope, 25 % BlockRemoved ({rate})", lambda: run_pipeline(ctx, seq_frames(mixed), DEFAULT_RATE),
         ref_mixed),
        (ref20, lambda: run_raw(full20, legacy), ref20),
        ("raw msgspec decode, subset (LegacyBatch)", lambda: run_raw(sub20, legacy), ref20),
        (f"kvscope, vLLM 0.20 arrays, new blocks ({rate})",
         lambda: run_pipeline(ctx, seq_frames(legacy), DEFAULT_RATE), ref20),
    ]
    size = statistics.median(len(p) for p in new)
    print(f"(a) decode + aggregate, one thread on CPU {pin_one_core()}: 2048 batches x {EVENTS_PER_BATCH} events, "
          f"median {size:.0f} B/batch, {rounds} interleaved rounds.\n"
          "    events/s slowest / median / fastest round; ratio to the full-schema decode of the same round "
          "(median of rounds, and of the fastest rounds)")
    results: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    for _ in range(rounds):
        for name, case, _ in cases:
            results[name].append(case())
    for name, _, ref in cases:
        xs = results[name]
        ratio = statistics.median(x / r for x, r in zip(xs, results[ref], strict=True))
        print(f"    {name:<52} {fmt(xs):>22}   x{ratio:.2f} (x{max(xs) / max(results[ref]):.2f})")
    ours, full = results[goal_case], results[ref33]
    from machine import cpu_model
    print(f"    this machine: {cpu_model()}; perf-baselines §3 measured the reference at 1.40-1.46 M (medians) "
          f"on a 2.8 GHz Intel Xeon VM; here it ran {fmt(full)}")
    from goals import spread, verdict
    verdict("3: in-process decode + aggregate, new blocks, default config", spread([x / 1e6 for x in ours], "M ev/s",
            2), f"goal {GOAL / 1e6:.0f} M; msgspec full decode {spread([x / 1e6 for x in full], 'M', 2)}",
            f"x{statistics.median(ours) / GOAL:.2f}", statistics.median(ours) >= GOAL)


def pin_one_core() -> int:
    """Run on the last CPU this process may use (part (a) measures one core) and return it."""
    cpu = max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


# -- (b) the whole agent, live ------------------------------------------------------------------------


def bench_live(rounds: int, seconds: float) -> None:
    import kv_live
    from goals import spread, verdict
    cases = [(rate, events) for rate in (50e3, 200e3, 1e6) for events in (16, 512)]
    results: dict[tuple[float, int], list[kv_live.LiveResult]] = {case: [] for case in cases}
    floors: dict[int, list[float]] = {16: [], 512: []}
    for _ in range(rounds):
        for rate, events in cases:
            results[(rate, events)].append(kv_live.run(rate, events, seconds))
            if rate == 50e3:  # the floor right after the agent at its rate: a VM that drifts by the minute
                floors[events].append(kv_live.bare_floor(50e3, events, seconds) * 1e6)
    print(f"(b) the whole agent under a publisher process, {rounds} rounds of {seconds:g} s per case, median "
          "(min-max) of rounds\n    offered       batch  CPU µs/event          core share   RSS MiB  scrape ms  "
          "sent    applied   dropped (shed, missed)  unaccounted")
    for (rate, events), runs in results.items():
        us, share = [r.us_per_event for r in runs], [r.core_share for r in runs]
        last = runs[-1]
        rss, scrape = statistics.median(r.rss_mib for r in runs), statistics.median(r.scrape_ms for r in runs)
        print(f"    {rate / 1e3:6.0f} k/s  {events:5d}  {spread(us, '', 2):<22} {statistics.median(share):6.1%}    "
              f"{rss:6.0f}   {scrape:6.1f}  {last.sent:>7} {last.applied / events:>9.0f} {last.dropped:>9.0f} "
              f"({last.shed:.0f}, {last.missed:.0f})  {last.sent - last.applied / events - last.dropped:>6.0f}")
    for events, values in floors.items():
        above = ", ".join(f"{r.us_per_event - f:+.2f}" for r, f in zip(results[(50e3, events)], values, strict=True))
        print(f"    bare subscriber (receive only), 50 k/s in batches of {events:3d}: {spread(values, 'µs/event', 2)}: "
              f"ZMQ and Python's wake-ups alone, before any decoding; the agent above it round by round: {above}")
    # restated in issue 27 from the floors measured then (4.23 and 1.38 µs/event all in): small batches within
    # 1 µs per event of a bare pyzmq subscriber's own cost at the same rate, large ones 1.5 µs all in
    us16 = statistics.median(r.us_per_event for r in results[(50e3, 16)])
    floor16 = statistics.median(floors[16])
    verdict("3: live agent at 50 k events/s, batches of 16, above a bare subscriber",
            f"{spread([r.us_per_event for r in results[(50e3, 16)]], 'µs/event', 2)} all in",
            f"bare receive {floor16:.2f} µs + goal {SMALL_BATCH_ABOVE_FLOOR_US:g} µs",
            f"+{us16 - floor16:.2f} µs", us16 - floor16 <= SMALL_BATCH_ABOVE_FLOOR_US)
    us512 = [r.us_per_event for r in results[(50e3, 512)]]
    verdict("3: live agent at 50 k events/s, batches of 512, all in", spread(us512, "µs/event", 2),
            f"goal {LARGE_BATCH_US:g} µs; bare receive {statistics.median(floors[512]):.2f} µs",
            f"x{statistics.median(us512) / LARGE_BATCH_US:.2f}", statistics.median(us512) <= LARGE_BATCH_US)


def main() -> int:
    from machine import Load, state
    quick = "--quick" in sys.argv[1:]
    logging.getLogger("kvscope").setLevel(logging.ERROR)
    load = Load()
    print(state(load), flush=True)
    t0 = time.perf_counter()
    ctx: zmq.Context[Any] = zmq.Context()
    cpus = os.sched_getaffinity(0)
    bench_decode(ctx, 7 if quick else 15)
    os.sched_setaffinity(0, cpus)  # part (b) runs a publisher process beside the agent
    ctx.term()
    bench_live(1 if quick else 3, 3.0 if quick else 4.0)
    print(f"total {time.perf_counter() - t0:.0f} s")
    print(state(load))
    return 0


if __name__ == "__main__":
    sys.exit(main())
