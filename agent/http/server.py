"""The HTTP server every kvscope endpoint runs on (/metrics, the OTLP receiver, the reference engine).

Built so that no peer can silence it:

- **One event-loop thread per server** owns the listening socket and every connection. Waiting for a
  peer (the TLS handshake, a request head, a body, a keep-alive pause) costs a socket and a little
  memory, never a thread, and never delays `accept` or another connection.
- **TLS per connection**: the listening socket stays plain; each accepted connection runs its own
  handshake, bounded by `handshake_timeout`. A web config reloaded on SIGHUP applies to the connections
  accepted after it.
- **Bounded everything**: at most `max_connections` open connections; a new one beyond that takes the
  place of the connection that has waited longest for its peer (idle, handshaking or sending slowly), and
  is refused only when all of them are being served. Handlers run on `workers` threads. A request head
  must arrive within `read_timeout` of connecting (or `idle_timeout` between keep-alive requests), its
  body within `read_timeout`, and each write must drain within `write_timeout`. Heads and bodies are limited
  in size (agent/http/messages.py). The listen backlog is `backlog`.
- **Malformed requests are answered, not logged as tracebacks**: requests are framed and parsed by h11,
  under kvscope's bounds (agent/http/messages.py); what they refuse is answered with its status, then a
  bounded "lingering close" so the peer reads the answer before the connection goes.
- **Basic auth before the body is read**, through agent/http/basic_auth.py: cached credentials cost a
  dictionary lookup; bcrypt runs on its own thread, bounded, so guessing clients never hold a worker.

This module is the listener (accept, admission, start and stop); agent/http/connection.py is what one
connection does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kvscope.agent.config.binding import ConfigError
from kvscope.agent.http.connection import Connection
from kvscope.agent.http.messages import PeerGone, Request, Response
from kvscope.agent.http.webconfig import WebConfig

log = logging.getLogger("kvscope.http")

STREAM_LIMIT = 8 * 1024  # the stream reader's limit: it stops reading the socket past twice this, until read
ACCEPT_BATCH = 16  # connections accepted per wake-up of the loop
LOG_EVERY = 60.0  # seconds between two log lines of the same kind of trouble

App = Callable[[Request], Response]
RunApp = Callable[[Request], Awaitable[Response]]  # runs the app for one request (on the event loop's thread)


@dataclass
class HttpLimits:
    """Bounds of one HTTP server (a table of the /metrics and OTLP receiver configuration: `http`)."""

    max_connections: int = 128  # open connections; beyond, the one waiting longest for its peer is closed
    workers: int = 4  # threads that run request handlers
    backlog: int = 1024  # the listen queue (the kernel caps it at net.core.somaxconn)
    handshake_timeout: float = 5.0  # seconds for a TLS handshake
    read_timeout: float = 10.0  # seconds for a request's head (after connecting) and for its body
    idle_timeout: float = 120.0  # seconds a keep-alive connection may wait for its next request
    write_timeout: float = 10.0  # seconds for each write of a response to drain to the peer

    def validate(self, path: str) -> None:
        for name in ("max_connections", "workers", "backlog"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{path}.{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("handshake_timeout", "read_timeout", "idle_timeout", "write_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{path}.{name}: must be > 0, got {getattr(self, name)}")


def bind(host: str, port: int, backlog: int) -> socket.socket:
    """A listening TCP socket on host:port (IPv4 or IPv6, as the host resolves)."""
    family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    return socket.create_server((host, port), family=family, backlog=backlog)


# why the server answered a request itself, by the status it answered; anything else is a bad_request
# (400, and 417, 501, 505: a request this server does not serve)
_REASON_BY_STATUS = {401: "unauthorized", 503: "unauthorized", 413: "too_large", 431: "too_large"}
REFUSAL_REASONS = ("bad_request", "unauthorized", "too_large")  # what `refused` is called with
DROP_REASONS = ("evicted", "full")  # what `dropped` is called with (see `_make_room`)


def refusal_reason(status: int) -> str:
    """bad_request, unauthorized (basic auth refused, or not checked: 503, too many password checks in
    flight) or too_large (413 body, 431 head), for owners that count refusals."""
    return _REASON_BY_STATUS.get(status, "bad_request")


class HttpServer:
    """Serves `app` (called on a worker thread with each whole request) on host:port. The socket is bound here,
    so a busy port raises OSError at once; `start()` serves it from a daemon thread, `stop()` closes every
    connection. `refused` is called with the reason (`refusal_reason`) of each request the server answered
    itself, and `dropped` with "evicted" or "full" for each connection it closed to make room or could not
    take (see `_make_room`), for owners that count them. `run_app`, if given, runs the app instead of the
    worker pool (the /metrics server hands a scrape to the scheduler's thread, agent/runtime/scheduler.py)."""

    def __init__(self, name: str, host: str, port: int, app: App, *, limits: HttpLimits | None = None,
                 web: WebConfig | None = None, max_body_bytes: int = 64 * 1024, server_header: str = "kvscope",
                 refused: Callable[[str], None] | None = None, dropped: Callable[[str], None] | None = None,
                 run_app: RunApp | None = None) -> None:
        self.name = name
        self.limits = limits or HttpLimits()
        self.web = web or WebConfig()
        self.max_body_bytes = max_body_bytes
        self.evicted = 0  # connections closed to make room for a new one
        self.turned_away = 0  # connections closed at once: every slot was serving a request
        self._sock = bind(host, port, self.limits.backlog)
        self.app = app
        self.server_header = server_header
        self.pool = ThreadPoolExecutor(self.limits.workers, thread_name_prefix=f"{name}-worker")
        self.run_app: RunApp = run_app or self._on_pool
        self._refused = refused
        self._dropped = dropped
        self._conns: OrderedDict[Connection, None] = OrderedDict()  # the longest waiting first
        self._starting = 0  # accepted sockets whose connection is being set up
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._logged: dict[str, float] = {}

    def _on_pool(self, request: Request) -> Awaitable[Response]:
        return asyncio.get_running_loop().run_in_executor(self.pool, self.app, request)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    @property
    def port(self) -> int:
        return self.address[1]

    def connections(self) -> int:
        return len(self._conns)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"http-{self.name}", daemon=True)
        self._thread.start()
        self._ready.wait(10.0)

    def stop(self, timeout: float = 5.0) -> None:
        loop, stopping, thread = self._loop, self._stopping, self._thread
        if loop is not None and stopping is not None and thread is not None and thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(stopping.set)
            thread.join(timeout)
        self._sock.close()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.web.close()

    def stopping(self) -> bool:
        return self._stopping is not None and self._stopping.is_set()

    def count_refusal(self, status: int) -> None:
        """A request answered by the server itself (malformed, too large, unauthorized), for its owner's counts."""
        if self._refused is not None:
            self._refused(refusal_reason(status))

    def reload(self, web: WebConfig) -> None:
        """Serves new connections with `web` (TLS context and users); connections already open keep theirs."""
        old, self.web = self.web, web
        old.close()

    # -- the loop thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(self._loop_error)
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        finally:
            loop.close()

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._sock.setblocking(False)
        loop.add_reader(self._sock, self._on_accept)
        self._ready.set()
        try:
            await self._stopping.wait()
        finally:
            loop.remove_reader(self._sock)
            for conn in list(self._conns):
                conn.abort()
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

    def _on_accept(self) -> None:
        """Accepts what is pending, a few at a time. Room is made (or the newcomer closed) before the next
        accept, so the open sockets never outgrow max_connections, whatever the burst: file descriptors are
        shared with every collector of the agent."""
        loop = asyncio.get_running_loop()
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:  # out of file descriptors or memory: back off, as asyncio's own servers do
                self._note("accept", f"accept() failed: {exc}; accepting again in 1 s")
                loop.remove_reader(self._sock)
                loop.call_later(1.0, loop.add_reader, self._sock, self._on_accept)
                return
            if not self._make_room():
                sock.close()
                continue
            self._starting += 1
            sock.setblocking(False)
            task = loop.create_task(self._connect(sock))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _connect(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()

        def protocol() -> asyncio.StreamReaderProtocol:
            return asyncio.StreamReaderProtocol(asyncio.StreamReader(STREAM_LIMIT), self._accepted)

        try:
            await loop.connect_accepted_socket(protocol, sock)
        except OSError:
            self._starting -= 1
            sock.close()

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError):  # a socket error asyncio could only report: not a bug of ours
            self._note("loop", f"{context.get('message', 'error')}: {exc}")
        else:
            log.warning("%s: %s", self.name, context.get("message"), exc_info=exc)

    def _note(self, kind: str, message: str) -> None:
        """A warning at most once per LOG_EVERY seconds per kind: trouble a peer causes must not flood the log."""
        now = time.monotonic()
        if now - self._logged.get(kind, -LOG_EVERY) >= LOG_EVERY:
            self._logged[kind] = now
            log.warning("%s: %s (logged at most once a minute)", self.name, message)

    def _make_room(self) -> bool:
        """Whether a new connection may open: when all max_connections are taken, the one that has waited
        longest for its peer is closed; when every one is serving a request, the newcomer is refused."""
        if len(self._conns) + self._starting < self.limits.max_connections:
            return True
        waiting = next((c for c in self._conns if not c.busy), None)
        if waiting is None:
            self.turned_away += 1
            if self._dropped is not None:
                self._dropped("full")
            self._note("full", f"{self.limits.max_connections} connections, all serving requests: "
                               "refusing new connections")
            return False
        del self._conns[waiting]
        waiting.abort()
        self.evicted += 1
        if self._dropped is not None:
            self._dropped("evicted")
        self._note("evict", f"{self.limits.max_connections} connections open: closing the ones that "
                            "waited longest for their peer to make room")
        return True

    def waiting(self, conn: Connection) -> None:
        """`conn` waits for its peer from now on: the last in line to be closed for a newcomer."""
        conn.busy = False
        if conn in self._conns:
            self._conns.move_to_end(conn)

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection(self, reader, writer)
        self._starting -= 1
        self._conns[conn] = None
        clean = False
        try:
            await conn.converse()
            clean = True
        except (PeerGone, OSError, asyncio.IncompleteReadError) as exc:  # resets, timeouts, TLS errors
            log.debug("%s: %s: connection ended: %r", self.name, conn.peer, exc)
        except asyncio.CancelledError:  # the server is stopping; the task ends here, quietly
            pass
        except Exception:
            log.warning("%s: connection from %s failed", self.name, conn.peer, exc_info=True)
        finally:
            self._conns.pop(conn, None)
            if clean:
                conn.close()
            else:
                conn.abort()
