"""Fixture pages that grow like a live engine's: each request of a path serves its page with every sample value
multiplied by how many times that path was asked for. Counters and histograms (buckets, sum and count alike)
stay monotonic and valid, so PromQL rates over them are positive, as they are under load. For engines that cannot
run here (SGLang, LMCache, Dynamo need GPUs): a real HTTP server serving their real text format."""

from __future__ import annotations

import threading

from testkit.engine_pages import PageServer


def scaled(text: str, factor: int) -> bytes:
    """The exposition text with each sample's value multiplied by `factor` (comments and blank lines as they are)."""
    out = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            head, _, number = line.rpartition(" ")
            line = f"{head} {float(number) * factor!r}"
        out.append(line)
    return ("\n".join(out) + "\n").encode()


class GrowingRoutes(dict[str, bytes]):
    """path → page text; `get` serves the page scaled by the path's request count."""

    def __init__(self, pages: dict[str, str]) -> None:
        super().__init__()
        self._pages = pages
        self._asked: dict[str, int] = {}
        self._lock = threading.Lock()

    def get(self, path: str, default: bytes | None = None) -> bytes | None:  # type: ignore[override]
        if path not in self._pages:
            return default
        with self._lock:
            n = self._asked[path] = self._asked.get(path, 0) + 1
        return scaled(self._pages[path], n)


def growing_server(pages: dict[str, str]) -> PageServer:
    """A PageServer (use it as a context manager) serving `pages` (path → text), each growing per request."""
    server = PageServer({})
    server.routes = GrowingRoutes(pages)
    return server
