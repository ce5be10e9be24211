"""A KV-event flood publisher, run as its own process (`python -m testkit.kv_flood ...`) so that it does not
share the subscriber's GIL: vLLM's PUB side sending batches of `--events` GPU stores (about 200 bytes
each in vLLM 0.33's map form) as fast as it can for `--seconds`, then, after a pause, one last batch
that shows any gap at the end (sent again every pause until stdin closes, so that it arrives). Prints
`endpoint ...` once bound, and `sent N seconds S` at the end.

Payloads are encoded before the flood (`--distinct` different ones, cycled, each with its own block
hashes), so the publisher spends its time sending."""

from __future__ import annotations

import argparse
import select
import sys
import time
from typing import Any

import msgspec
import zmq

from kvscope.agent.tools.reference.vllm_kv_wire import Vllm033Batch, Vllm033BlockStored

TOKENS = list(range(100_000, 100_016))  # a 16-token block of 5-byte token ids


def payloads(distinct: int, events: int) -> list[bytes]:
    out = []
    for i in range(distinct):
        batch = [Vllm033BlockStored([((i * events + j) * 0x9E3779B97F4A7C15) % 2**64], None, TOKENS, 16, None,
                                    "GPU", None) for j in range(events)]
        out.append(msgspec.msgpack.encode(Vllm033Batch(time.time(), batch, 0)))
    return out


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--events", type=int, default=128)
    ap.add_argument("--distinct", type=int, default=512)
    ap.add_argument("--pause", type=float, default=0.5)
    args = ap.parse_args(argv)
    bodies = payloads(args.distinct, args.events)
    ctx: zmq.Context[Any] = zmq.Context()
    sock = ctx.socket(zmq.XPUB)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.bind("tcp://127.0.0.1:*")
    print("endpoint", sock.getsockopt_string(zmq.LAST_ENDPOINT), len(bodies[0]), flush=True)
    if not sock.poll(10_000) or sock.recv()[:1] != b"\x01":
        sys.exit("no subscriber")
    seq = 0
    start = time.monotonic()
    end = start + args.seconds
    n = len(bodies)
    while time.monotonic() < end:
        for _ in range(256):
            sock.send_multipart([b"", seq.to_bytes(8, "big"), bodies[seq % n]], copy=False)
            seq += 1
    elapsed = time.monotonic() - start
    time.sleep(args.pause)
    last = [b"", seq.to_bytes(8, "big"), bodies[seq % n]]
    print("sent", seq + 1, "seconds", f"{elapsed:.3f}", flush=True)
    # The last batch must reach the subscriber's sequence check, however far behind it is: the PUB drops on
    # a full queue, and the subscriber's own queue sheds while full. So it goes again every `pause` until
    # the test is done with us (stdin closed); the copies after the first applied are skipped as repeats.
    while True:
        sock.send_multipart(last)
        if select.select([sys.stdin], [], [], args.pause)[0] and not sys.stdin.read(1):
            break
    sock.close()
    ctx.term()


if __name__ == "__main__":
    main(sys.argv[1:])
