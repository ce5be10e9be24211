"""A KV-event flood publisher, run as its own process (`python -m testkit.kv_flood ...`) so that it does not
share the subscriber's GIL: the shared publisher (kvscope.agent.tools.reference.kv_publisher) sending
batches of `--events` GPU stores (about 200 bytes each in vLLM 0.33's map form) as fast as it can for
`--seconds`, then, after a pause, one last batch that shows any gap at the end (sent again every pause
until stdin closes, so that it arrives). Prints `endpoint E SIZE` (SIZE: bytes of a batch) once bound, and
`sent N seconds S` at the end.

Payloads are encoded before the flood (`--distinct` different ones, cycled, each with its own block
hashes), so the publisher spends its time sending."""

from __future__ import annotations

import argparse
import select
import sys
import time
from typing import Any

import zmq

from kvscope.agent.tools.reference.kv_publisher import KVEventPublisher, NewBlockBatches

ZMQ_DEFAULT_SNDHWM = 1000  # the flood's publisher drops at ZMQ's default queue, not at vLLM's 100,000


def stdin_closed(timeout: float) -> bool:
    """Whether stdin reached its end within `timeout` seconds (the test is done with us)."""
    return bool(select.select([sys.stdin], [], [], timeout)[0]) and not sys.stdin.read(1)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--events", type=int, default=128)
    ap.add_argument("--distinct", type=int, default=512)
    ap.add_argument("--pause", type=float, default=0.5)
    args = ap.parse_args(argv)
    new_blocks = NewBlockBatches(args.events)
    bodies = [new_blocks.batch(i) for i in range(args.distinct)]
    ctx: zmq.Context[Any] = zmq.Context()
    pub = KVEventPublisher(ctx, buffer_steps=0, sndhwm=ZMQ_DEFAULT_SNDHWM, watch_subscriptions=True)
    print("endpoint", pub.endpoint, len(bodies[0]), flush=True)
    try:
        pub.wait_subscribed(10.0)
    except (TimeoutError, ConnectionError):
        sys.exit("no subscriber")
    elapsed = pub.stream(lambda seq: bodies[seq % len(bodies)], args.seconds)
    time.sleep(args.pause)
    pub.send_next(bodies[pub.next_seq % len(bodies)])
    print("sent", pub.next_seq, "seconds", f"{elapsed:.3f}", flush=True)
    # The last batch must reach the subscriber's sequence check, however far behind it is: the PUB drops on
    # a full queue, and the subscriber's own queue sheds while full. So it goes again every `pause` until
    # the test is done with us; the copies after the first applied are skipped as repeats.
    pub.redeliver_last(args.pause, stdin_closed)
    pub.close(2.0)
    ctx.term()


if __name__ == "__main__":
    main(sys.argv[1:])
