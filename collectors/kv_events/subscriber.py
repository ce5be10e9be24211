"""The KV-event subscriber's socket thread: ZMQ sockets, a receive queue bounded in bytes, replay requests.

One SUB socket per data-parallel rank. The thread receives messages as they come and processes them from
its own queue, a run of consecutive messages of one rank at a time (at most RUN_BYTES of them, so that a
run of small batches pays once for what every batch would pay alike: a lock, a residency update); between
two runs (at most every DRAIN_EVERY seconds of processing) and while it waits for a replay, it moves
whatever ZMQ has received into the queue. While a stream is steady and its windows short, what the looks
queue is held and handled together at most HOLD seconds after the first of them. Memory is bounded in bytes:

- ZMQ's MAXMSGSIZE: a frame larger than `max_message_bytes` makes ZMQ drop the connection. ZMQ takes
  that for a protocol error and does not reconnect by itself, so a monitor socket watches each SUB and
  connects it again after any disconnection; the batches lost with the connection show as a gap;
- ZMQ's own queue holds at most `rcvhwm` messages, so at most rcvhwm × max_message_bytes; when it is
  full ZMQ stops reading the TCP connection and the publisher's queue takes the rest (vLLM's PUB drops
  beyond its `hwm`, which shows as a gap);
- our queue holds at most `max_queue_bytes`: a message that does not fit is dropped at once and counted
  in its stream's `shed` (the queue always takes one message, whatever its size);
- a replay is read one batch at a time (ZMQ's queue for it again holds at most rcvhwm messages).

So a flood costs at most about max_queue_bytes + 2 × rcvhwm × max_message_bytes of payload, and every
batch it loses is counted: at once when our queue drops it, as a gap when a later batch is processed.

Processing a message (`handle`) and checking a quiet stream's tail (`check_tail`) are the collector's;
this module only moves bytes.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from kvscope.collectors.kv_events.schema import END_SEQ
from kvscope.collectors.kv_events.sequence import Stream, log_once

DRAIN_EVERY = 0.001  # seconds of processing between two moves of ZMQ's queue into ours
DRAIN_LIMIT = 256  # messages moved per socket and drain: a flood must not keep the thread from processing
RUN_BYTES = 64 * 1024  # a run handed to `handle` ends after the message that reaches this many bytes
POLL_MS = 100  # the longest the thread sleeps without looking at stop(), monitors and quiet streams
# While messages keep coming, the thread looks at its sockets once per window instead of waking for each
# message: one wake-up then serves the messages of the whole window. A stream is steady when a look found
# more than one message, or came within STEADY_GAP of the look before that found some; the window is then
# as long as half of ZMQ's queue (rcvhwm messages) takes to fill at the rate seen, within MIN_WINDOW and
# MAX_WINDOW, and counts from the look: handling what a look found takes from the pause. A look that
# finds ZMQ's queue full sets the shortest window and the next look comes as soon as the messages are
# handled (more may wait in the connection); a look that finds nothing ends the windows (the thread waits
# on the sockets again). Messages that come while the thread handles a look wait for the next look unless
# handling takes longer than DRAIN_EVERY.
#
# What a look costs is what kept the socket thread above a bare subscriber: every zmq_poll asks each socket
# and its monitor for ZMQ's pending commands (a poll(2) and a getpid(2) each) before its own poll(2), so a
# steady look takes the messages with receives alone (one failed receive at the end: two system calls) and
# the monitors and quiet streams are looked at every POLL_MS instead (docs/vllm-kv-events.md#performance-and-loss).
MIN_WINDOW = 0.002
MAX_WINDOW = 0.050
STEADY_GAP = 0.050
# While a steady stream's windows are short, the looks only move messages into the queue and what is queued
# is handled together once HOLD has passed since the look that began holding (or HOLD_BYTES are queued, or
# ZMQ's queue was full, or a look found nothing): one handling per HOLD instead of one per window. The
# decoding and applying code then runs in bursts of ~60 messages instead of ~7, and the VM this was measured
# on charges a thread for picking that code up again after each sleep (docs/vllm-kv-events.md#performance-and-loss).
HOLD = 0.020
HOLD_BYTES = 256 * 1024


def steady_window(seconds_per_message: float, rcvhwm: int) -> float:
    """The pause between two looks at a steady stream: the time half of ZMQ's queue takes to fill."""
    return min(MAX_WINDOW, max(MIN_WINDOW, seconds_per_message * rcvhwm / 2))

# A message's frames: ZMQ's frames as received with copy=False (no copy; a zmq.Frame is read through the
# buffer protocol, and `.more` is an attribute where pyzmq's recv_multipart asks ZMQ for RCVMORE through
# two Python layers, which costs twice the whole receive), or bytes (replays, tests). Typed Any: pyzmq's
# stubs do not say that a Frame is a buffer.
Frames = Sequence[Any]
# The collector's: a run of one rank's messages, in the order they came.
Handle = Callable[[Stream, list[Frames]], None]


@dataclass(frozen=True)
class SocketOptions:
    topic: bytes
    rcvhwm: int  # messages in ZMQ's own queue per socket
    max_message_bytes: int  # ZMQ MAXMSGSIZE, per frame
    max_queue_bytes: int  # our queue, all ranks together
    replay_timeout: float  # seconds without a reply before a replay is given up (5 x that in all)
    tail_check_after: float  # seconds of quiet before a stream's tail is checked through replay


class Receiver:
    """Runs in the collector's socket thread (`run`); `replay` is called from `handle` on that thread."""

    def __init__(self, ctx: zmq.Context[Any], streams: list[Stream], options: SocketOptions, handle: Handle,
                 check_tail: Callable[[Stream], None], clock: Callable[[], float] = time.monotonic) -> None:
        self._ctx = ctx
        self._streams = streams
        self.options = options
        self._handle = handle
        self._check_tail = check_tail
        self._clock = clock
        self._queue: deque[tuple[Stream, Frames, int]] = deque()
        self._queued = 0
        self.max_queued = 0  # the most bytes the queue held (for tests and the docs' bound)
        self._socks: dict[zmq.Socket[Any], Stream] = {}
        self._monitors: dict[zmq.Socket[Any], tuple[zmq.Socket[Any], Stream]] = {}
        self.reconnects = 0  # connections we made again after ZMQ dropped them
        self._poller = zmq.Poller()
        self._watcher = zmq.Poller()  # the monitors alone
        self._last_message: dict[int, float] = {}  # rank -> clock() of its last message

    def _configure(self, sock: zmq.Socket[Any]) -> None:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, self.options.rcvhwm)
        sock.setsockopt(zmq.MAXMSGSIZE, self.options.max_message_bytes)

    def run(self, stop: threading.Event, ready: threading.Event) -> None:
        try:
            for stream in self._streams:
                sock = self._ctx.socket(zmq.SUB)
                self._configure(sock)
                sock.setsockopt(zmq.SUBSCRIBE, self.options.topic)
                self._socks[sock] = stream
                monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
                self._monitors[monitor] = (sock, stream)
                sock.connect(stream.endpoint)
                self._poller.register(sock, zmq.POLLIN)
                self._poller.register(monitor, zmq.POLLIN)
                self._watcher.register(monitor, zmq.POLLIN)
                self._last_message[stream.rank] = self._clock()
            ready.set()
            self._loop(stop)
        except zmq.ContextTerminated:
            pass
        finally:
            for monitor, (sock, _) in self._monitors.items():
                with contextlib.suppress(zmq.ZMQError):
                    sock.disable_monitor()
                monitor.close(0)
            for sock in self._socks:
                sock.close(0)

    def _loop(self, stop: threading.Event) -> None:
        queue = self._queue
        next_drain = 0.0
        next_watch = 0.0
        last_look = -1.0  # clock() when a look last found messages
        window = 0.0  # > 0 while the stream is steady: the pause between two looks
        full = False  # the last look found ZMQ's queue full: more may wait in the connection
        came = 0  # messages taken while handling since the last look that found some (for the rate)
        held_since = 0.0  # clock() of the look that began holding what is queued; 0: not holding
        rcvhwm = self.options.rcvhwm
        while not stop.is_set():  # handle what is queued, a run at a time, then look again
            if queue and not held_since:
                self._handle(*self._pop_run())
                now = self._clock()
                if now >= next_drain:
                    came += self._take()
                    next_drain = now + DRAIN_EVERY
                continue
            got = 0
            if window:  # a steady stream: one look per window, handling included
                if full:  # the last look found ZMQ's queue full: look again at once
                    got = self._take()
                if not got:
                    pause = last_look + window - self._clock()
                    if pause > 0:
                        time.sleep(pause)  # let this window's messages gather; one look takes them all
                    got = self._take()
                now = self._clock()
                if now >= next_watch:  # what the poll below watches while the stream is not steady
                    got += self._watch()
                    next_watch = now + POLL_MS / 1000
            if got == 0:
                if queue:  # held, and this look found nothing: handle what is held before waiting
                    held_since = window = 0.0
                    continue
                got = self._drain_ready(self._poll_ms())  # wait for the next message
                if got == 0:
                    window = 0.0  # `full` is read only while steady: the next look that finds any sets it
                    self._check_quiet()
                    continue
            now = self._clock()  # the rate: what came since the last look, taken by it or while handling
            full = got >= rcvhwm
            window = self._window(got, came + got, now - last_look)
            last_look, came = now, 0
            next_drain = now + DRAIN_EVERY
            held_since = self._hold(held_since or now, now, window, full)

    def _pop_run(self) -> tuple[Stream, list[Frames]]:
        """The oldest queued message and those of the same rank right behind it, up to RUN_BYTES."""
        queue = self._queue
        stream, frames, size = queue.popleft()
        run = [frames]
        taken = size
        while taken < RUN_BYTES and queue and queue[0][0] is stream:
            _, frames, size = queue.popleft()
            run.append(frames)
            taken += size
        self._queued -= taken
        stream.queued_bytes -= taken
        return stream, run

    def _take(self) -> int:
        """Move what every SUB socket holds into the queue with receives alone (no zmq_poll); returns how
        many messages came."""
        return sum(self._drain(sock, stream) for sock, stream in self._socks.items())

    def _watch(self) -> int:
        """While steady: reconnect sockets whose monitor reported a disconnection and check quiet streams'
        tails. Returns the messages a reconnection read."""
        moved = sum(self._reconnect(monitor) for monitor, _ in self._watcher.poll(0))
        self._check_quiet()
        return moved

    def _window(self, got: int, came: int, gap: float) -> float:
        """The pause before the next look, after one that found `got` messages, `came` of them in all
        (those moved while handling included) `gap` seconds after the last look that found any: 0 (not
        steady: wait on the sockets), MIN_WINDOW when ZMQ's queue was full (the rate is at least that,
        and the next look comes once these are handled), else the time half of ZMQ's queue takes to fill
        at that rate (MIN_WINDOW..MAX_WINDOW)."""
        rcvhwm = self.options.rcvhwm
        if got >= rcvhwm:
            return MIN_WINDOW
        if came <= 1 and gap >= STEADY_GAP:
            return 0.0
        return steady_window(gap / came, rcvhwm)

    def _hold(self, start: float, now: float, window: float, full: bool) -> float:
        """After a look at `now` that found messages: the clock() from which what is queued stays held
        (`start`: when holding began, or now), or 0 to handle it now: a stream that is not steady, ZMQ's
        queue full, HOLD_BYTES queued (at most half of our queue's bound), or a next look beyond HOLD."""
        if (not window or full or self._queued >= min(HOLD_BYTES, self.options.max_queue_bytes // 2)
                or now + window - start > HOLD):
            return 0.0
        return start

    def _poll_ms(self) -> int:
        """Sleep until a message comes, or the next quiet stream is due for a tail check."""
        due = [self._last_message[s.rank] + self.options.tail_check_after for s in self._streams
               if s.replay and s.expected is not None and s.tail_checked != s.expected]
        if not due:
            return POLL_MS
        return max(0, min(POLL_MS, int((min(due) - self._clock()) * 1000) + 1))

    def _drain_ready(self, timeout_ms: int) -> int:
        """Move what the sockets hold into the queue; returns how many messages came (0: none within
        `timeout_ms`, or only a socket event)."""
        events = self._poller.poll(timeout_ms)
        moved = 0
        for sock, _ in events:
            stream = self._socks.get(sock)
            if stream is not None:
                moved += self._drain(sock, stream)
            else:
                moved += self._reconnect(sock)
        return moved

    def _reconnect(self, monitor: zmq.Socket[Any]) -> int:
        """A SUB lost its connection. After a protocol error (a frame over MAXMSGSIZE) ZMQ would leave it
        disconnected for good; after any other, it is reconnecting already. Either way, start over: one
        disconnect and connect leaves exactly one connection attempt behind. What the old connection
        delivered is read first: disconnect() discards a pipe's unread messages, and a batch lost that way
        before the first one read would pass for a late join instead of a gap. Returns the messages read."""
        sock, stream = self._monitors[monitor]
        recv_monitor_message(monitor)
        moved = 0
        while (n := self._drain(sock, stream)) > 0:
            moved += n
            if n < DRAIN_LIMIT:
                break
        with contextlib.suppress(zmq.ZMQError):  # ZMQ may have forgotten the endpoint already
            sock.disconnect(stream.endpoint)
        sock.connect(stream.endpoint)
        self.reconnects += 1
        log_once(stream, "reconnect", "the connection to the publisher dropped (it went away, or sent a "
                 f"frame over max_message_bytes={self.options.max_message_bytes}); connecting again")
        return moved

    def _drain(self, sock: zmq.Socket[Any], stream: Stream) -> int:
        queue = self._queue
        limit = self.options.max_queue_bytes
        recv = sock.recv
        n = 0
        while n < DRAIN_LIMIT:
            try:
                frame = recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            n += 1
            frames = [frame]
            while frame.more:  # ZMQ delivers a message whole: its other frames are there
                frame = recv(zmq.NOBLOCK, copy=False)
                frames.append(frame)
            size = sum(map(len, frames))
            if queue and self._queued + size > limit:
                stream.shed += 1  # counted now; a gap in the sequence numbers shows it again later
                continue
            queue.append((stream, frames, size))
            self._queued += size
            stream.queued_bytes += size
            if self._queued > self.max_queued:
                self.max_queued = self._queued
        if n:
            self._last_message[stream.rank] = self._clock()
        return n

    def _check_quiet(self) -> None:
        now = self._clock()
        for stream in self._streams:
            if now - self._last_message[stream.rank] >= self.options.tail_check_after:
                self._check_tail(stream)

    def replay(self, stream: Stream, start: int, stop: int | None,
               malformed: Callable[[Stream, str], None]) -> Iterator[tuple[int, bytes]]:
        """(seq, payload) of batches start..stop-1 (stop None: all it has) from vLLM's replay ROUTER.

        A fresh DEALER sends `[b"", start_seq8]` and reads `[b"", topic, seq8, payload]` (vLLM >= 0.26) or
        `[b"", seq8, payload]` (<= 0.25) until the end marker; a REQ socket would keep only the first reply.
        Live messages keep being queued meanwhile. Gives up after replay_timeout seconds without a reply
        or 5 x replay_timeout in all."""
        sock = self._ctx.socket(zmq.DEALER)
        self._configure(sock)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        for live in self._socks:
            poller.register(live, zmq.POLLIN)
        timeout = self.options.replay_timeout
        try:
            sock.connect(stream.replay)
            sock.send_multipart([b"", start.to_bytes(8, "big")])
            give_up = self._clock() + 5 * timeout
            quiet_until = self._clock() + timeout
            while True:
                now = self._clock()
                wait = min(quiet_until, give_up) - now
                if wait <= 0:
                    log_once(stream, "replay-timeout", f"replay from {stream.replay} timed out")
                    return
                ready = dict(poller.poll(int(wait * 1000) + 1))
                for live in self._socks:
                    if live in ready:
                        self._drain(live, self._socks[live])
                if sock not in ready:
                    continue
                quiet_until = self._clock() + timeout
                frames = sock.recv_multipart()
                if len(frames) not in (3, 4) or frames[0] != b"" or len(frames[-2]) != 8:
                    malformed(stream, f"replay reply of {len(frames)} frames")
                    continue
                seq_bytes, payload = frames[-2], frames[-1]
                if seq_bytes == END_SEQ or not payload:
                    return
                seq = int.from_bytes(seq_bytes, "big")
                yield seq, payload
                if stop is not None and seq >= stop - 1:
                    return  # the rest of the buffer will arrive live
        finally:
            sock.close(0)
