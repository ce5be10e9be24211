"""Waiting for process signals on the main thread without a lock in the signal handler.

A Python signal handler runs on the main thread between two bytecodes, wherever that thread happens to be,
including inside `threading.Event.wait()` while it holds the event's internal lock. A handler that calls
`event.set()` then waits for a lock its own thread holds: the process never reacts to the signal (seen
once: SIGTERM ignored, the agent killed after 20 s). Here the handler does nothing in Python; CPython's
C-level handler writes the signal's number to a pipe (`signal.set_wakeup_fd`), and the main thread blocks
reading that pipe. No lock is taken, and nothing wakes while no signal comes.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable


def _ignore(_signum: int, _frame: object) -> None:
    """Installed so that the signals do not take their default action (ending the process)."""


class SignalWaiter:
    """Catches `signums` from construction on (call it on the main thread); `wait()` returns them as they come."""

    def __init__(self, signums: Iterable[signal.Signals]) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self._previous = {signum: signal.signal(signum, _ignore) for signum in signums}

    def wait(self) -> list[signal.Signals]:
        """Blocks until at least one of the signals came; returns every one that came, in order."""
        while True:
            came = [signal.Signals(n) for n in os.read(self._read, 256) if n in self._previous]
            if came:
                return came

    def close(self) -> None:
        """Puts back the handlers and the wakeup fd that were in place before."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(self._previous_fd)
        os.close(self._read)
        os.close(self._write)
