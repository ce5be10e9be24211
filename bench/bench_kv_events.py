"""Benchmark of the vLLM KV-event subscriber (collectors/vllm_kv_events.py).

(a) Decode + aggregate rate of our pipeline (frame checks, msgspec decode, sequence check, residency and
    reuse distance, the what-if analysis' access stream: everything `handle()` does for a live message, in the
    agent's default configuration) on one core (the process is pinned to
    one CPU), next to msgspec's raw typed decode of the same batches in the same run: the full vLLM
    schema (the reference of shared/facts/perf-baselines.md §3) and the subset of fields we decode. The
    issue's goal: >= 1 M block events/s for new blocks with the default configuration. Batches: 32
    events, full-range uint64 hashes, parent = previous hash, 16 token ids below 128256, block_size 16,
    medium GPU. Variants: all new blocks; half the stores re-announce blocks (kv_cache_report_mode=full
    style); 25 % BlockRemoved; vLLM <= 0.23's array-form events. Our pipeline runs with the default
    reuse_sample_rate (1/16) and exactly (rate 1). Rounds interleave every variant, so a load change
    hits all of them alike. The goal is judged on the fastest round (timeit's convention: slower rounds
    measure other load on the VM's host, which is invisible to the guest); the median and the ratio to
    the full-schema decode of the same round are printed beside it.
(b) Over a real loopback ZMQ socket with a publisher process: step the offered rate, report the highest
    rate with no loss, and above it check that every lost batch was detected from the sequence numbers
    (sent - received == kvscope_kv_events_missed_total). Queues are ZMQ's default 1000 messages on both
    sides here, so that overload shows as loss within seconds instead of as a backlog. Each rate also
    goes to perf-baselines §3d's reference subscriber (decode only, no residency) for a same-run limit.

Run: .venv/bin/python bench/bench_kv_events.py   (about 1.5 minutes on 2 cores; exits 0).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec
import zmq

from kvscope.agent.kv_access import KvAccessLog
from kvscope.agent.reference.vllm_kv_wire import (
    Vllm020Batch,
    Vllm020BlockStored,
    Vllm033Batch,
    Vllm033BlockRemoved,
    Vllm033BlockStored,
)
from kvscope.collectors.kv_event_schema import GpuStoresBatch, LegacyBatch, MapBatch
from kvscope.collectors.vllm_kv_events import VllmKvEventsCollector, VllmKvEventsOptions

EVENTS_PER_BATCH = 32
GOAL = 1_000_000  # block events/s, decode + aggregate, one core
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
    print(f"    this machine: {cpu_model()}; perf-baselines §3 measured the reference at 1.40-1.46 M (medians) "
          f"on a 2.8 GHz Intel Xeon VM; here it ran {fmt(full)}")
    met = max(ours) >= GOAL
    print(f"    goal >= {GOAL / 1e6:.2f} M events/s decode + aggregate on one core (new blocks, default config): "
          f"fastest round {max(ours) / 1e6:.2f} M -> {'MET' if met else 'NOT MET'} in this run; median "
          f"{statistics.median(ours) / 1e6:.2f} M.\n"
          "    The fastest round is the core without interference (timeit's convention). On the shared development "
          "VM a core\n    flips between two speeds from second to second, whatever runs in the guest (the reference "
          "decode ~1.2 M or\n    ~0.7 M), which moves the median; docs/vllm-kv-events.md shows it.")


def pin_one_core() -> int:
    """Run on the last CPU this process may use (part (a) measures one core) and return it."""
    cpu = max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


# -- (b) loopback ZMQ --------------------------------------------------------------------------------------


def publisher(conn: Connection, payloads: list[bytes], rate: float, seconds: float) -> None:
    ctx: zmq.Context[Any] = zmq.Context()
    sock = ctx.socket(zmq.XPUB)  # XPUB: wait for the subscription instead of guessing (slow joiner)
    sock.setsockopt(zmq.SNDHWM, 1000)
    sock.bind("tcp://127.0.0.1:*")
    conn.send(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    assert sock.poll(10000), "no subscriber"
    sock.recv()
    per_s = rate / EVENTS_PER_BATCH
    n = len(payloads)
    seq = 0
    t0 = time.perf_counter()
    while True:
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            break
        target = int(elapsed * per_s) + 1 if rate else seq + 64
        while seq < target:
            sock.send_multipart([b"", seq.to_bytes(8, "big"), payloads[seq % n]])
            seq += 1
        if rate:
            time.sleep(0.0002)
    time.sleep(1.0)  # let the queues drain, then one last batch exposes any loss at the tail
    sock.send_multipart([b"", seq.to_bytes(8, "big"), payloads[seq % n]])
    seq += 1
    conn.send((seq, time.perf_counter() - t0 - 1.0))
    time.sleep(0.3)
    sock.close(0)
    ctx.term()


class OurSubscriber:
    """kvscope's collector, started on its own socket thread, seen the way step() reads a subscriber."""

    def __init__(self, endpoint: str, rcvhwm: int) -> None:
        self._collector = VllmKvEventsCollector(options(endpoint, rcvhwm=rcvhwm))
        self._collector.start()
        self._stream = self._collector.streams[0]

    @property
    def expected(self) -> int | None:
        return self._stream.expected

    def counts(self) -> tuple[float, float, float]:
        """(batches received, batches missed by seq, batches dropped by seq)."""
        s = self._stream
        return s.residency.events[0] / EVENTS_PER_BATCH, s.missed, s.dropped

    def close(self) -> None:
        self._collector.close()


class ReferenceSubscriber:
    """perf-baselines §3d's subscriber, for the same-run comparison: blocking recv_multipart, msgspec typed
    decode of the full 0.33 schema, a contiguity check of the sequence numbers; no residency."""

    def __init__(self, endpoint: str, rcvhwm: int) -> None:
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.RCVHWM, rcvhwm)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.connect(endpoint)
        self.expected = self.received = self.missed = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        decode = msgspec.msgpack.Decoder(Vllm033Batch).decode
        sock = self._sock
        while not self._stop:
            if not sock.poll(50):
                continue
            _, seq_frame, payload = sock.recv_multipart()
            seq = int.from_bytes(seq_frame, "big")
            decode(payload)
            self.missed += seq - self.expected
            self.expected = seq + 1
            self.received += 1

    def counts(self) -> tuple[float, float, float]:
        return self.received, self.missed, self.missed

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self._sock.close(0)
        self._ctx.term()


def step(payloads: list[bytes], rate: float, seconds: float,
         subscriber: type[OurSubscriber | ReferenceSubscriber] = OurSubscriber) -> dict[str, float]:
    """One offered rate through a publisher process to a subscriber; what it sent, received and counted lost."""
    here, there = mp.get_context("fork").Pipe()
    proc = mp.get_context("fork").Process(target=publisher, args=(there, payloads, rate, seconds))
    proc.start()
    sub = subscriber(here.recv(), rcvhwm=1000)
    sent, duration = here.recv()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and sub.expected != sent:
        time.sleep(0.01)
    proc.join()
    received, missed, dropped = sub.counts()
    sub.close()
    return {"sent": sent, "received": received, "missed": missed, "dropped": dropped,
            "rate": (sent - 1) * EVENTS_PER_BATCH / duration}


def bench_zmq() -> None:
    payloads = make_payloads(1024, seed=2)
    print("(b) loopback tcp, publisher process -> subscriber (SNDHWM = RCVHWM = 1000), 2.5 s per step; each rate "
          "to kvscope's collector\n    and to perf-baselines §3d's reference subscriber (full-schema decode, "
          "no residency) in turn")
    print("    offered ev/s   | kvscope: sent   received   missed (seq)   sent-received==missed | reference: "
          "received/sent  missed")
    lossless = {"kvscope": 0.0, "reference": 0.0}
    ok = True
    for rate in (50e3, 100e3, 200e3, 300e3, 400e3, 500e3, 700e3, 1e6, 0):
        r = step(payloads, rate, 2.5)
        ref = step(payloads, rate, 2.5, ReferenceSubscriber)
        lost = r["sent"] - r["received"]
        match = lost == r["missed"] == r["dropped"]
        ok &= match
        for name, res in (("kvscope", r), ("reference", ref)):
            if res["sent"] == res["received"] and rate > lossless[name]:
                lossless[name] = rate
        label = f"{rate / 1e3:.0f} k" if rate else f"unpaced {r['rate'] / 1e3:.0f} k"
        print(f"    {label:>13}   | {r['sent']:>13.0f}   {r['received']:>8.0f}   {r['missed']:>12.0f}   "
              f"{'yes' if match else 'NO':>21} | {ref['received']:>15.0f}/{ref['sent']:<7.0f} {ref['missed']:>6.0f}")
    print(f"    highest lossless offered rate: kvscope {lossless['kvscope'] / 1e3:.0f} k events/s, reference "
          f"subscriber {lossless['reference'] / 1e3:.0f} k in this run (perf-baselines §3d: ~450 k on its machine)")
    print(f"    every lost batch detected from sequence numbers: {'yes' if ok else 'NO'}")


def main() -> int:
    logging.getLogger("kvscope").setLevel(logging.ERROR)  # the loss steps log gaps on purpose
    t0 = time.perf_counter()
    ctx: zmq.Context[Any] = zmq.Context()
    cpus = os.sched_getaffinity(0)
    bench_decode(ctx)
    os.sched_setaffinity(0, cpus)  # part (b) runs a publisher process beside the subscriber
    ctx.term()
    bench_zmq()
    print(f"total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
