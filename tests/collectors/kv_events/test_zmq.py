"""The subscriber end to end: a real ZMQ publisher (and ROUTER replay server) in the test, the real
collector over tcp://127.0.0.1 (ephemeral ports) or inproc, payloads in vLLM's wire formats."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import zmq

from kvscope.agent.app.wiring import build_catalogue
from kvscope.agent.core.readings import HistogramSample
from kvscope.agent.core.store import Store
from kvscope.agent.tools.reference.kv_publisher import BlockRemoved, BlockStored, KVEventBatch
from kvscope.collectors.kv_events.collector import NAME
from testkit.kv_zmq import (
    LAB,
    Publisher,
    ReplayServer,
    Subscribers,
    fixture,
    gpu_batch,
    subscribers,
    tier,
    values,
    wait_for,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def make_sub() -> Iterator[Subscribers]:
    with subscribers() as made:
        yield made


@pytest.fixture
def ctx(make_sub: Subscribers) -> zmq.Context[Any]:
    return make_sub.ctx


# -- tests --------------------------------------------------------------------------------------------


def test_live_stream_both_formats_with_garbage_in_between(ctx: zmq.Context[Any], make_sub: Any) -> None:
    pub = Publisher(ctx)
    sub = make_sub(pub.endpoint)
    pub.wait_subscribed()
    pub.send(0, fixture("vllm-0.33.0_map.hex"))
    pub.socket.send_multipart([b"", b"only two frames"])
    pub.socket.send_multipart([b"", b"\x00\x01", fixture("vllm-0.33.0_map.hex")])  # seq frame of 2 bytes
    pub.socket.send_multipart([b"", (1).to_bytes(8, "big"), b"\xc1\xc1 not msgpack"])
    pub.socket.send_multipart([b"", (1).to_bytes(8, "big"), msgspec.msgpack.encode({"a": [1, 2]})])  # wrong shape
    pub.socket.send_multipart([b"", (1).to_bytes(8, "big"), b"x", b"four frames"])
    pub.send(1, fixture("vllm-0.20.0_array.hex"))
    pub.send(2, fixture("vllm-0.11.0_array.hex"))
    pub.send(3, fixture("vllm-0.33.0_tiers.hex"))
    v = wait_for(sub, "kvscope_kv_events_total", (*LAB, "BlockStored"), 1 + 1 + 2 + 8)
    assert v[("kvscope_kv_events_malformed_total", LAB)] == 5
    assert v[("kvscope_kv_events_total", (*LAB, "BlockRemoved"))] == 1 + 1 + 1 + 2
    assert v[("kvscope_kv_events_total", (*LAB, "AllBlocksCleared"))] == 3
    for name in ("dropped", "missed", "replayed"):
        assert v[(f"kvscope_kv_events_{name}_total", LAB)] == 0
    resident = {t: tier(v, "kvscope_kv_resident_blocks", t) for t in ("G1", "G2", "G3", "G4")}
    assert resident == {"G1": 2, "G2": 3, "G3": 2, "G4": 0}
    assert all(tier(v, "kvscope_kv_residency_known", t) == 1 for t in resident)
    assert tier(v, "kvscope_kv_blocks_removed_unknown_total", "G4") == 1
    # everything the collector emits is catalogued with the right labels
    store = Store(build_catalogue())
    assert store.ingest(NAME, sub.collect(), time.time()).rejected == 0
    hist = [r for r in sub.collect() if isinstance(r, HistogramSample)]
    assert {r.labels[3] for r in hist} == {"G1", "G2", "G3", "G4"}
    pub.close()


def test_gap_recovered_through_replay(ctx: zmq.Context[Any], make_sub: Any) -> None:
    pub = Publisher(ctx)
    replay = ReplayServer(ctx, pub.buffer)
    sub = make_sub(pub.endpoint, replay_endpoint=replay.endpoint)
    pub.wait_subscribed()
    for seq in range(5):
        pub.send(seq, gpu_batch(100 + seq), live=seq not in (2, 3))
    v = wait_for(sub, "kvscope_kv_events_replayed_total", LAB, 2)
    assert replay.requests == [2]
    assert v[("kvscope_kv_events_dropped_total", LAB)] == 2
    assert v[("kvscope_kv_events_missed_total", LAB)] == 0
    assert tier(v, "kvscope_kv_resident_blocks", "G1") == 5
    assert tier(v, "kvscope_kv_residency_known", "G1") == 1
    replay.close()
    pub.close()


def test_unrecoverable_gap_then_all_blocks_cleared(ctx: zmq.Context[Any], make_sub: Any) -> None:
    pub = Publisher(ctx)
    sub = make_sub(pub.endpoint)  # no replay endpoint
    pub.wait_subscribed()
    for seq in range(5):
        pub.send(seq, gpu_batch(100 + seq), live=seq not in (2, 3))
    v = wait_for(sub, "kvscope_kv_events_missed_total", LAB, 2)
    assert v[("kvscope_kv_events_dropped_total", LAB)] == 2
    assert all(tier(v, "kvscope_kv_residency_known", t) == 0 for t in ("G1", "G2", "G3", "G4"))
    assert tier(v, "kvscope_kv_resident_blocks", "G1") == 3  # the estimate: the lost batches' 2 blocks missing
    pub.send(5, gpu_batch(200, 201, clear=True))  # AllBlocksCleared, then two stores
    v = wait_for(sub, "kvscope_kv_residency_known", (*LAB, "G1"), 1)
    assert tier(v, "kvscope_kv_resident_blocks", "G1") == 2
    assert tier(v, "kvscope_kv_residency_known", "G2") == 0
    pub.close()


def stores_and_removals(stored: tuple[int, ...], removed: tuple[int, ...] = ()) -> bytes:
    events: list[Any] = [BlockStored([h], None, [1] * 16, 16, None, "GPU", None) for h in stored]
    events += [BlockRemoved([h], "GPU") for h in removed]
    return msgspec.msgpack.encode(KVEventBatch(time.time(), events, 0))


def test_estimate_after_a_lost_batch_is_off_by_what_it_stored_and_removed(ctx: zmq.Context[Any],
                                                                          make_sub: Any) -> None:
    """Without a replay endpoint a lost batch used to make kvscope_kv_resident_blocks vanish for the rest of
    the engine's life. Now the estimate stays, flagged by kvscope_kv_residency_known 0: off by the blocks the
    lost batch stored (missing) and removed (still counted), later events keep correcting it, and it is exact
    again at the next publisher restart."""
    pub = Publisher(ctx)
    endpoint = pub.endpoint
    sub = make_sub(endpoint, kv_bytes_per_token=36864)  # gpt-oss-120b's KV bytes per token
    pub.wait_subscribed()
    pub.send(0, stores_and_removals(tuple(range(1, 11))))  # 10 blocks resident: 1..10
    pub.send(1, stores_and_removals((11, 12, 13), removed=(1,)), live=False)  # lost: truth 1..13 less 1
    pub.send(2, stores_and_removals((14,)))
    v = wait_for(sub, "kvscope_kv_events_missed_total", LAB, 1)
    truth = 12 + 1
    estimate = tier(v, "kvscope_kv_resident_blocks", "G1")
    assert (estimate, tier(v, "kvscope_kv_residency_known", "G1")) == (11, 0)
    assert truth - 3 <= estimate <= truth + 1  # at most the lost batch's 3 stores under, 1 removal over
    assert tier(v, "kvscope_tier_used_bytes", "G1") == 11 * 16 * 36864  # bytes follow the estimate
    # the engine evicts two blocks of the lost batch (not in our view: counted, ignored) and block 1 again
    # cannot be removed twice; a store of 1 again makes the phantom real: the estimate meets the truth
    pub.send(3, stores_and_removals((1,), removed=(11, 12)))
    v = wait_for(sub, "kvscope_kv_events_total", (*LAB, "BlockRemoved"), 2)
    truth = 13 - 2 + 1
    assert tier(v, "kvscope_kv_blocks_removed_unknown_total", "G1") == 2
    assert tier(v, "kvscope_kv_resident_blocks", "G1") == truth - 1  # only block 13 is still missing
    assert tier(v, "kvscope_kv_residency_known", "G1") == 0
    pub.close()  # a new engine process on the same port: empty caches, exact again
    pub = Publisher(ctx, endpoint)
    pub.wait_subscribed()
    pub.send(0, stores_and_removals((500, 501)))
    v = wait_for(sub, "kvscope_kv_publisher_restarts_total", LAB, 1)
    assert tier(v, "kvscope_kv_resident_blocks", "G1") == 2
    assert tier(v, "kvscope_kv_residency_known", "G1") == 1
    pub.close()


def test_partial_replay_with_pre_026_replies(ctx: zmq.Context[Any], make_sub: Any) -> None:
    pub = Publisher(ctx)
    replay = ReplayServer(ctx, pub.buffer, with_topic=False)
    sub = make_sub(pub.endpoint, replay_endpoint=replay.endpoint)
    pub.wait_subscribed()
    for seq in range(5):
        pub.send(seq, gpu_batch(100 + seq), live=seq not in (1, 2, 3))
    del pub.buffer[2]  # fell out of the ring buffer
    pub.send(5, gpu_batch(105))
    v = wait_for(sub, "kvscope_kv_events_missed_total", LAB, 1)
    assert v[("kvscope_kv_events_replayed_total", LAB)] == 2
    assert v[("kvscope_kv_events_dropped_total", LAB)] == 3
    assert tier(v, "kvscope_kv_residency_known", "G1") == 0
    assert tier(v, "kvscope_kv_blocks_stored_total", "G1") == 5
    replay.close()
    pub.close()


@pytest.mark.parametrize(("ring_start", "known", "replayed"), [(0, 1, 5), (2, 0, 3)])
def test_late_joiner(ctx: zmq.Context[Any], make_sub: Any, ring_start: int, known: int, replayed: int) -> None:
    pub = Publisher(ctx)
    for seq in range(5):
        pub.send(seq, gpu_batch(100 + seq))  # nobody listens yet
    for seq in range(ring_start):
        del pub.buffer[seq]
    replay = ReplayServer(ctx, pub.buffer)
    sub = make_sub(pub.endpoint, replay_endpoint=replay.endpoint)
    pub.wait_subscribed()
    assert tier(values(sub), "kvscope_kv_residency_known", "G1") == 0  # nothing seen yet
    pub.send(5, gpu_batch(105))
    v = wait_for(sub, "kvscope_kv_events_replayed_total", LAB, replayed)
    assert replay.requests == [0]
    assert tier(v, "kvscope_kv_residency_known", "G1") == known
    assert v[("kvscope_kv_events_dropped_total", LAB)] == 0  # never ours to lose
    assert v[("kvscope_kv_events_missed_total", LAB)] == 0
    assert tier(v, "kvscope_kv_blocks_stored_total", "G1") == replayed + 1
    assert tier(v, "kvscope_kv_resident_blocks", "G1") == (6 if known else None)
    replay.close()
    pub.close()


def test_engine_restart_on_the_same_port(ctx: zmq.Context[Any], make_sub: Any) -> None:
    pub = Publisher(ctx)
    endpoint = pub.endpoint
    sub = make_sub(endpoint)
    pub.wait_subscribed()
    for seq in range(3):
        pub.send(seq, gpu_batch(100 + seq))
    wait_for(sub, "kvscope_kv_blocks_stored_total", (*LAB, "G1"), 3)
    pub.close()  # the engine process dies; a new one binds the same port and counts from 0 again
    pub = Publisher(ctx, endpoint)
    pub.wait_subscribed()  # the SUB reconnected by itself
    pub.send(0, gpu_batch(500, 501))
    v = wait_for(sub, "kvscope_kv_publisher_restarts_total", LAB, 1)
    assert tier(v, "kvscope_kv_resident_blocks", "G1") == 2  # old blocks gone with the old process
    assert tier(v, "kvscope_kv_blocks_removed_total", "G1") == 3
    assert tier(v, "kvscope_kv_residency_known", "G1") == 1
    assert v[("kvscope_kv_events_dropped_total", LAB)] == 0
    for seq in range(1, 5):
        pub.send(seq, gpu_batch(510 + seq))
    wait_for(sub, "kvscope_kv_blocks_stored_total", (*LAB, "G1"), 3 + 2 + 4)
    # a restart seen late (the new process's seq 0 and 1 lost) is a gap from 0
    pub.close()
    pub = Publisher(ctx, endpoint)
    pub.wait_subscribed()
    pub.send(2, gpu_batch(600))
    v = wait_for(sub, "kvscope_kv_publisher_restarts_total", LAB, 2)
    assert v[("kvscope_kv_events_missed_total", LAB)] == 2
    assert tier(v, "kvscope_kv_residency_known", "G1") == 0
    pub.close()


def test_one_socket_per_data_parallel_rank(ctx: zmq.Context[Any], make_sub: Any) -> None:
    base = f"inproc://kv-{uuid.uuid4().hex}"
    pubs = [Publisher(ctx, base), Publisher(ctx, f"{base}_dp1")]
    sub = make_sub(base, data_parallel_size=2, topic="kv")
    for p in pubs:
        p.topic = b"kv@rank"
        p.wait_subscribed()
    pubs[0].send(0, gpu_batch(1, 2, 3))
    pubs[1].send(0, gpu_batch(4))
    pubs[1].socket.send_multipart([b"other", (1).to_bytes(8, "big"), gpu_batch(9)])  # another topic: filtered out
    wait_for(sub, "kvscope_kv_resident_blocks", ("vllm", "test-model", "1", "G1"), 1)
    v = wait_for(sub, "kvscope_kv_resident_blocks", (*LAB, "G1"), 3)
    assert v[("kvscope_kv_events_malformed_total", ("vllm", "test-model", "1"))] == 0
    for p in pubs:
        p.close()


def test_reuse_distance_histogram_over_the_wire(ctx: zmq.Context[Any], make_sub: Any) -> None:
    pub = Publisher(ctx)
    sub = make_sub(pub.endpoint, reuse_sample_rate=1.0)  # exact (the default samples 1/16 of blocks)
    pub.wait_subscribed()
    pub.send(0, gpu_batch(1, 2, 3, 1, 4, 4))  # reuses: 1 after {2,3} -> 2; 4 after {} -> 0
    wait_for(sub, "kvscope_kv_events_total", (*LAB, "BlockStored"), 6)
    (h,) = [r for r in sub.collect() if isinstance(r, HistogramSample) and r.labels == (*LAB, "G1")]
    assert (h.count, h.sum) == (2, 2)
    assert dict(h.buckets)[0.0] == 1 and dict(h.buckets)[1.0] == 1 and dict(h.buckets)[2.0] == 2
    pub.close()


def test_a_steady_stream_is_held_between_looks_and_handled_together_at_most_hold_apart() -> None:
    """While the windows are short, the looks only queue what they find and the queue is handled once HOLD has
    passed since the look that began holding (kv_event_socket.Receiver._hold); at once when the stream is not
    steady, ZMQ's queue was full, the held bytes reach HOLD_BYTES (at most half of our queue) or the next look
    would come after HOLD."""
    from kvscope.collectors.kv_events.subscriber import HOLD, HOLD_BYTES, Receiver, SocketOptions

    ctx: zmq.Context[Any] = zmq.Context()
    try:
        receiver = Receiver(ctx, [], SocketOptions(b"", 8, 1 << 20, 1 << 25, 1.0, 1.0), lambda s, f: None,
                            lambda s: None)
        hold = receiver._hold
        assert hold(10.0, 10.0, 0.004, False) == 10.0  # a steady look begins holding
        assert hold(10.0, 10.0 + HOLD - 0.005, 0.004, False) == 10.0  # the next look still within HOLD
        assert hold(10.0, 10.0 + HOLD - 0.003, 0.004, False) == 0.0  # it would come after HOLD: handle now
        assert hold(10.0, 10.0, 0.0, False) == 0.0  # not steady: a lone message is handled at once
        assert hold(10.0, 10.0, 0.004, True) == 0.0  # ZMQ's queue was full: a backlog, handle it
        assert hold(10.0, 10.0, HOLD + 0.001, False) == 0.0  # windows longer than HOLD: nothing to gather
        receiver._queued = HOLD_BYTES
        assert hold(10.0, 10.0, 0.004, False) == 0.0
        small = Receiver(ctx, [], SocketOptions(b"", 8, 1 << 20, 64 * 1024, 1.0, 1.0), lambda s, f: None,
                         lambda s: None)
        small._queued = 32 * 1024  # half of a 64 KiB queue: handled before the queue could shed
        assert small._hold(10.0, 10.0, 0.004, False) == 0.0
    finally:
        ctx.term()


def test_a_steady_stream_is_handled_in_groups_and_the_last_held_batch_when_it_stops(make_sub: Any) -> None:
    """1,000 batches/s: a window of 8 / 2 x 1 ms; the handlings come about HOLD + a window apart, not a window
    apart (~4 ms without holding). When the stream stops, the look that finds nothing hands over what is held:
    every batch is applied without another message to wake the thread (three times: without that hand-over
    this fails unless none of the three last looks held)."""
    from kvscope.collectors.kv_events.subscriber import HOLD

    pub = Publisher(make_sub.ctx)
    sub = make_sub(pub.endpoint)
    pub.wait_subscribed()
    handled: list[float] = []
    handle = sub.receiver._handle

    def recording(stream: Any, run: Any) -> None:
        handled.append(time.monotonic())
        handle(stream, run)

    sub.receiver._handle = recording
    gaps: list[float] = []
    for _ in range(3):  # three stops: the last look before a stop holds ~5 times in 6
        start = len(handled)
        end = time.monotonic() + 0.25
        while time.monotonic() < end:
            pub.send_next(gpu_batch(pub.next_seq + 1))
            time.sleep(0.001)
        v = wait_for(sub, "kvscope_kv_blocks_stored_total", (*LAB, "G1"), pub.next_seq)
        assert v[("kvscope_kv_events_dropped_total", LAB)] == 0
        gaps += [b - a for a, b in zip(handled[start:], handled[start + 1:], strict=False)]
    gaps.sort()
    assert len(gaps) >= 5 and gaps[len(gaps) // 2] >= HOLD / 2, gaps
    pub.close()


def test_the_receive_window_follows_the_rate_and_shortens_for_a_backlog() -> None:
    """The pause between two looks at the sockets (kv_event_socket.Receiver._window): a steady stream is looked at
    once per window, as long as half of ZMQ's queue takes to fill at its rate, within MIN/MAX_WINDOW."""
    from kvscope.collectors.kv_events.subscriber import MAX_WINDOW, MIN_WINDOW, Receiver, SocketOptions

    ctx: zmq.Context[Any] = zmq.Context()
    try:
        receiver = Receiver(ctx, [], SocketOptions(b"", 8, 1 << 20, 1 << 25, 1.0, 1.0), lambda s, f: None,
                            lambda s: None)
        window = receiver._window
        # vLLM's steady state, one batch per engine step of 10 ms: 8 / 2 x 10 ms
        assert window(2, 2, 0.020) == pytest.approx(0.040)
        assert window(2, 2, 0.040) == MAX_WINDOW  # one every 20 ms: 80 ms, capped
        assert window(1, 1, 0.005) == pytest.approx(0.020)  # 200 batches/s: 4 x 5 ms
        assert window(4, 16, 0.004) == MIN_WINDOW  # 4,000 batches/s: 1 ms, raised to the minimum
        assert window(1, 1, 1.0) == 0.0  # a lone message after a quiet second: wait on the sockets
        # ZMQ's queue was full: the shortest window, whatever the rate seemed (the loop looks again at once)
        assert window(8, 8, 0.002) == MIN_WINDOW and window(8, 8, 1.0) == MIN_WINDOW
        assert window(1, 9, 0.030) == pytest.approx(0.030 / 9 * 4)  # moved while handling counts in the rate
    finally:
        ctx.term()
