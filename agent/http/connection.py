"""One connection of agent/http/server.py, from its TLS handshake to its close.

It runs on the server's event loop and never blocks it: the handshake, the request head and body (read
by agent/http/messages.py's RequestReader: h11 frames and parses them) are awaited with the server's
timeouts; the handler runs on the server's worker pool (or where the server's `run_app` puts it); bcrypt
on the auth thread; each write must drain within `write_timeout`. While it waits for its peer the
connection is marked waiting, so that the server may close it to make room for a newcomer; while a request
is being handled or answered it is busy and is not closed for anyone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from kvscope.agent.http.basic_auth import Verdict
from kvscope.agent.http.messages import (
    Head,
    Headers,
    HttpError,
    PeerGone,
    Request,
    RequestReader,
    Response,
    response_head,
)
from kvscope.agent.http.webconfig import WebConfig

if TYPE_CHECKING:
    from kvscope.agent.http.server import HttpServer

log = logging.getLogger("kvscope.http")

LINGER_SECONDS = 1.0  # after refusing a request, read and drop what the peer still sends, this long at most
LINGER_BYTES = 1 << 20
WHOLE_WRITE = 64 * 1024  # a body under this goes out in one write with its head


class Connection:
    __slots__ = ("busy", "peer", "reader", "requests", "server", "writer")

    def __init__(self, server: HttpServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.reader, self.writer = reader, writer
        self.requests = RequestReader(reader, server.max_body_bytes)  # h11 frames and parses what the peer sends
        self.busy = False  # a request is being handled or answered: not to be closed for a newcomer
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

    def abort(self) -> None:
        self.writer.transport.abort()

    def close(self) -> None:
        """Closes after what was written has gone out; a peer that does not read gets `write_timeout`."""
        self.writer.close()
        asyncio.get_running_loop().call_later(self.server.limits.write_timeout, self.writer.transport.abort)

    async def converse(self) -> None:
        """Serves requests until the peer or a timeout ends the connection, or a response closes it."""
        server, limits = self.server, self.server.limits
        web = server.web  # a reload applies to connections accepted after it
        if web.tls is not None:
            async with asyncio.timeout(limits.handshake_timeout):
                await self.writer.start_tls(web.tls, ssl_handshake_timeout=limits.handshake_timeout)
        wait = limits.read_timeout
        while True:
            server.waiting(self)
            try:
                async with asyncio.timeout(wait):
                    head = await self.requests.read_head()
            except (TimeoutError, PeerGone):
                return
            except HttpError as err:
                await self.refuse(err.status, err.detail)
                return
            request = await self._read_request(web, head)
            if request is None:
                return
            self.busy = True
            response = await self._handle(request)
            keep_alive = request.keep_alive and not server.stopping()
            if not await self._send(request, response, keep_alive):
                return
            wait = limits.idle_timeout

    async def _read_request(self, web: WebConfig, head: Head) -> Request | None:
        """The whole request, or None when it was answered here (refused) or the peer left. Credentials are
        checked before the body is read."""
        expect = head.headers.get("expect")
        if expect is not None and (expect.strip().lower() != "100-continue" or head.version != "HTTP/1.1"):
            await self.refuse(417, f"expectation {expect[:40]!r} not supported")
            return None
        if web.auth is not None:
            verdict = await self._authorise(web, head.headers)
            if verdict is Verdict.DENY:
                await self.refuse(401, "unauthorized", [("WWW-Authenticate", 'Basic realm="kvscope"')])
                return None
            if verdict is Verdict.BUSY:
                await self.refuse(503, "too many password checks in flight, retry", [("Retry-After", "1")])
                return None
        if expect is not None and head.length != 0:
            self.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        try:
            async with asyncio.timeout(self.server.limits.read_timeout):
                body = await self.requests.read_body()
        except HttpError as err:
            await self.refuse(err.status, err.detail)
            return None
        except (TimeoutError, PeerGone):
            return None
        return Request(head.method, head.target, head.version, head.headers, body, self.peer)

    async def _authorise(self, web: WebConfig, headers: Headers) -> Verdict:
        auth = web.auth
        assert auth is not None
        credentials = auth.credentials(headers.get("authorization"))
        if credentials is None:
            return Verdict.DENY
        cached = auth.cached(credentials)
        if cached is not None:
            return cached
        return await asyncio.wrap_future(auth.verify(credentials))  # waits on the auth thread, not a worker

    async def _handle(self, request: Request) -> Response:
        server = self.server
        try:
            return await server.run_app(request)
        except Exception:
            log.warning("%s: %s %s failed", server.name, request.method, request.path, exc_info=True)
            return Response(500, b"internal error\n")

    async def refuse(self, status: int, detail: str, headers: list[tuple[str, str]] | None = None) -> None:
        """Answers `status` and ends the connection: what the peer still sends is read and dropped for a moment
        first (a "lingering close"), so that it sees the answer rather than a reset."""
        server = self.server
        server.count_refusal(status)
        log.debug("%s: %s: %d %s", server.name, self.peer, status, detail)
        body = detail.encode() + b"\n"
        self.writer.write(response_head(status, "text/plain; charset=utf-8", len(body), headers or [], False,
                                        server=server.server_header) + body)
        await self._drain()
        if self.writer.can_write_eof():
            self.writer.write_eof()
        try:
            async with asyncio.timeout(LINGER_SECONDS):
                dropped = 0
                while dropped < LINGER_BYTES:
                    data = await self.reader.read(64 * 1024)
                    if not data:
                        break
                    dropped += len(data)
        except (TimeoutError, ConnectionError):
            pass

    async def _drain(self) -> None:
        async with asyncio.timeout(self.server.limits.write_timeout):
            await self.writer.drain()

    async def _send(self, request: Request, response: Response, keep_alive: bool) -> bool:
        """Writes the response; returns whether the connection stays open."""
        writer, body, header = self.writer, response.body, self.server.server_header
        head_only = request.method == "HEAD"
        if isinstance(body, bytes | bytearray):
            head = response_head(response.status, response.content_type, len(body), response.headers, keep_alive,
                                 request.version, header)
            if head_only:
                writer.write(head)
            elif len(body) < WHOLE_WRITE:
                writer.write(head + body)
            else:
                writer.write(head)
                writer.write(body)
            await self._drain()
            return keep_alive
        # A stream: chunked to HTTP/1.1, delimited by closing the connection to HTTP/1.0.
        chunked = request.version == "HTTP/1.1"
        keep_alive = keep_alive and chunked
        writer.write(response_head(response.status, response.content_type, None, response.headers, keep_alive,
                                   request.version, header))
        if head_only:
            _close_iterator(body)
        else:
            await self._stream(iter(body), chunked)
        await self._drain()
        return keep_alive

    async def _stream(self, chunks: Iterator[bytes], chunked: bool) -> None:
        """Each chunk is taken from the iterator on a worker (it may wait, e.g. for the next token)."""
        loop = asyncio.get_running_loop()
        try:
            while (chunk := await loop.run_in_executor(self.server.pool, next, chunks, None)) is not None:
                if chunk:
                    self.writer.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
                    await self._drain()
            if chunked:
                self.writer.write(b"0\r\n\r\n")
        finally:
            _close_iterator(chunks)


def _close_iterator(body: Iterable[bytes]) -> None:
    close = getattr(body, "close", None)
    if close is not None:
        with contextlib.suppress(ValueError):  # still running on a worker (the server is stopping): it ends there
            close()
