"""A real Prometheus (or Alertmanager) for a test: started on loopback, waited for, queried over its HTTP API.

Waits are on conditions (`wait`), never a fixed sleep: a check is retried until it holds or a deadline passes.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from testkit.processes import stop


def get(url: str, timeout: float = 5.0) -> Any:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as response:
        return json.loads(response.read())


def wait(what: str, check: Callable[[], Any], deadline: float, interval: float = 0.5) -> Any:
    """`check()`'s first truthy result; AssertionError naming `what` after `deadline` seconds."""
    end = time.monotonic() + deadline
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline:.0f} s waiting for {what}")
        time.sleep(interval)


@contextmanager
def process(args: list[str], log: Path, ready_url: str) -> Iterator[subprocess.Popen[bytes]]:
    """`args` running until the block ends, once `ready_url` answers; its output in `log`."""
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"{args[0]} exited: {log.read_text()[-2000:]}")
            try:
                urllib.request.build_opener(urllib.request.ProxyHandler({})).open(ready_url, timeout=1).close()
                return True
            except OSError:
                return False

        wait(f"{args[0]} at {ready_url}", ready, 30, 0.05)
        yield proc
    finally:
        stop(proc, grace=10)


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query, at `at` (Unix seconds) or now."""
        params: dict[str, str | float] = {"query": expr} if at is None else {"query": expr, "time": at}
        answer = get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode(params))
        assert answer["status"] == "success", (expr, answer)
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def alerts(self, state: str = "firing") -> set[str]:
        answer = get(f"{self.url}/api/v1/alerts")
        return {a["labels"]["alertname"] for a in answer["data"]["alerts"] if a["state"] == state}
