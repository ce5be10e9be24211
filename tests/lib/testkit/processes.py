"""Stopping a process a test started: SIGTERM, then SIGKILL if it has not exited in time."""

from __future__ import annotations

import subprocess
from typing import Any


def stop(process: subprocess.Popen[Any], grace: float) -> None:
    """Terminates `process` (if still running) and reaps it, killing it after `grace` seconds."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
