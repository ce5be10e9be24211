"""Processes a test starts (the e2e's engines and sidecars): a port to give them, waiting for their HTTP
endpoint, and stopping them: SIGTERM, then SIGKILL if one has not exited in time."""

from __future__ import annotations

import random
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest


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


_TAKEN: set[int] = set()


def free_port() -> int:
    """A port to listen on, free now and below the kernel's ephemeral range. vLLM binds its ports ~15 s
    after it is told them, and meanwhile the sidecar's outgoing connections (to those very ports) take
    ephemeral source ports: a port picked from that range (bind to 0) was once taken so, and vLLM failed
    with "Address already in use"."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.SystemRandom()
    for _ in range(1000):
        port = rng.randrange(10000, max(10001, low))
        if port in _TAKEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _TAKEN.add(port)
        return port
    raise RuntimeError("no free port below the ephemeral range")


def wait_http(url: str, process: subprocess.Popen[bytes], log: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{url}: the process exited ({process.returncode}); log tail:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"{url} not ready after {seconds:.0f} s; log tail:\n{log.read_text()[-3000:]}")
