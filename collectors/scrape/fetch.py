"""One HTTP GET of a metrics page with a deadline on the whole request: connect, headers and body.

A socket timeout bounds each read, not the request: a server that sends one byte a second never trips
it, however long its page. Here a timer shuts the connection down when the deadline passes, which ends
any read blocked on it at once, wherever it is (status line, headers, chunk sizes, body). The body is
read in bounded chunks and refused past `max_bytes`.

The page also says whether HTTP's own framing (a Content-Length that was met, or chunked encoding that
reached its last chunk) vouches that the body is whole: then a missing final newline does not mean the
text was cut off. Pure I/O; the caller parses. `ParallelScrape` fetches a collector's targets at once.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait

from kvscope import __version__


class ScrapeError(Exception):
    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


class Page(bytes):
    """A response body, as bytes, that also says whether HTTP's framing (a Content-Length that was met,
    chunked encoding that reached its last chunk) vouches that it is whole. A fetcher may return plain
    bytes: then nothing vouches for it."""

    framed: bool

    def __new__(cls, body: bytes, framed: bool = False) -> Page:
        page = super().__new__(cls, body)
        page.framed = framed
        return page


def is_whole(body: bytes) -> bool:
    return isinstance(body, Page) and body.framed


Fetcher = Callable[[str, float, int], bytes]  # (url, timeout, max bytes) -> body, or ScrapeError
CHUNK = 65536
# How long ParallelScrape waits past the per-target deadline for the answers: http_fetch ends itself at
# its deadline, so this only covers thread scheduling (and a fetcher that overruns is a timeout).
GRACE_SECONDS = 0.25


class ParallelScrape:
    """Fetches every URL at once, each on a daemon thread of its own (a resolver stuck on a name must not
    hold up the agent's exit) and within its own deadline, so one slow target costs the others nothing.
    A request that outlives its cycle is not sent again until it returns; its answer, too old by then,
    is dropped (the cycle it belonged to counted it as a timeout)."""

    def __init__(self, urls: Sequence[str], fetch: Fetcher, timeout: float, max_bytes: int) -> None:
        self._urls = list(urls)
        self._fetch, self._timeout, self._max_bytes = fetch, timeout, max_bytes
        self._pending: list[Future[bytes] | None] = [None] * len(self._urls)

    def _start(self, url: str) -> Future[bytes]:
        future: Future[bytes] = Future()

        def run() -> None:
            try:
                future.set_result(self._fetch(url, self._timeout, self._max_bytes))
            except BaseException as exc:  # handed to cycle(), which gives it to the target
                future.set_exception(exc)

        threading.Thread(target=run, name="scrape", daemon=True).start()
        return future

    def cycle(self) -> list[bytes | ScrapeError]:
        """One answer per URL, in order: the body, or the ScrapeError that target failed with."""
        started: dict[int, Future[bytes]] = {}
        for i, url in enumerate(self._urls):
            pending = self._pending[i]
            if pending is None or pending.done():
                started[i] = self._pending[i] = self._start(url)
        wait(started.values(), timeout=self._timeout + GRACE_SECONDS)
        out: list[bytes | ScrapeError] = []
        for i in range(len(self._urls)):
            future = started.get(i)
            if future is None or not future.done():
                out.append(ScrapeError("timeout", f"no answer within {self._timeout:g}s (the request is still "
                                                  "running)"))
                continue
            self._pending[i] = None
            try:
                out.append(future.result())
            except ScrapeError as exc:
                out.append(exc)
            except Exception as exc:  # a fetcher must raise ScrapeError; anything else is still the target's
                out.append(ScrapeError("protocol", f"{type(exc).__name__}: {exc}"))
        return out


class _Request:
    """A GET whose connection another thread can shut down (`abort`) to end it wherever it blocks."""

    def __init__(self, url: str, timeout: float) -> None:
        parts = urllib.parse.urlsplit(url)
        path = parts.path or "/"
        self.target = f"{path}?{parts.query}" if parts.query else path
        host, port = parts.hostname or "", parts.port
        if parts.scheme == "https":
            self.conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                host, port, timeout=timeout, context=ssl.create_default_context())
        else:
            self.conn = http.client.HTTPConnection(host, port, timeout=timeout)
        self.aborted = False
        self._lock = threading.Lock()

    def abort(self) -> None:
        with self._lock:
            self.aborted = True
            sock = self.conn.sock
            if sock is not None:
                with contextlib.suppress(OSError):  # the base class's: an SSL socket's own shuts TLS down first
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def connect(self) -> None:
        self.conn.connect()
        with self._lock:
            if self.aborted:  # the deadline passed while connecting: abort() found no socket yet
                raise TimeoutError("the deadline passed while connecting")


MAX_REDIRECTS = 3
REDIRECTS = frozenset({301, 302, 303, 307, 308})


def http_fetch(url: str, timeout: float, max_bytes: int, clock: Callable[[], float] = time.monotonic) -> Page:
    """GET `url`: the page, or ScrapeError(kind). `timeout` bounds the whole request, redirects included
    (at most MAX_REDIRECTS, to http(s) URLs)."""
    deadline = clock() + timeout
    for _ in range(MAX_REDIRECTS + 1):
        remaining = deadline - clock()
        if remaining <= 0:
            raise ScrapeError("timeout", f"no complete answer within {timeout:g}s")
        result = _fetch_once(url, remaining, deadline, max_bytes, clock)
        if isinstance(result, Page):
            return result
        url = result
    raise ScrapeError("http_status", f"more than {MAX_REDIRECTS} redirects")


def _fetch_once(url: str, timeout: float, deadline: float, max_bytes: int,
                clock: Callable[[], float]) -> Page | str:
    """One request: the page, or the URL a redirect points to."""
    request = _Request(url, timeout)
    watchdog = threading.Timer(timeout, request.abort)
    watchdog.daemon = True
    watchdog.start()
    try:
        return _get(request, url, deadline, max_bytes, clock)
    except ScrapeError:
        raise
    except (OSError, http.client.HTTPException, ValueError) as exc:
        if request.aborted:
            raise ScrapeError("timeout", f"no complete answer within the deadline ({exc!r})") from None
        if isinstance(exc, http.client.IncompleteRead):
            raise ScrapeError("truncated", f"connection closed after {len(exc.partial)} bytes of a chunk") from None
        if isinstance(exc, http.client.HTTPException):
            raise ScrapeError("protocol", f"{type(exc).__name__}: {exc}") from None
        if isinstance(exc, TimeoutError):
            raise ScrapeError("timeout", f"no answer within {timeout:g}s") from None
        raise ScrapeError("connect", str(exc) or type(exc).__name__) from None
    finally:
        watchdog.cancel()
        request.conn.close()


def _get(request: _Request, url: str, deadline: float, max_bytes: int, clock: Callable[[], float]) -> Page | str:
    request.connect()
    conn = request.conn
    conn.putrequest("GET", request.target, skip_accept_encoding=True)
    conn.putheader("User-Agent", f"kvscope/{__version__}")
    conn.putheader("Accept", "text/plain;version=0.0.4")
    conn.endheaders()
    response = conn.getresponse()
    location = response.getheader("Location")
    if response.status in REDIRECTS and location:
        target = urllib.parse.urljoin(url, location)
        if urllib.parse.urlsplit(target).scheme not in ("http", "https"):
            raise ScrapeError("http_status", f"HTTP {response.status} to a non-http URL")
        return target
    if response.status != 200:
        raise ScrapeError("http_status", f"HTTP {response.status}")
    framed = response.chunked or response.length is not None
    if response.length is not None and response.length > max_bytes:
        raise ScrapeError("too_large", f"Content-Length {response.length} exceeds max_response_bytes={max_bytes}")
    chunks, size = [], 0
    while True:
        chunk = response.read1(min(CHUNK, max_bytes + 1 - size))
        if request.aborted or clock() > deadline:
            raise TimeoutError("the deadline passed while reading the body")
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            raise ScrapeError("too_large", f"body exceeds max_response_bytes={max_bytes}")
    if response.length:  # read1() does not raise on a body shorter than its Content-Length
        raise ScrapeError("truncated", f"connection closed {response.length} bytes before Content-Length")
    return Page(b"".join(chunks), framed)
