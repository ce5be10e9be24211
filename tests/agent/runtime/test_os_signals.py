"""agent/runtime/os_signals.py: signals reach the main thread through a pipe, with no lock taken in a handler."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from testkit.paths import ROOT

_CHILD = """
import os, signal, sys, threading
from kvscope.agent.runtime.os_signals import SignalWaiter
waiter = SignalWaiter((signal.SIGHUP, signal.SIGTERM))
busy = threading.Event()
print("ready", flush=True)
seen = []
while signal.SIGTERM not in seen:
    for _ in range(1000):  # an Event's lock taken and released over and over, as the agent's threads do
        busy.set(); busy.clear(); busy.wait(0)
    seen += waiter.wait()
print(" ".join(s.name for s in seen), flush=True)
waiter.close()
"""


def test_signals_come_in_order_and_a_burst_of_them_never_wedges_the_main_thread() -> None:
    child = subprocess.Popen([sys.executable, "-c", _CHILD], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        for _ in range(300):
            os.kill(child.pid, signal.SIGHUP)
        time.sleep(0.2)
        os.kill(child.pid, signal.SIGTERM)
        out, _ = child.communicate(timeout=20)
    finally:
        if child.poll() is None:
            child.kill()
    names = out.split()
    assert child.returncode == 0 and names[-1] == "SIGTERM"
    assert set(names[:-1]) == {"SIGHUP"}  # (the kernel merges SIGHUPs that are pending together)
