"""A paced vLLM KV-event publisher, run as its own process (it must not share the subscriber's GIL).

vLLM's PUB side: `[topic, seq (8 bytes), msgpack batch]` at `--rate` block events per second in batches
of `--events` GPU BlockStored events (vLLM 0.33's map form, ~190 bytes an event), every block new (each
hash is derived from the batch's sequence number and its place in it, written into a pre-encoded batch),
for `--seconds`; then, after a pause, one last batch that shows any loss at the end. Rate 0: as fast as it
can. Prints `endpoint E` once bound, `subscribed` once a subscriber is, and `sent N seconds S`. Then, with
`--wait`, it sends the last batch again every 0.25 s until a second line on stdin (or `--linger` s); at
exit it lingers until its queue is delivered (up to `--linger` s), so a subscriber that fell behind still
gets the tail and the last batch, and can count everything it lost.

Run: python bench/kv_publisher.py --rate 50000 --events 16 --seconds 5
"""

from __future__ import annotations

import argparse
import select
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "lib"))  # testkit; kvscope itself is installed

import msgspec
import zmq

from kvscope.agent.tools.reference.vllm_kv_wire import Vllm033Batch, Vllm033BlockStored

TOKENS = list(range(100_000, 100_016))  # a 16-token block of 5-byte token ids
MARK = 0xA5A5A5A5A5A5A5A5  # a placeholder hash, found in the encoded template and overwritten per batch
GOLDEN = 0x9E3779B97F4A7C15


class Batches:
    """Encoded batches of `events` new GPU blocks: one template, the hashes written in for each batch."""

    def __init__(self, events: int) -> None:
        stored = [Vllm033BlockStored([MARK], None, TOKENS, 16, None, "GPU", None) for _ in range(events)]
        self.template = bytearray(msgspec.msgpack.encode(Vllm033Batch(time.time(), stored, 0)))
        mark = b"\xcf" + MARK.to_bytes(8, "big")
        self.offsets = []
        at = self.template.find(mark)
        while at >= 0:
            self.offsets.append(at + 1)
            at = self.template.find(mark, at + 1)
        assert len(self.offsets) == events
        self.events = events

    def batch(self, seq: int) -> bytes:
        body = self.template
        first = seq * self.events
        for j, at in enumerate(self.offsets):
            body[at:at + 8] = (((first + j + 1) * GOLDEN) % 2**64 | 1).to_bytes(8, "big")
        return bytes(body)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=50_000.0, help="block events per second (0: unpaced)")
    ap.add_argument("--events", type=int, default=16, help="events per batch")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--pause", type=float, default=1.0)
    ap.add_argument("--linger", type=float, default=20.0, help="seconds to deliver the queue at exit")
    ap.add_argument("--hwm", type=int, default=100_000, help="SNDHWM (vLLM's PUB sets 100000)")
    ap.add_argument("--wait", action="store_true", help="after the subscription, wait for a line on stdin")
    args = ap.parse_args(argv)
    batches = Batches(args.events)
    ctx: zmq.Context[Any] = zmq.Context()
    sock = ctx.socket(zmq.XPUB)  # XPUB: waits for the subscription instead of guessing (slow joiner)
    sock.setsockopt(zmq.SNDHWM, args.hwm)
    sock.bind("tcp://127.0.0.1:*")
    print("endpoint", sock.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
    if not sock.poll(30_000) or sock.recv()[:1] != b"\x01":
        print("no subscriber", file=sys.stderr)
        return 1
    print("subscribed", flush=True)
    if args.wait:
        sys.stdin.readline()  # the caller's go, once it has measured what it wants to before the first batch
    per_second = args.rate / args.events
    seq = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < args.seconds:
        target = int(elapsed * per_second) + 1 if args.rate else seq + 64
        while seq < target:
            sock.send_multipart([b"", seq.to_bytes(8, "big"), batches.batch(seq)])
            seq += 1
        if args.rate:  # until the next batch is due (a 2 kHz wake-up loop would load the subscriber's cores)
            time.sleep(max(0.0005, seq / per_second - (time.perf_counter() - start)))
    elapsed = time.perf_counter() - start
    time.sleep(args.pause)
    last = [b"", seq.to_bytes(8, "big"), batches.batch(seq)]
    sock.send_multipart(last)
    seq += 1
    print("sent", seq, "seconds", f"{elapsed:.3f}", flush=True)
    if args.wait:
        # The last batch is what shows the subscriber any loss at the end, but after a flood it can be dropped
        # like the others: ZMQ takes nothing into a full queue until the subscriber has drained half of it.
        # It is sent again every 0.25 s (a subscriber skips the copies as repeats) until the caller's line.
        deadline = time.monotonic() + args.linger
        while time.monotonic() < deadline and not select.select([sys.stdin], [], [], 0.25)[0]:
            sock.send_multipart(last)
    sock.close(int(args.linger * 1000))  # blocks in term() until delivered or the linger is over
    ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
