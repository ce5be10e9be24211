"""Fuzzing every parser and decoder of kvscope's inputs: `make fuzz` (python -m tests.fuzz).

Each target is one pure function of what a source sends (a KV-event payload, a ZMQ message, a /metrics
page, a kernel file, mmpmon or lctl output, an OTLP body, readings for the store) with its contract: the
exceptions it may raise (its documented error type; most may raise none) and the invariants its result
must keep. The runner feeds each target mutations of real inputs (the fixtures the tests use, in the
real formats) and of values that broke parsers before (deep nesting, 400- and 5,000-digit numbers,
negative counters, NaN, huge msgpack lengths), and counts any other exception or broken invariant as
a crash. The property tests (tests/test_fuzz.py) run the same targets with hypothesis in `make test`.

    python -m tests.fuzz                      # >= 100,000 inputs per target, both cores
    python -m tests.fuzz --inputs 1000 --only kv_batch_decode --seed 7
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import math
import multiprocessing
import random
import struct
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kvscope.agent.catalogue import Catalogue, counter, histogram
from kvscope.agent.readings import HistogramSample, Sample
from kvscope.agent.store import Store
from kvscope.collectors import aiperf, disk, gpfs, lustre, network, nfs, otlp_traces, rdma, shared_fs
from kvscope.collectors.exposition_scan import ExpositionScanner, parse_labels
from kvscope.collectors.kv_event_schema import BatchDecoder, MalformedBatch
from kvscope.collectors.vllm_kv_events import VllmKvEventsCollector, VllmKvEventsOptions
from kvscope.collectors.vllm_map import Normaliser, wanted_samples

FIX = Path(__file__).parent / "fixtures"
U64 = 1 << 64


@dataclass
class Target:
    name: str
    run: Callable[[bytes], None]  # raises only `allowed`; an AssertionError is a broken invariant
    seeds: list[bytes]
    tokens: list[bytes]  # values worth splicing in
    allowed: tuple[type[BaseException], ...] = ()


# -- mutations ----------------------------------------------------------------------------------------

TEXT_TOKENS = [b"9" * 400, b"7" * 5000, b"-1", b"-0", b"+5", b"NaN", b"nan", b"+Inf", b"-Inf", b"1e309", b"1e-400",
               b"0x10", b"1_000", "\u0663\u0663".encode(), b"18446744073709551616", b"18446744073709551615",
               b"\x00", b"\xff\xfe", b"\t", b" ", b"\r\n", b"\n", b"\n\n", b"{", b"}", b'"', b"\\", b"\\n", b"=",
               b",", b":", b"#", b"_", b"1.5", b"0", b"e", b"\xe2\x80\xa8"]
MSGPACK_TOKENS = [b"\x91" * 1000, b"\x81\xa1a" * 500, b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff",
                  b"\xdb\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff", b"\xcf" + b"\xff" * 8,
                  b"\xd3" + b"\x80" + b"\0" * 7,
                  b"\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00", b"\xcb\x7f\xf0\x00\x00\x00\x00\x00\x00", b"\xc1", b"\xc0",
                  b"\xc2", b"\xc3", b"\x90", b"\x80", b"\xa0", b"\xa4type", b"\xabBlockStored", b"\xacBlockRemoved",
                  b"\xb0AllBlocksCleared", b"\xacblock_hashes", b"\xa6medium", b"\xa3GPU", b"\xa7STORAGE",
                  b"\xa8locality", b"\xa6REMOTE", b"\xaablock_size", b"\xa2ts", b"\xa6events", b"\xd4\x01\x00",
                  b"\xc7\x00\x05", b"\xd9\x05hello", b"\xc4\x03abc"]


def mutate(rng: random.Random, data: bytes, seeds: list[bytes], tokens: list[bytes]) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 3, 5))):
        n = len(buf)
        op = rng.randrange(10)
        i = rng.randrange(n + 1)
        if op == 0 and n:
            buf[min(i, n - 1)] ^= 1 << rng.randrange(8)
        elif op == 1 and n:
            buf[min(i, n - 1)] = rng.randrange(256)
        elif op == 2:
            buf[i:i] = rng.randbytes(rng.randint(1, 8))
        elif op == 3 and n:
            j = min(n, i + rng.randint(1, 64))
            del buf[i:j]
        elif op == 4 and n:
            j = min(n, i + rng.randint(1, 64))
            buf[i:i] = buf[i:j] * rng.randint(1, 16)
        elif op in (5, 6):
            buf[i:i] = rng.choice(tokens)
        elif op == 7 and n:  # overwrite a run of digits (a number) with a token
            start = i
            while start < n and not chr(buf[start]).isdigit():
                start += 1
            end = start
            while end < n and chr(buf[end]).isdigit():
                end += 1
            buf[start:end] = rng.choice(tokens)
        elif op == 8:
            other = rng.choice(seeds)
            buf = buf[:i] + other[rng.randrange(len(other) + 1):]
        elif op == 9:
            buf = buf[:i]
    return bytes(buf)


def inputs(target: Target, rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.03:
        return rng.randbytes(rng.randint(0, 256))
    seed = rng.choice(target.seeds)
    return seed if roll < 0.05 else mutate(rng, seed, target.seeds, target.tokens)


# -- targets --------------------------------------------------------------------------------------------


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _lines(path: Path, size: int = 40) -> list[bytes]:
    """A page cut into chunks of `size` lines: small seeds keep each input fast."""
    lines = path.read_bytes().splitlines(keepends=True)
    return [b"".join(lines[i:i + size]) for i in range(0, len(lines), size)]


def kv_batch_decode() -> Target:
    decoder = BatchDecoder()

    def run(data: bytes) -> None:
        batch = decoder.decode(data)
        assert isinstance(batch.ts, float) and isinstance(batch.events, list)
        assert batch.unknown_events >= 0 and batch.wire_format in ("map", "array")

    seeds = [bytes.fromhex(p.read_text().strip()) for p in sorted((FIX / "kv_events").glob("*.hex"))]
    return Target("kv_batch_decode", run, seeds, MSGPACK_TOKENS, (MalformedBatch,))


class KvSubscriber:
    """The subscriber's whole per-message path (`handle`: frames, decode, sequence rules, residency) with
    its invariants: nothing escapes, nothing is swallowed as an internal error, counters hold together."""

    def __init__(self) -> None:
        self.collector = self._new()
        self.count = 0

    @staticmethod
    def _new() -> VllmKvEventsCollector:
        return VllmKvEventsCollector(VllmKvEventsOptions(endpoint="tcp://127.0.0.1:1", model="fuzz",
                                                         reuse_max_tracked_blocks=64))

    def __call__(self, data: bytes) -> None:
        self.count += 1
        if self.count % 2000 == 0:  # keep each collector's state small
            self.collector.close()
            self.collector = self._new()
        stream = self.collector.streams[0]
        expected = stream.expected or 0
        selector, payload = (data[0], data[1:]) if data else (0, b"")
        seq = {0: expected - 1, 1: expected, 2: expected, 3: expected + 1, 4: expected + 3, 5: 0,
               6: expected + 50_000, 7: int.from_bytes((payload[:8] or b"\0").ljust(8, b"\0"), "big")}[selector % 8]
        frames = [b"", (seq % U64).to_bytes(8, "big"), payload]
        if selector >= 248:
            frames = frames[: selector % 4] + [payload] * (selector % 3)
        self.collector.handle(stream, frames)
        assert "internal" not in stream.logged, "an input raised inside the subscriber (counted as malformed)"
        for n in (stream.dropped, stream.missed, stream.malformed, stream.restarts, stream.repeated,
                  stream.rejected):
            assert n >= 0
        assert stream.dropped == stream.missed and stream.replayed == 0  # no replay endpoint here
        assert stream.expected is None or 0 <= stream.expected <= 2**63
        for state in stream.residency.tiers.values():
            assert state.stored - state.removed == len(state.resident)
        readings = self.collector.collect()
        assert all(math.isfinite(r.value) and r.value >= 0 for r in readings if isinstance(r, Sample))


def kv_subscriber_handle() -> Target:
    seeds = [b"\x01" + bytes.fromhex(p.read_text().strip()) for p in sorted((FIX / "kv_events").glob("*.hex"))]
    return Target("kv_subscriber_handle", KvSubscriber(), seeds, MSGPACK_TOKENS)


class KvReplay:
    """The sequence rules with a replay endpoint that answers anything: the seqs of its replies (in any
    order, repeated, far out of range) and their payloads come from the input. Whatever it sends, the
    loss counters hold together: dropped = replayed + missed."""

    def __init__(self) -> None:
        self.decoder = BatchDecoder()
        self.count = 0
        self.replies: list[tuple[int, bytes]] = []
        self.collector = self._new()

    def _new(self) -> VllmKvEventsCollector:
        collector = VllmKvEventsCollector(VllmKvEventsOptions(
            endpoint="tcp://127.0.0.1:1", replay_endpoint="tcp://127.0.0.1:2", model="fuzz",
            reuse_max_tracked_blocks=64))
        collector.receiver.replay = self._replay  # type: ignore[method-assign]  # the ROUTER's answers
        return collector

    def _replay(self, stream: object, start: int, stop: int | None, malformed: object) -> Iterator[tuple[int, bytes]]:
        yield from self.replies

    def __call__(self, data: bytes) -> None:
        self.count += 1
        if self.count % 2000 == 0:
            self.collector.close()
            self.collector = self._new()
        stream = self.collector.streams[0]
        expected = stream.expected or 0
        head, payload = data[:12].ljust(12, b"\0"), data[12:]
        live_seq = expected + head[0] % 6 - 1 if head[0] < 200 else int.from_bytes(head[:8], "big")
        self.replies = [((expected + b - 2) % U64 if b < 240 else int.from_bytes(head[4:12], "big"), payload)
                        for b in head[1:1 + head[11] % 8]]
        self.collector.handle(stream, [b"", (live_seq % U64).to_bytes(8, "big"), payload])
        if head[2] % 4 == 0:
            self.collector._check_tail(stream)
        assert "internal" not in stream.logged, "an input raised inside the subscriber (counted as malformed)"
        assert stream.dropped == stream.replayed + stream.missed, (stream.dropped, stream.replayed, stream.missed)
        assert min(stream.dropped, stream.replayed, stream.missed, stream.rejected, stream.repeated) >= 0
        assert stream.expected is None or 0 <= stream.expected <= 2**63
        for state in stream.residency.tiers.values():
            assert state.stored - state.removed == len(state.resident)


def kv_replay() -> Target:
    seeds = [b"\x01\x01\x04\x00" + bytes(7) + b"\x03" + bytes.fromhex(p.read_text().strip())
             for p in sorted((FIX / "kv_events").glob("*.hex"))]
    return Target("kv_replay", KvReplay(), seeds, MSGPACK_TOKENS)


def vllm_exposition() -> Target:
    scanner = ExpositionScanner(("vllm:",), wanted_samples())
    everything = ExpositionScanner(("vllm:", "http_", "process_"))
    normaliser = Normaliser("vllm", {}, {})

    def run(data: bytes) -> None:
        text = _text(data)
        for complete in (False, True):
            page = scanner.scan(text, complete)
            assert page.malformed >= 0
            for reading in normaliser.normalise(page).readings:
                if isinstance(reading, HistogramSample):
                    edges = [b for b, _ in reading.buckets]
                    counts = [n for _, n in reading.buckets]
                    assert edges[-1] == math.inf and edges == sorted(set(edges)) and counts == sorted(counts)
                    assert math.isfinite(reading.sum) and reading.count == counts[-1]
                elif reading.name.endswith("_total"):
                    assert not math.isnan(reading.value)
        everything.scan(text)

    seeds = [s for p in sorted((FIX / "vllm").glob("*.prom")) for s in _lines(p)]
    return Target("vllm_exposition", run, seeds, TEXT_TOKENS)


def exposition_labels() -> Target:
    def run(data: bytes) -> None:
        labels = parse_labels(_text(data))
        assert labels is None or all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())

    seeds = [b'engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"', b'le="+Inf",a="x\\"y\\\\z\\n"',
             b'source="local_compute",', b' a = "1" , b="2"']
    return Target("exposition_labels", run, seeds, TEXT_TOKENS)


def _counters_ok(values: object) -> None:
    for v in values:  # type: ignore[attr-defined]
        assert isinstance(v, int) and 0 <= v < U64


def diskstats() -> Target:
    def run(data: bytes) -> None:
        stats, bad = disk.parse_diskstats(_text(data))
        assert bad >= 0
        for c in stats.values():
            _counters_ok(c)

    seeds = [p.read_bytes() for p in sorted((FIX / "host").glob("*/proc/diskstats"))]
    return Target("diskstats", run, seeds, TEXT_TOKENS)


def net_dev() -> Target:
    def run(data: bytes) -> None:
        stats, bad = network.parse_net_dev(_text(data))
        assert bad >= 0
        for c in stats.values():
            _counters_ok(c)

    seeds = [p.read_bytes() for p in sorted((FIX / "host").glob("*/proc/net/dev"))]
    return Target("net_dev", run, seeds, TEXT_TOKENS)


def rdma_port() -> Target:
    files = [f for f, _, _ in (*rdma.DATA_COUNTERS, *rdma.PACKET_COUNTERS)]

    def run(data: bytes) -> None:
        parts = _text(data).split("|")
        counters = dict(zip(files, parts[1:], strict=False))
        out = rdma.port_readings("mlx5_0", "1", parts[0], counters)
        for r in out.readings:
            assert isinstance(r, Sample) and math.isfinite(r.value) and r.value >= 0

    seeds = [b"InfiniBand\n|4215|5000|10|12", b"Ethernet|4294967295|0|1|1", b"|18446744073709551615|1|2|3"]
    return Target("rdma_port", run, seeds, TEXT_TOKENS)


def mountstats() -> Target:
    def run(data: bytes) -> None:
        for mount in nfs.parse_mountstats(_text(data)).mounts:
            _counters_ok(mount.bytes)

    seeds = [(FIX / "sharedfs/node/proc/self/mountstats").read_bytes()]
    return Target("mountstats", run, seeds, TEXT_TOKENS)


def llite_stats() -> Target:
    def run(data: bytes) -> None:
        text = _text(data)
        for part in [text, *lustre.split_lctl_output(text).values()]:
            stats = lustre.parse_llite_stats(part)
            _counters_ok(v for v in (stats.read_bytes, stats.write_bytes) if v is not None)

    seeds = [p.read_bytes() for p in sorted((FIX / "sharedfs").rglob("stats"))]
    seeds.append((FIX / "sharedfs/lustre/lctl_get_param_llite_stats.txt").read_bytes())
    return Target("llite_stats", run, seeds, TEXT_TOKENS)


def mmpmon_fs_io_s() -> Target:
    def run(data: bytes) -> None:
        for fs in gpfs.parse_fs_io_s(_text(data)).filesystems:
            _counters_ok((fs.bytes_read, fs.bytes_written))

    seeds = [p.read_bytes() for p in sorted((FIX / "sharedfs/gpfs").glob("*.txt"))]
    return Target("mmpmon_fs_io_s", run, seeds, TEXT_TOKENS)


def mountinfo() -> Target:
    def run(data: bytes) -> None:
        for entry in shared_fs.parse_mountinfo(_text(data)):
            assert isinstance(entry.mount_point, str)

    seeds = [(FIX / "sharedfs/node/proc/self/mountinfo").read_bytes()]
    return Target("mountinfo", run, seeds, TEXT_TOKENS)


def _otlp_seeds() -> tuple[bytes, bytes]:
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    binary = (FIX / "correlation/otlp/llm_request.binpb").read_bytes()
    request = ExportTraceServiceRequest()
    request.ParseFromString(binary)
    return binary, json_format.MessageToJson(request).encode()


def otlp_protobuf() -> Target:
    def run(data: bytes) -> None:
        otlp_traces.decode_export(data, otlp_traces.PROTOBUF, otlp_traces.Labels())

    return Target("otlp_protobuf", run, [_otlp_seeds()[0]], MSGPACK_TOKENS, (ValueError,))


def otlp_json() -> Target:
    def run(data: bytes) -> None:
        otlp_traces.decode_export(data, otlp_traces.JSON, otlp_traces.Labels())

    tokens = [*TEXT_TOKENS, b"[" * 2000, b'{"a":' * 2000, b'"startTimeUnixNano":"99999999999999999999999"',
              b'"doubleValue":"NaN"', b'"intValue":"-1"']
    return Target("otlp_json", run, [_otlp_seeds()[1]], tokens, (ValueError,))


def aiperf_exports() -> Target:
    def run(data: bytes) -> None:
        text = _text(data)
        aiperf.parse_profile_export(text)
        aiperf.parse_server_metrics(text)

    seeds = [s for p in sorted((FIX / "aiperf").glob("*.jsonl")) for s in _lines(p, 4)]
    return Target("aiperf_exports", run, seeds, [*TEXT_TOKENS, b"[" * 2000, b'{"a":' * 2000])


class StoreFeed:
    """Readings of impossible and ordinary values into the store: an exported counter never decreases,
    is never negative or NaN; a histogram's exported counts likewise."""

    C, H = "kvscope_fuzz_total", "kvscope_fuzz_seconds"

    def __init__(self) -> None:
        from kvscope.agent.catalogue import AGENT_METRICS

        self.store = Store(Catalogue([counter(self.C, "", ("k",), "fuzz", "fuzz"),
                                      histogram(self.H, "seconds", ("k",), "fuzz", "fuzz"), *AGENT_METRICS]))
        self.last: dict[str, float] = {}

    def __call__(self, data: bytes) -> None:
        values = list(struct.unpack(f"<{len(data) // 8}d", data[: len(data) // 8 * 8]))
        for i in range(0, len(values) - 3, 4):
            a, b, s, modulus = values[i : i + 4]
            readings = [
                Sample(self.C, ("a",), a),
                Sample(self.C, ("w",), b, 2.0**32 if modulus > 0 else None),
                HistogramSample(self.H, ("h",), ((0.5, min(a, b)), (math.inf, max(a, b))), s, max(a, b)),
            ]
            self.store.ingest("fuzz", readings, now=0.0)
            for key in (("a",), ("w",)):
                total = self.store.value(self.C, key)
                if total is None:  # forgotten after stale_after collections without it: starts afresh
                    self.last.pop(key[0], None)
                    continue
                assert 0 <= total < math.inf and total >= self.last.get(key[0], 0.0)
                self.last[key[0]] = total
            if self.store.value(self.H, ("h",)) is None:
                self.last.pop("h", None)
                continue
            _, counts, hsum, count = self.store.histogram(self.H, ("h",))
            assert all(0 <= n < math.inf for n in counts) and 0 <= count < math.inf and math.isfinite(hsum)
            assert count >= self.last.get("h", 0.0)
            self.last["h"] = count


def store_ingest() -> Target:
    def pack(*values: float) -> bytes:
        return struct.pack(f"<{len(values)}d", *values)

    seeds = [pack(100, 5, 0.5, 1, 250, 7, 1.5, -1, 30, 2**32 - 1, 2.5, 1, -50, 3, 3.0, 0, 10, 4, 4.0, 1),
             pack(-1e20, math.nan, math.inf, 1, 1e300, -0.0, 5e-324, -1)]
    tokens = [pack(v) for v in (-1.0, math.nan, math.inf, -math.inf, 2.0**32, 2.0**64, 1e308, -0.0, 0.0)]
    return Target("store_ingest", StoreFeed(), seeds, tokens)


TARGETS: dict[str, Callable[[], Target]] = {f.__name__: f for f in (
    kv_batch_decode, kv_subscriber_handle, kv_replay, vllm_exposition, exposition_labels, diskstats, net_dev, rdma_port,
    mountstats, llite_stats, mmpmon_fs_io_s, mountinfo, otlp_protobuf, otlp_json, aiperf_exports, store_ingest)}


# -- the runner -----------------------------------------------------------------------------------------


@dataclass
class Report:
    name: str
    inputs: int
    crashes: int
    unique: dict[str, str]  # crash signature -> a traceback
    seconds: float


def check(target: Target, data: bytes) -> str | None:
    """None, or the signature of a crash (exception type and the line that raised it) on `data`."""
    try:
        target.run(data)
    except target.allowed:
        return None
    except Exception as exc:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        return f"{type(exc).__name__} at {Path(frame.filename).name}:{frame.lineno}: {str(exc)[:100]}"
    return None


def fuzz(name: str, count: int, seed: int, crash_dir: Path | None, seconds: float | None) -> Report:
    target = TARGETS[name]()
    rng = random.Random(f"{seed}:{name}")
    crashes, unique = 0, {}
    start = time.monotonic()
    done = 0
    while done < count and (seconds is None or time.monotonic() - start < seconds):
        data = inputs(target, rng)
        done += 1
        signature = check(target, data)
        if signature is None:
            continue
        crashes += 1
        if signature not in unique:
            unique[signature] = signature
            if crash_dir is not None:
                crash_dir.mkdir(parents=True, exist_ok=True)
                digest = hashlib.sha256(data).hexdigest()[:16]
                (crash_dir / f"{name}-{digest}.bin").write_bytes(data)
    return Report(name, done, crashes, unique, time.monotonic() - start)


def _fuzz_args(args: tuple[str, int, int, Path | None, float | None]) -> Report:
    return fuzz(*args)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=int, default=100_000, help="inputs per target (default 100,000)")
    ap.add_argument("--seconds", type=float, default=None, help="stop each target after this long")
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--only", action="append", choices=sorted(TARGETS), help="run only these targets")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--crashes", type=Path, default=Path("fuzz-crashes"), help="where crashing inputs go")
    args = ap.parse_args(argv)
    logging.disable(logging.CRITICAL)  # the targets log what they skip (once each): not news here
    names = args.only or list(TARGETS)
    print(f"fuzzing {len(names)} targets, {args.inputs:,} inputs each, seed {args.seed}, {args.jobs} processes")
    work = [(n, args.inputs, args.seed, args.crashes, args.seconds) for n in names]
    start = time.monotonic()
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        reports = pool.map(_fuzz_args, work, chunksize=1)
    print(f"{'target':<22} {'inputs':>9} {'crashes':>8} {'unique':>7} {'seconds':>8}")
    for r in reports:
        print(f"{r.name:<22} {r.inputs:>9,} {r.crashes:>8} {len(r.unique):>7} {r.seconds:>8.1f}")
        for signature in r.unique:
            print(f"    {signature}")
    total = sum(r.crashes for r in reports)
    print(f"{sum(r.inputs for r in reports):,} inputs in {time.monotonic() - start:.0f} s, {total} crash(es)"
          + (f"; inputs in {args.crashes}/" if total else ""))
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

