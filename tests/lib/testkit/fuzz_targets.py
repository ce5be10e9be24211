"""The fuzz targets: every parser and decoder of kvscope's inputs, each with its contract, real seeds and
a mutator (run by tests/lib/testkit/fuzz.py for `make fuzz`, and by tests/test_fuzz.py with hypothesis).

Each target is one pure function of what a source sends (a KV-event payload, a ZMQ message, a /metrics
page, a kernel file, mmpmon or lctl output, an OTLP body, readings for the store) with its contract: the
exceptions it may raise (its documented error type; most may raise none) and the invariants its result
must keep. Inputs are mutations of real inputs (the fixtures the tests use, in the real formats) and of
values that broke parsers before (deep nesting, 400- and 5,000-digit numbers, negative counters, NaN,
huge msgpack lengths); any other exception or broken invariant is a crash.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

from kvscope.agent.core.catalogue import Catalogue, counter, histogram
from kvscope.agent.core.readings import HistogramSample, Reading, Sample
from kvscope.agent.core.store import Store
from kvscope.collectors.engines.vllm_map import Normaliser, wanted_samples
from kvscope.collectors.host import disk, network, rdma
from kvscope.collectors.kv_events.collector import VllmKvEventsCollector, VllmKvEventsOptions
from kvscope.collectors.kv_events.schema import BatchDecoder, MalformedBatch
from kvscope.collectors.requests import aiperf, otlp_traces
from kvscope.collectors.scrape.exposition import ExpositionScanner, parse_labels
from kvscope.collectors.scrape.fetch import Page
from kvscope.collectors.sharedfs import common as shared_fs
from kvscope.collectors.sharedfs import gpfs, lustre, nfs
from testkit.fuzz_mutations import MSGPACK_TOKENS, TEXT_TOKENS, Target
from testkit.paths import FIXTURES

FIX = FIXTURES
U64 = 1 << 64


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


class EnginePages:
    """The other engine adapters' whole page path (scan, the adapter's normaliser, the scraper's checks)
    on the page the input gives: SGLang, LMCache, the Dynamo frontend and KVBM, by the first byte."""

    def __init__(self) -> None:
        from kvscope.collectors.engines.dynamo_frontend import DynamoCollector, DynamoOptions
        from kvscope.collectors.engines.dynamo_kvbm import KvbmCollector, KvbmOptions
        from kvscope.collectors.engines.lmcache import LmcacheCollector, LmcacheOptions
        from kvscope.collectors.engines.sglang import SglangCollector, SglangOptions

        url = ["http://t/metrics"]
        proc = str(FIX / "sharedfs/node/proc")
        kvbm = KvbmCollector(KvbmOptions(urls=url, block_tokens=16, kv_bytes_per_token=2), proc, environ={})
        kvbm._place()  # what collect() does before every scrape
        self.scrapers = [SglangCollector(SglangOptions(urls=url), proc)._scraper,
                         LmcacheCollector(LmcacheOptions(urls=url), proc)._scraper,
                         DynamoCollector(DynamoOptions(urls=url))._scraper, kvbm._scraper]

    def __call__(self, data: bytes) -> None:
        selector, body = (data[0], data[1:]) if data else (0, b"")
        scraper = self.scrapers[selector % 4]
        readings: list[Reading] = []
        scraper._scrape(scraper._targets[0], Page(body, framed=bool(selector & 4)), readings, set())
        for reading in readings:
            if isinstance(reading, HistogramSample):
                counts = [n for _, n in reading.buckets]
                assert reading.buckets[-1][0] == math.inf and counts == sorted(counts)
            else:
                assert not (reading.name.endswith("_total") and math.isnan(reading.value))


def engine_pages() -> Target:
    seeds = [bytes([i]) + chunk for i, engine in enumerate(("sglang", "lmcache", "dynamo", "dynamo"))
             for p in sorted((FIX / engine).glob("*.prom")) if (engine != "dynamo") or ("kvbm" in p.name) == (i == 3)
             for chunk in _lines(p)]
    return Target("engine_pages", EnginePages(), seeds, TEXT_TOKENS)


def exposition_labels() -> Target:
    scanner = ExpositionScanner(("vllm:",), cache_size=64)

    def run(data: bytes) -> None:
        labels = parse_labels(_text(data))
        assert labels is None or all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
        # the scanner's shortcuts (a bucket from its series, a text from the last one read) read
        # every text, one after another, exactly as a parse of it alone would, key order included
        for body in _text(data).split("\n"):
            read = scanner._labels.get(body) or scanner._labels_of(body)
            expected = parse_labels(body)
            assert (read if isinstance(read, dict) else None) == expected
            assert expected is None or list(read) == list(expected)  # type: ignore[call-overload]

    seeds = [b'engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"', b'le="+Inf",a="x\\"y\\\\z\\n"',
             b'source="local_compute",', b' a = "1" , b="2"',
             b'engine="0",le="1.0",model_name="m"\nengine="0",le="2.5",model_name="m"\nengine="0",le="+Inf",model_name="m"',
             b'a="1",source="x"\na="1",source="y"\na="1",source="z",\na="2",source="y"']
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


def sglang_request_lines() -> Target:
    from kvscope.collectors.engines.sglang_backends import backend_tiers
    from kvscope.collectors.requests.sglang_request_log import BadLine, LineLabels, parse_line

    tiers, labels = backend_tiers({}, "G3"), LineLabels()

    def run(data: bytes) -> None:
        record = parse_line(data, labels, tiers)  # a record or BadLine, nothing else
        assert record.ttft >= 0 and record.prompt_tokens is not None and record.cached_tokens is not None
        assert sum(f.tokens for f in record.fetches) + (record.g1_tokens or 0) <= record.prompt_tokens

    seeds = _lines(FIX / "sglang/request_log/sglang-request-metrics-20261205_20.log", 1)
    tokens = [*TEXT_TOKENS, b'"storage": 99999999', b'"device": -1', b'"dp_rank": true', b"1e999", b"NaN"]
    return Target("sglang_request_lines", run, seeds, tokens, (BadLine,))


class StoreFeed:
    """Readings of impossible and ordinary values into the store: an exported counter never decreases,
    is never negative or NaN; a histogram's exported counts likewise."""

    C, H = "kvscope_fuzz_total", "kvscope_fuzz_seconds"

    def __init__(self) -> None:
        from kvscope.agent.core.catalogue import AGENT_METRICS

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
    kv_batch_decode, kv_subscriber_handle, kv_replay, vllm_exposition, engine_pages, exposition_labels, diskstats,
    net_dev, rdma_port, mountstats, llite_stats, mmpmon_fs_io_s, mountinfo, otlp_protobuf, otlp_json, aiperf_exports,
    sglang_request_lines, store_ingest)}
