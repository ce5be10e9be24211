"""Test helpers for the engine adapters: real HTTP servers on 127.0.0.1 serving fixture pages, and readings as
a dict. The pages are served byte for byte, with the Content-Type prometheus_client and Rust engines send."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvscope.agent.core.readings import HistogramSample, Reading, Sample
from testkit.paths import FIXTURES

Readings = dict[tuple[str, tuple[str, ...]], Reading]


class PageServer:
    """A ThreadingHTTPServer whose routes (path → body) can change while it runs; 404 elsewhere."""

    def __init__(self, routes: dict[str, bytes]) -> None:
        self.routes = dict(routes)
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = server.routes.get(self.path.split("?", 1)[0])
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(body or b"")

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def url(self, path: str = "/metrics") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> PageServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@contextlib.contextmanager
def serving(*bodies: bytes) -> Iterator[list[PageServer]]:
    """One server per body, each serving it at /metrics."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(PageServer({"/metrics": body})) for body in bodies]


def page(folder: str, name: str) -> bytes:
    return (FIXTURES / folder / name).read_bytes()


def as_dict(readings: list[Reading]) -> Readings:
    return {(r.name, r.labels): r for r in readings}


def value(readings: Readings, name: str, *labels: str) -> float:
    reading = readings[(name, labels)]
    assert isinstance(reading, Sample)
    return reading.value


def histogram(readings: Readings, name: str, *labels: str) -> HistogramSample:
    reading = readings[(name, labels)]
    assert isinstance(reading, HistogramSample)
    return reading


def series(readings: Readings, name: str) -> set[tuple[str, ...]]:
    return {labels for n, labels in readings if n == name}


def fixture_module(folder: str) -> Any:
    """A fixture folder's make_pages.py, whose input values the tests take their expected numbers from."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{folder}_pages", FIXTURES / folder / "make_pages.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def canonical(text: str) -> str:
    """An exposition with the sample lines of each family sorted: the exporter orders series by their label
    values, which carry loopback ports that differ between runs."""
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("# HELP") or not blocks:
            blocks.append([])
        blocks[-1].append(line)
    return "".join("\n".join([*(b for b in block if b.startswith("#")),
                              *sorted(b for b in block if not b.startswith("#"))]) + "\n" for block in blocks)


def exposition(specs: dict[str, Any], collectors: dict[str, Any], urls: dict[str, str]) -> str:
    """The agent's own exposition after each collector ran once into a store of `specs`, with the loopback
    URLs replaced by names (`urls`: url → name) and each family's lines sorted (canonical)."""
    from kvscope.agent.app.wiring import build_catalogue
    from kvscope.agent.core.pipeline import Components
    from kvscope.agent.core.store import Store
    from kvscope.exporters.prometheus.exposition import TextRenderer

    store = Store(build_catalogue(Components(specs, {})))
    for name, collector in collectors.items():
        store.ingest(name, collector.collect(), now=1.0)
    text = TextRenderer(store).render().decode()
    for url, name in urls.items():
        text = text.replace(url, f"http://{name}/metrics")
    return canonical(text)


def assert_golden(path: Path, text: str) -> None:
    """Compares with a golden file; KVSCOPE_REGEN_GOLDEN=1 rewrites it (then read the diff)."""
    import os

    if os.environ.get("KVSCOPE_REGEN_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{path.name} differs; KVSCOPE_REGEN_GOLDEN=1 rewrites it"
