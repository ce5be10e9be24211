"""The reference engine end to end: real HTTP (streamed chat), /metrics in vLLM's dialect, KV events over
ZMQ to a plain SUB, the llm_request span, and ground truth whose components add up to TTFT."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families

from kvscope.agent.core.tiers import Tier
from kvscope.agent.tools.reference.blocks import BlockId
from kvscope.agent.tools.reference.engine import Engine, EngineConfig
from kvscope.agent.tools.reference.geometry import KVGeometry
from kvscope.agent.tools.reference.kv_publisher import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from kvscope.agent.tools.reference.openai_server import ReferenceServer
from kvscope.agent.tools.reference.tierstore import BlockEvent
from kvscope.agent.tools.reference.tracing import RequestTracer
from kvscope.agent.tools.reference.truth import read_truth
from testkit.paths import FIXTURES

REFERENCE = FIXTURES / "reference"
TINY = KVGeometry("tiny", 4, 2, 64)  # 2 KiB per token: 32 KiB blocks of 16 tokens
TEXT = " ".join(f"word{i}" for i in range(300))  # 300 pieces + the chat template's


class Running:
    def __init__(self, tmp: Path, **overrides: object) -> None:
        self.exporter = InMemorySpanExporter()
        cfg = EngineConfig.seeds_g4(tmp, geometry=TINY, block_tokens=16, g1_blocks=64, time_scale=0.05,
                                    default_max_tokens=4, truth_path=tmp / "truth.jsonl",
                                    **{"write_behind_blocks": 0, **overrides})
        self.engine = Engine(cfg, tracer=RequestTracer("", exporter=self.exporter))
        self.server = ReferenceServer(self.engine)
        self.engine.start()
        self.server.start()

    def conn(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)

    def stop(self) -> None:
        self.server.stop()
        self.engine.stop()


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    r = Running(tmp_path)
    yield r
    r.stop()


def chat(conn: http.client.HTTPConnection, text: str, headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    body = {"model": "openai/gpt-oss-120b", "messages": [{"role": "user", "content": text}], "stream": True,
            "max_tokens": 4, "stream_options": {"include_usage": True}}
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json",
                                                                    **(headers or {})})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
    events = [line[6:] for line in resp.read().decode().split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def k(**labels: str) -> tuple[tuple[str, str], ...]:
    """A sample's label key: the base labels plus these, sorted."""
    return tuple(sorted({"engine": "0", "model_name": "openai/gpt-oss-120b", **labels}.items()))


def metrics(r: Running) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    c = r.conn()
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_streamed_chat_then_a_cached_repeat(running: Running) -> None:
    conn = running.conn()  # one keep-alive connection for both: the chunked stream must end cleanly
    first = chat(conn, TEXT)
    assert first[0]["choices"][0]["delta"]["role"] == "assistant"
    assert first[0]["object"] == "chat.completion.chunk"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in first if c["choices"]) == \
        "the cache holds blocks"
    assert first[-2]["choices"][0]["finish_reason"] == "length"
    usage = first[-1]["usage"]
    assert usage["completion_tokens"] == 4 and usage["prompt_tokens_details"]["cached_tokens"] == 0
    prompt = usage["prompt_tokens"]
    second = chat(conn, TEXT)
    # every full block but the one holding the last token comes back from G4
    assert second[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == (prompt - 1) // 16 * 16


def test_metrics_page_speaks_vllm(running: Running) -> None:
    conn = running.conn()
    chat(conn, TEXT)
    chat(conn, TEXT)
    m = metrics(running)
    base = k()
    prompt = running.engine.truth.records[0].prompt_tokens
    hit = (prompt - 1) // 16 * 16
    assert m["vllm:prompt_tokens_total"][base] == 2 * prompt
    assert m["vllm:prefix_cache_queries_total"][base] == 2 * prompt
    assert m["vllm:prefix_cache_hits_total"][base] == 0  # G1 keeps nothing in the seeds' configuration
    assert m["vllm:external_prefix_cache_hits_total"][base] == hit
    assert m["vllm:prompt_tokens_cached_by_source_total"][k(source="external_unspecified")] == hit
    assert m["vllm:prompt_tokens_by_source_total"][k(source="local_compute")] == 2 * prompt - hit
    tier4 = k(tier="2:fs")
    truth = running.engine.truth.records[1]
    assert m["vllm:kv_offload_tiering_read_bytes_total"][tier4] == truth.fetch_bytes["G4"]
    assert m["vllm:kv_offload_tiering_write_bytes_total"][tier4] > 0
    assert m["vllm:kv_offload_load_bytes_total"][base] == hit * 2048
    assert m["vllm:time_to_first_token_seconds_count"][base] == 2
    assert k(le="0.001") in m["vllm:time_to_first_token_seconds_bucket"]
    assert k(le="0.3") in m["vllm:request_queue_time_seconds_bucket"]
    assert m["vllm:num_requests_running"][base] == 0
    info = next(iter(m["vllm:cache_config_info"]))
    assert dict(info)["block_size"] == "16" and dict(info)["num_gpu_blocks"] == "64"
    assert m["kvscope_reference_device_busy_seconds_total"][base] > 0


def test_kv_events_reach_a_plain_sub_and_replay(running: Running) -> None:
    pub = running.engine.publisher
    assert pub is not None and pub.replay_endpoint is not None
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 10_000)
    sub.connect(pub.endpoint)
    time.sleep(0.3)  # ZMQ's slow joiner: let the subscription reach the PUB first
    chat(running.conn(), TEXT)
    decoder = msgspec.msgpack.Decoder(KVEventBatch)
    frames = sub.recv_multipart()
    assert len(frames) == 3 and frames[0] == b""
    seqs, events = [], []
    while True:
        seqs.append(int.from_bytes(frames[1], "big"))
        batch = decoder.decode(frames[2])
        assert batch.data_parallel_rank == 0 and abs(batch.ts - time.time()) < 60
        events.extend(batch.events)
        # the blocks go down to G4 at the end of prefill (G1 keeps nothing), leave G1 at release
        if (sum(isinstance(e, BlockStored) and e.medium == "STORAGE" for e in events) == 19
                and any(isinstance(e, BlockRemoved) and e.medium == "GPU" for e in events)):
            break
        frames = sub.recv_multipart()
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    g4 = [e for e in events if isinstance(e, BlockStored) and e.medium == "STORAGE"]
    assert all(e.locality == "REMOTE" and e.block_size == 16 and len(e.token_ids) == 16 for e in g4)
    assert g4[0].parent_block_hash is None and g4[1].parent_block_hash == g4[0].block_hashes[0]
    gpu = [e for e in events if isinstance(e, BlockStored) and e.medium == "GPU"]
    assert gpu and all(e.locality is None for e in gpu)
    assert any(isinstance(e, BlockRemoved) and e.medium == "GPU" for e in events)  # G1 keeps nothing

    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVTIMEO, 10_000)
    dealer.connect(pub.replay_endpoint)
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    replayed = []
    while True:
        empty, topic, seq, payload = dealer.recv_multipart()
        assert empty == b"" and topic == b""
        if not payload:
            assert seq == b"\xff" * 8
            break
        replayed.append(int.from_bytes(seq, "big"))
    assert replayed[:len(seqs)] == seqs
    sub.close()
    dealer.close()
    ctx.term()


def test_publisher_encodes_vllm_033_bytes() -> None:
    batch = KVEventBatch(1.5, [BlockStored([7], None, [1, 2], 2, None, "GPU", None, group_idx=0),
                               BlockRemoved([7], "GPU", group_idx=0), AllBlocksCleared()], 0)
    want = (REFERENCE / "kv_events_vllm033.hex").read_text().strip()
    assert msgspec.msgpack.encode(batch).hex() == want


def test_truth_components_add_up(running: Running, tmp_path: Path) -> None:
    conn = running.conn()
    for _ in range(3):
        chat(conn, TEXT)
    records = read_truth(tmp_path / "truth.jsonl")
    assert len(records) == 3
    for r in records:
        parts = (r["frontend_s"] + r["queue_s"] + sum(r["fetch_s"].values()) + r["offload_s"]
                 + r["prefill_compute_s"] + r["other_s"])
        assert r["ttft_s"] == pytest.approx(parts, abs=1e-9)
        assert r["other_s"] >= 0 and r["frontend_s"] == pytest.approx(r["ttft_s"] - r["queue_s"] - r["prefill_s"])
        # fetch and offload sit inside vLLM's prefill phase; hashing the prompt sits before the queue
        assert r["prefill_s"] >= sum(r["fetch_s"].values()) + r["offload_s"] + r["prefill_compute_s"]
        assert r["arrival_ts"] <= r["queued_ts"] <= r["scheduled_ts"]
        assert r["ttft_s"] >= r["queue_s"] + r["prefill_s"]
        assert r["prefill_compute_s"] >= r["prefill_model_s"] * 0.05 * 0.99
        assert r["recompute_s"] == pytest.approx(running.engine.config.cost.recompute(r["prompt_tokens"]) * 0.05)
        assert len(r["device_busy"]) == 4  # prefill + 3 decode steps
        assert r["arrival_ts"] <= r["scheduled_ts"] <= r["first_token_ts"] <= r["finished_ts"]
    cold, warm = records[0], records[2]
    assert cold["tokens_by_tier"] == {} and cold["computed_tokens"] == cold["prompt_tokens"]
    # G1 keeps nothing: the cold request stores its computed blocks down to G4 before its first token
    assert cold["offload_s"] > 0 and cold["bytes_by_link"]["G2->G4"] > 0
    assert warm["tokens_by_tier"]["G4"] + warm["computed_tokens"] == warm["prompt_tokens"]
    assert warm["fetch_bytes"]["G4"] == warm["bytes_by_link"]["G4->G2"]
    assert warm["bytes_by_link"]["G2->G1"] == warm["tokens_by_tier"]["G4"] * 2048
    assert warm["fetch_s"]["G4"] >= warm["seconds_by_link"]["G4->G2"]


def test_span_like_vllms(running: Running) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    chat(running.conn(), TEXT, {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"})
    (span,) = running.exporter.get_finished_spans()
    truth = running.engine.truth.records[0]
    assert span.name == "llm_request" and span.kind is SpanKind.SERVER
    assert format(span.context.trace_id, "032x") == trace_id
    attrs = dict(span.attributes or {})
    assert attrs["gen_ai.latency.time_to_first_token"] == truth.ttft_s
    assert attrs["gen_ai.latency.time_in_queue"] == truth.queue_s
    assert attrs["gen_ai.usage.prompt_tokens"] == truth.prompt_tokens
    assert attrs["gen_ai.usage.completion_tokens"] == 4
    assert attrs["kvscope.kv.offload_seconds"] == truth.offload_s
    assert span.start_time == int(truth.arrival_ts * 1e9)


def test_other_routes_and_bad_requests(running: Running) -> None:
    c = running.conn()
    c.request("GET", "/health")
    assert c.getresponse().read() == b""
    c.request("GET", "/v1/models")
    assert json.loads(c.getresponse().read())["data"][0]["id"] == "openai/gpt-oss-120b"
    c.request("POST", "/v1/completions", json.dumps({"prompt": TEXT, "max_tokens": 2}))
    resp = json.loads(c.getresponse().read())
    assert resp["choices"][0]["text"] == "the cache" and resp["usage"]["completion_tokens"] == 2
    c.request("POST", "/v1/completions", "{not json")
    r = c.getresponse()
    assert r.status == 400 and "error" in json.loads(r.read())
    c.request("POST", "/v1/completions", json.dumps({"prompt": "x " * 5000}))  # beyond G1's 1024 tokens
    r = c.getresponse()
    assert r.status == 400 and b"G1 capacity" in r.read()


@pytest.mark.parametrize(("path", "body", "why"), [
    ("/v1/chat/completions", {"messages": ["hi"]}, b"each message must be an object"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, b"each message must be an object"),
    ("/v1/completions", {"prompt": TEXT, "max_tokens": 0}, b"max_tokens must be an integer of at least 1"),
    ("/v1/completions", {"prompt": TEXT, "max_tokens": 2.5}, b"max_tokens must be an integer"),
    ("/v1/completions", {"prompt": TEXT, "max_completion_tokens": -3, "max_tokens": 2},
     b"max_completion_tokens must be"),
    ("/v1/completions", {"prompt": TEXT, "temperature": "hot"}, b"temperature must be a number"),
    ("/v1/completions", {"prompt": TEXT, "top_p": 0}, b"top_p must be a number"),
    ("/v1/completions", {"prompt": [1, True, 3]}, b"prompt must be a string or a list of token ids"),
    ("/v1/completions", {"prompt": [1, -2]}, b"token id -2 is out of vocabulary"),
    ("/v1/completions", {"prompt": [200_000]}, b"token id 200000 is out of vocabulary"),
    ("/v1/completions", {"prompt": [[7, 200_001]]}, b"token id 200001 is out of vocabulary"),
])
def test_a_request_vllm_would_refuse_gets_400_and_the_engine_serves_on(running: Running, path: str,
                                                                        body: dict[str, object], why: bytes) -> None:
    c = running.conn()
    c.request("POST", path, json.dumps(body))
    r = c.getresponse()
    assert r.status == 400 and why in r.read()
    c.request("POST", "/v1/completions", json.dumps({"prompt": [7], "max_completion_tokens": 2,  # one token id
                                                    "max_tokens": None, "temperature": 0, "top_p": 1}))
    r = c.getresponse()
    assert r.status == 200 and json.loads(r.read())["usage"]["completion_tokens"] == 2


def test_a_corrupt_g4_block_is_recomputed_and_counted(running: Running, tmp_path: Path) -> None:
    conn = running.conn()
    chat(conn, TEXT)
    victim = sorted((tmp_path / "g4").glob("*.kvb"))[0]
    victim.write_bytes(victim.read_bytes()[:5000])
    chat(conn, TEXT)
    m = metrics(running)
    assert m["kvscope_reference_block_errors_total"][k(kind="truncated", tier="G4")] == 1
    warm = running.engine.truth.records[1]
    assert warm.block_errors == 1
    assert warm.tokens_by_tier.get("G4", 0) + warm.computed_tokens == warm.prompt_tokens


def test_g1_reuses_are_published_only_in_full_report_mode(tmp_path: Path) -> None:
    for full in (False, True):
        engine = Engine(EngineConfig(data_dir=tmp_path / str(full), kv_events_endpoint=None,
                                     kv_cache_report_full=full))
        try:
            engine.block_event(BlockEvent("reused", Tier.G1, BlockId(7, None, ())))
            assert len(engine._events) == (1 if full else 0)
        finally:
            engine.stop()
