"""A paced vLLM KV-event publisher, run as its own process (it must not share the subscriber's GIL): a thin
command line over the shared publisher (kvscope.agent.tools.reference.kv_publisher).

It sends `--rate` block events per second in batches of `--events` GPU BlockStored events (vLLM 0.33's map
form, ~190 bytes an event, every block new) for `--seconds`; then, after a pause, one last batch that shows
any loss at the end. Rate 0: as fast as it can. Prints `endpoint E` once bound, `subscribed` once a
subscriber is, and `sent N seconds S`. Then, with `--wait`, it sends the last batch again every 0.25 s
until a second line on stdin (or `--linger` s); at exit it lingers until its queue is delivered (up to
`--linger` s), so a subscriber that fell behind still gets the tail and the last batch, and can count
everything it lost.

Run: python bench/kv_publisher.py --rate 50000 --events 16 --seconds 5
"""

from __future__ import annotations

import argparse
import select
import sys
import time
from typing import Any

import zmq

from kvscope.agent.tools.reference.kv_publisher import KVEventPublisher, NewBlockBatches


def stdin_readable(timeout: float) -> bool:
    """Whether the caller has written a line (or closed stdin) within `timeout` seconds."""
    return bool(select.select([sys.stdin], [], [], timeout)[0])


def arguments(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rate", type=float, default=50_000.0, help="block events per second (0: unpaced)")
    ap.add_argument("--events", type=int, default=16, help="events per batch")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--pause", type=float, default=1.0)
    ap.add_argument("--linger", type=float, default=20.0, help="seconds to deliver the queue at exit")
    ap.add_argument("--hwm", type=int, default=100_000, help="SNDHWM (vLLM's PUB sets 100000)")
    ap.add_argument("--wait", action="store_true", help="after the subscription, wait for a line on stdin")
    return ap.parse_args(argv)


def main(argv: list[str]) -> int:
    args = arguments(argv)
    batches = NewBlockBatches(args.events)
    ctx: zmq.Context[Any] = zmq.Context()
    pub = KVEventPublisher(ctx, buffer_steps=0, sndhwm=args.hwm, watch_subscriptions=True)
    print("endpoint", pub.endpoint, flush=True)
    try:
        pub.wait_subscribed(30.0)
    except (TimeoutError, ConnectionError):
        print("no subscriber", file=sys.stderr)
        return 1
    print("subscribed", flush=True)
    if args.wait:
        sys.stdin.readline()  # the caller's go, once it has measured what it wants to before the first batch
    elapsed = pub.stream(batches.batch, args.seconds, args.rate / args.events)
    time.sleep(args.pause)
    pub.send_next(batches.batch(pub.next_seq))
    print("sent", pub.next_seq, "seconds", f"{elapsed:.3f}", flush=True)
    if args.wait:
        pub.redeliver_last(0.25, stdin_readable, at_most=args.linger)
    pub.close(args.linger)  # the context's term() blocks until delivered or the linger is over
    ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
