"""Write-behind for the file tiers: a block going down to G3/G4 is copied into a host buffer of this
writer's own and written by a background thread, as vLLM's offload stores are asynchronous, so the
device loop does not wait for the disk. When every buffer is busy the store waits for one
(backpressure): the wait releases the store's lock, so the writer can land what it wrote and free its
buffer.

The writer owns its buffers, its block-file handles and the queue; the store owns residency: each
finished write is handed to the store's `landed` callback under the store's lock, where the block
becomes findable in its tier.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

import numpy as np

from kvscope.agent.core.tiers import Tier
from kvscope.agent.tools.reference.blockfile import BlockFiles
from kvscope.agent.tools.reference.blocks import BlockId
from kvscope.agent.tools.reference.pools import MemoryPool

log = logging.getLogger("kvscope.reference.store")

# (tier written, block, bytes written (0: the write failed), seconds, clock() at the start)
Landed = Callable[[Tier, BlockId, int, float, float], None]


class WriteBehind:
    """`slots` host buffers and one writer thread (none when `slots` is 0 or there is no file tier)."""

    def __init__(self, slots: int, block_bytes: int, block_tokens: int, files: dict[Tier, BlockFiles],
                 clock: Callable[[], float], lock: threading.RLock, landed: Landed) -> None:
        self._block_bytes, self._block_tokens = block_bytes, block_tokens
        self._clock, self._lock, self._landed = clock, lock, landed
        # pre-faulted like G1 and G2: a first touch copies at a tenth of the speed, and the copy into a buffer
        # is on the request's path (the store's offload time)
        self._pool = MemoryPool(slots if files else 0, block_bytes)
        self._files = {t: BlockFiles(f.directory, f.direct) for t, f in files.items()}  # own I/O buffers
        self._queue: queue.Queue[tuple[Tier, BlockId, int] | None] = queue.Queue()
        self._pending: set[tuple[Tier, int]] = set()
        self._freed = threading.Condition(lock)  # a buffer came free (waited on with the store's lock)
        self._thread: threading.Thread | None = None
        if slots > 0 and files:
            self._thread = threading.Thread(target=self._run, name="kv-write-behind", daemon=True)
            self._thread.start()

    def pending(self, tier: Tier, key: int) -> bool:
        """A write of `key` to `tier` is queued or under way."""
        return (tier, key) in self._pending

    def buffer(self, wait: bool = False) -> tuple[int, np.ndarray] | None:
        """A free buffer (slot, block-sized view) to copy a block into for `submit`; None: write inline
        (no writer, or every buffer busy and `wait` is False). Call with the store's lock held: waiting
        releases it until the writer frees a buffer."""
        if self._thread is None:
            return None
        slot = self._pool.allocate()
        while slot is None and wait:
            self._freed.wait()
            slot = self._pool.allocate()
        return None if slot is None else (slot, self._pool.block(slot))

    def submit(self, dst: Tier, b: BlockId, slot: int) -> None:
        self._pending.add((dst, b.key))
        self._queue.put((dst, b, slot))

    def flush(self) -> None:
        """Waits until every queued write has landed."""
        self._queue.join()

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=60)

    def _run(self) -> None:
        while (job := self._queue.get()) is not None:
            dst, b, slot = job
            t0 = self._clock()
            try:
                written = self._files[dst].write(b.key, self._pool.slot(slot), self._block_bytes, self._block_tokens)
            except OSError as exc:
                log.warning("%s: cannot write block %016x: %s", dst, b.key, exc)
                written = 0
            seconds = self._clock() - t0
            with self._lock:
                self._pool.free(slot)
                self._freed.notify_all()
                self._pending.discard((dst, b.key))
                self._landed(dst, b, written, seconds, t0)
            self._queue.task_done()
        self._queue.task_done()
