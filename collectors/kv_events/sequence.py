"""Sequence numbers of vLLM's KV-event stream: in order, gap, restart, repeat, impossible; replay and tail.

vLLM numbers each publisher's batches from 0, +1 per batch, and starts again at 0 with the process
(facts/vllm.md §2.2). Pure apart from the replay it is handed: `Sequencer.accept` takes one decoded live
batch with its seq (`accept_many` a run of them) and decides, per rank (`Stream`):

- **in order** (seq = expected): applied;
- **gap** (expected < seq ≤ expected + max_seq_gap): the missing batches are counted as dropped, asked of
  the replay endpoint and applied in order before this one; what did not come back is missed and makes
  residency unknown;
- **first batch** (nothing seen yet): a late join; replay from 0 (never counted as dropped: those batches
  were never ours to lose), residency known only if the replay reaches back to seq 0;
- **repeated** (seq < expected, and the batch is not newer than the last one applied: its `ts` is not
  greater): the same batch again, or an older one; skipped and counted, nothing else changes;
- **restart** (seq < expected and a newer ts): a new engine process; its caches start empty, so the rank's
  residency is cleared and the stream starts again from 0 (a first seq above 0 is a gap from 0);
- **impossible** (seq ≥ 2**63: no counter from 0 gets there; 2**64 − 1 is the replay end marker): skipped
  and counted as rejected, nothing else changes;
- **jump** (seq > expected + max_seq_gap): not believed from one batch. It is held back; if the next
  batch continues it (seq + 1), both are taken as an ordinary gap and applied; if it is the same batch
  again (same seq and ts: a publisher that repeats its last batch), the held one is applied as an
  ordinary gap and the copy counted as repeated; if anything else comes first, the held batch is
  rejected (counted) and the stream goes on where it was.

`ts` decides repeat against restart whatever the batch's shape: the array vLLM sends, or the map form of a
short-lived vLLM main-branch state, which decodes to the same ts.

A lost tail (the last batches before the stream went quiet) shows no gap until the next batch. With a
replay endpoint, `check_tail` asks for everything from the expected seq on: the replay buffer holds the
newest batches, so what comes back is the tail we lost.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kvscope.collectors.kv_events.residency import Residency
from kvscope.collectors.kv_events.schema import DecodedBatch

log = logging.getLogger("kvscope.vllm_kv_events")

MAX_SEQ = 2**63 - 1  # the largest sequence number believed; END_SEQ (2**64 - 1) marks a replay's end

# start seq, stop seq (exclusive; None = to the end of the replay buffer) -> (seq, batch) in seq order
Replay = Callable[["Stream", int, int | None], Iterable[tuple[int, DecodedBatch]]]


@dataclass(eq=False)
class Stream:
    """One publisher (data-parallel rank): its addresses, sequence state, counters and residency."""

    rank: int
    endpoint: str
    replay: str  # "" = no replay endpoint
    residency: Residency
    labels: tuple[str, ...] = ()
    expected: int | None = None  # the next seq in order; None before the first batch
    last_ts: float = float("-inf")  # ts of the last batch applied
    held: tuple[int, DecodedBatch] | None = None  # a jump waiting for the next batch to confirm it
    tail_checked: int | None = None  # `expected` at the last tail check (one check per quiet period)
    dropped: int = 0  # batches missing from the live stream (gaps and lost tails), recovered or not
    missed: int = 0  # of those, not recovered by replay
    replayed: int = 0  # batches applied from the replay endpoint
    malformed: int = 0  # messages skipped as garbage
    restarts: int = 0
    repeated: int = 0  # batches already applied (or older) that came again; skipped
    rejected: int = 0  # batches with a sequence number that cannot be (impossible, or an unconfirmed jump)
    shed: int = 0  # batches dropped by our own full receive queue (counted when dropped)
    queued_bytes: int = 0  # bytes of this rank's messages in the receive queue now
    logged: set[str] = field(default_factory=set)


def log_once(s: Stream, kind: str, message: str) -> None:
    """A warning about a stream, once per kind: a misbehaving publisher must not flood the log."""
    if kind not in s.logged:
        s.logged.add(kind)
        log.warning("rank %d (%s): %s (logged once)", s.rank, s.endpoint, message)


class Sequencer:
    """Applies live batches to their stream's residency in sequence order (see the module docstring).

    `lock` guards residency and counters against a concurrent collection; `replay` is None without a
    replay endpoint. Every change a batch makes happens under the lock in one step, except replays,
    which apply batch by batch: each intermediate state is the residency as it was at that seq."""

    def __init__(self, lock: threading.Lock, replay: Replay | None, max_seq_gap: int) -> None:
        self._lock = lock
        self._replay = replay
        self._max_gap = max_seq_gap

    def accept_many(self, s: Stream, batches: list[tuple[int, DecodedBatch]]) -> None:
        """`accept` for each (seq, batch) in order; a run of batches in order is applied in one step
        (Residency.apply_batches, under one lock), the others one by one as `accept` does."""
        run: list[DecodedBatch] = []
        following = s.expected  # the seq that continues the run (None before the first batch: no run)
        for seq, batch in batches:
            if seq == following and s.held is None:
                run.append(batch)
                following = seq + 1
                continue
            if run:
                self._apply_run(s, run, following)
                run = []
            self.accept(s, seq, batch)
            following = s.expected
        if run:
            self._apply_run(s, run, following)

    def _apply_run(self, s: Stream, run: list[DecodedBatch], following: int | None) -> None:
        with self._lock:
            s.residency.apply_batches(run)
        s.expected = following
        s.last_ts = run[-1].ts

    def accept(self, s: Stream, seq: int, batch: DecodedBatch) -> None:
        if seq == s.expected and s.held is None:  # in order (never true before the first batch)
            self._apply_run(s, [batch], seq + 1)
            return
        if seq > MAX_SEQ:
            self._reject(s, seq, "impossible")
            return
        expected = s.expected
        if expected is not None and seq < expected and not batch.ts > s.last_ts:  # NaN ts: not newer
            with self._lock:
                s.repeated += 1
            log_once(s, "repeated", f"skipping a batch whose seq {seq} was already applied (expected "
                           f"{expected}) and that is not newer than the last one")
            return
        held, s.held = s.held, None
        if held is not None and seq == held[0] + 1:
            self._apply_out_of_order(s, held[0], held[1])  # a confirmed jump: an ordinary gap
            self._apply_out_of_order(s, seq, batch)  # now in order
            return
        if held is not None and seq == held[0] and batch.ts == held[1].ts:
            self._apply_out_of_order(s, held[0], held[1])  # the same batch sent again confirms it too,
            self.accept(s, seq, batch)  # and is then an ordinary repeat
            return
        if held is not None:
            self._reject(s, held[0], "unconfirmed jump")
        if expected is not None and seq - expected > self._max_gap:
            s.held = (seq, batch)
            return
        self._apply_out_of_order(s, seq, batch)

    def _reject(self, s: Stream, seq: int, why: str) -> None:
        with self._lock:
            s.rejected += 1
        log_once(s, "rejected", f"skipping a batch with seq {seq} ({why}; expected {s.expected})")

    def _apply_out_of_order(self, s: Stream, seq: int, batch: DecodedBatch) -> None:
        """First batch, gap or restart: replay what is missing, apply it in order, then `batch`."""
        expected = s.expected
        first = expected is None
        restart = expected is not None and seq < expected
        start = expected if expected is not None and not restart else 0
        if restart:
            with self._lock:
                s.residency.restart()
            log_once(s, "restart", f"publisher restarted (seq {seq} after {expected})")
        _, missing = self._fill(s, start, seq, complete_if_whole=first or restart)
        with self._lock:  # a collection that sees the restart counted sees the batch that showed it applied
            if restart:
                s.restarts += 1
            if not first:  # a late joiner's earlier batches were never ours to lose
                s.dropped += seq - start
                s.missed += missing
            s.residency.apply(batch.events, batch.unknown_events, batch.gpu_stores_only)
        s.expected = seq + 1
        s.last_ts = batch.ts
        if missing and not first:
            log_once(s, "missed", f"lost {missing} event batch(es) before seq {seq}; resident blocks are an "
                           "estimate until the next AllBlocksCleared or restart")
        elif missing:
            log_once(s, "late", f"joined at seq {seq} without a full replay; residency unknown")

    def _fill(self, s: Stream, start: int, stop: int | None, complete_if_whole: bool) -> tuple[int, int]:
        """Replays start..stop-1 (stop None: to the end of vLLM's buffer) into the residency in order.
        Returns (batches applied, batches missing); sets s.expected past the last one applied when
        stop is None. Residency becomes unknown at the first hole, known at the end when
        `complete_if_whole` and nothing was missing (every batch since seq 0 applied)."""
        position = start
        recovered = missing = 0
        if self._replay is not None and s.replay and (stop is None or stop > start):
            for seq, batch in self._replay(s, start, stop):
                if seq < position or (stop is not None and seq >= stop):
                    continue  # a reply out of order or out of range: nothing to do with it
                if seq - position > self._max_gap:
                    break  # the same bound as on the live stream: not believed, and the rest with it
                with self._lock:
                    if seq > position:  # the buffer no longer reaches back there
                        missing += seq - position
                        s.residency.set_complete(False)
                    s.residency.apply(batch.events, batch.unknown_events, batch.gpu_stores_only)
                    s.replayed += 1
                recovered += 1
                position = seq + 1
                s.last_ts = max(s.last_ts, batch.ts)
        if stop is not None and position < stop:
            missing += stop - position
        with self._lock:
            if missing:
                s.residency.set_complete(False)
            elif complete_if_whole:
                s.residency.set_complete(True)
        if stop is None:
            s.expected = position
        return recovered, missing

    def check_tail(self, s: Stream) -> None:
        """The stream went quiet: ask the replay endpoint for anything after the last batch applied."""
        start = s.expected
        if start is None or s.held is not None or not s.replay or self._replay is None or s.tail_checked == start:
            return
        s.tail_checked = start
        recovered, missing = self._fill(s, start, None, complete_if_whole=False)
        if s.expected is not None and s.expected > start:
            with self._lock:
                s.dropped += s.expected - start
                s.missed += missing
            s.tail_checked = s.expected
            log_once(s, "tail", f"the stream went quiet after losing {s.expected - start} batch(es) "
                           f"(seq {start}..{s.expected - 1}); {recovered} recovered from the replay endpoint")
