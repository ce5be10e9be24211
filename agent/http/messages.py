"""HTTP/1.1 requests as kvscope's servers read them, framed and parsed by h11 under kvscope's own bounds, and
the responses they write (RFC 9112).

h11 finds where a request's head and body end, parses the request line and the header fields, checks
Content-Length and Transfer-Encoding, and decodes a chunked body. This module feeds it a connection's
bytes and keeps the policy h11 leaves to its user, so that whatever a peer sends ends in a request or in
an `HttpError` carrying the status to answer with:

- 400: a request line without a version (HTTP/0.9, answered as soon as the line is in), a malformed
  method, target, version or header line, obsolete line folding, a control character or a bare CR in the
  head, a Content-Length that is not one plain decimal number or two that differ, two Host fields,
  Transfer-Encoding together with Content-Length (a request-smuggling shape), a malformed chunk;
- 505: a version other than 1.x;
- 431: a line over MAX_LINE_BYTES, a head over MAX_HEAD_BYTES, more than MAX_HEADERS header (or trailer)
  fields;
- 413: a Content-Length over the body limit (the body is not read), a chunked body as soon as its chunks
  pass the limit;
- 501: a transfer coding other than chunked.

A request with neither Content-Length nor Transfer-Encoding has no body: nothing is ever read "until the
peer closes". An HTTP/1.1 request without Host is served, as kvscope always has (h11 alone refuses it),
and up to MAX_EMPTY_LINES empty lines before a request line are ignored (h11 alone refuses any).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from typing import NamedTuple, NoReturn

import h11

MAX_HEADERS = 100
MAX_HEAD_BYTES = 32 * 1024  # the request line and header fields together, line endings included
MAX_LINE_BYTES = 8 * 1024  # one line of a head, without its line ending
MAX_EMPTY_LINES = 4  # ignored before a request line (RFC 9112 §2.2)
READ_SIZE = 64 * 1024  # bytes asked of the stream at a time

_EMPTY_LINE = re.compile(rb"\r?\n")
_FOLD = re.compile(rb"\n[ \t]")  # a line that continues the one before it: obsolete line folding
_CTL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # controls other than HTAB, CR, LF: h11 places those
_CONTENT_LENGTH = re.compile(rb"\ncontent-length[ \t]*:", re.IGNORECASE)
_LONG_CONTENT_LENGTH = re.compile(rb"\ncontent-length[ \t]*:[ \t]*[0-9]{21,}[ \t]*\r?\n", re.IGNORECASE)
_NO_HOST = "Missing mandatory Host: header"  # h11's refusal of an HTTP/1.1 request without Host
_BAD_LENGTH = "bad Content-Length"  # h11's refusal of a Content-Length that is not 1 to 20 digits
_HOST_STAND_IN = b"Host: \r\n"  # what h11 is shown in its place, and the handler is not
_PROBE_HOST = b"\r\nHost: x\r\n\r\n"  # ends a lone request line as a whole head, for h11 to check it
_DETAIL_CHARS = 200  # of h11's wording (which quotes the peer's bytes) in an answer


class HttpError(Exception):
    """A request answered with `status` and the connection closed: it cannot be read further."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


class PeerGone(Exception):
    """The peer closed the connection before a request was complete (or between requests)."""


@dataclass(frozen=True, slots=True)
class Headers:
    """Header fields by lower-case name; a repeated field keeps each of its values."""

    fields: dict[str, list[str]] = field(default_factory=dict)

    def get(self, name: str, default: str | None = None) -> str | None:
        values = self.fields.get(name.lower())
        return default if values is None else ", ".join(values)

    def get_all(self, name: str) -> list[str]:
        return self.fields.get(name.lower(), [])

    def items(self) -> Iterator[tuple[str, str]]:
        for name, values in self.fields.items():
            for value in values:
                yield name, value


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    target: str
    version: str  # "HTTP/1.0" or "HTTP/1.1"
    headers: Headers
    body: bytes = b""
    client: str = ""  # "host:port" of the peer, for logs

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    @property
    def keep_alive(self) -> bool:
        tokens = {t.strip().lower() for t in (self.headers.get("connection") or "").split(",")}
        if self.version == "HTTP/1.0":
            return "keep-alive" in tokens
        return "close" not in tokens


@dataclass(slots=True)
class Response:
    """What a handler returns. A body that is an iterable of chunks is sent with chunked encoding."""

    status: int
    body: bytes | Iterable[bytes] = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)


def text(status: int, message: str) -> Response:
    return Response(status, (message + "\n").encode())


def reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def response_head(status: int, content_type: str, length: int | None, headers: list[tuple[str, str]],
                  keep_alive: bool, version: str = "HTTP/1.1", server: str = "kvscope") -> bytes:
    """The status line and header fields of a response; `length` None is a stream (chunked to HTTP/1.1,
    ended by closing the connection to HTTP/1.0)."""
    lines = [f"HTTP/1.1 {status} {reason(status)}", f"Server: {server}", f"Date: {formatdate(usegmt=True)}",
             f"Content-Type: {content_type}"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    elif version == "HTTP/1.1":
        lines.append("Transfer-Encoding: chunked")
    lines += [f"{name}: {value}" for name, value in headers]
    if not keep_alive:
        lines.append("Connection: close")
    elif version == "HTTP/1.0":
        lines.append("Connection: keep-alive")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


@dataclass(frozen=True, slots=True)
class Head:
    """A request's line and header fields, checked, and the length of the body that follows."""

    method: str
    target: str
    version: str  # "HTTP/1.0" or "HTTP/1.1"
    headers: Headers
    length: int | None  # the body's Content-Length (0 without one), None for a chunked body


class RequestReader:
    """The requests of one connection, read from its stream. Each request's head and body are framed and
    parsed by a fresh h11 connection, which starts from the bytes that came after the request before.

    A fresh one for each request rather than h11's own request cycle, because kvscope writes its responses
    itself, and keeps an HTTP/1.0 connection open when its client asks to (h11 would close it)."""

    __slots__ = ("_max_body", "_parser", "_stream", "_unread")

    def __init__(self, stream: asyncio.StreamReader, max_body: int) -> None:
        self._stream = stream
        self._max_body = max_body
        self._parser = _new_parser()
        self._unread = b""  # what came after the last request: the start of the next one

    async def read_head(self) -> Head:
        """The next request's line and header fields; its body is left for `read_body`. Raises HttpError
        (the connection cannot be read further) or PeerGone."""
        parser, head = _new_parser(), _HeadBytes()
        data, empty_lines = self._unread, 0
        self._unread = b""
        while True:
            if not head.data:
                data, empty_lines = _skip_empty_lines(data, empty_lines)
            if data and (head.data or data != b"\r"):  # a CR alone may be half an empty line: wait for more
                head.data += data
                parser.receive_data(data)
                parsed = _next_head(parser, head.data)
                if parsed is not None:
                    self._parser = parsed.parser
                    return _checked_head(parsed, head.data, self._max_body)
                head.check_incomplete()
                data = b""
            data += await self._read()

    async def read_body(self) -> bytes:
        """The body of the request `read_head` returned, within the body limit (a chunked body is counted as
        it arrives); trailer fields are read and dropped, and what follows is kept for the next request."""
        body = bytearray()
        while True:
            event = await self._body_event()
            if isinstance(event, h11.EndOfMessage):
                if len(event.headers) > MAX_HEADERS:
                    raise HttpError(431, f"more than {MAX_HEADERS} trailer fields")
                self._unread = self._parser.trailing_data[0]
                return bytes(body)
            body += event.data
            if len(body) > self._max_body:
                raise HttpError(413, f"body over {self._max_body} bytes")

    async def _body_event(self) -> h11.Data | h11.EndOfMessage:
        parser = self._parser
        while True:
            try:
                event = parser.next_event()
            except h11.RemoteProtocolError as err:
                raise HttpError(err.error_status_hint, _detail(err)) from None
            if isinstance(event, h11.Data | h11.EndOfMessage):
                return event
            assert event is h11.NEED_DATA  # in a body, h11 has nothing else to say
            parser.receive_data(await self._read())

    async def _read(self) -> bytes:
        data = await self._stream.read(READ_SIZE)
        if not data:
            raise PeerGone
        return data


class _HeadBytes:
    """A request head's bytes as they arrive (with what came after it in the same reads), and the checks
    that need not wait for its end."""

    __slots__ = ("_scanned", "data")

    def __init__(self) -> None:
        self.data = bytearray()
        self._scanned = 0  # where the first line not yet checked begins

    def check_incomplete(self) -> None:
        """Refuses a head that h11 has not seen the end of, when it cannot become a request: a line over
        MAX_LINE_BYTES, or a request line that is refused alone. An HTTP/0.9 request is one line, and its
        client waits for an answer rather than send a blank line."""
        data, start = self.data, self._scanned
        while (end := data.find(b"\n", start)) != -1:
            if _line_length(data, start, end) > MAX_LINE_BYTES:
                raise HttpError(431, "request head line too long")
            if start == 0:
                _check_request_line(data[:end])
            start = end + 1
        if len(data) - start > MAX_LINE_BYTES:
            raise HttpError(431, "request head line too long")
        self._scanned = start


class _Parsed(NamedTuple):
    parser: h11.Connection  # holds what followed the head: the body, or the next request
    request: h11.Request
    host_added: bool  # the request came without Host, and h11 was shown _HOST_STAND_IN


def _new_parser() -> h11.Connection:
    return h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)


def _skip_empty_lines(data: bytes, skipped: int) -> tuple[bytes, int]:
    """`data` without the empty lines it starts with, MAX_EMPTY_LINES in all for a request (`skipped` so
    far), and the new count. Those beyond are left to h11, which refuses them."""
    if not data.startswith((b"\r", b"\n")):
        return data, skipped
    start = 0
    while skipped < MAX_EMPTY_LINES and (match := _EMPTY_LINE.match(data, start)) is not None:
        start, skipped = match.end(), skipped + 1
    return data[start:], skipped


def _next_head(parser: h11.Connection, received: bytearray) -> _Parsed | None:
    """The request h11 finds in `received` (all it was given for this request), None while the head is
    incomplete."""
    try:
        event = parser.next_event()
    except h11.RemoteProtocolError as err:
        if str(err) == _NO_HOST:
            return _with_host_stand_in(received)
        _refuse(err, _head_of(parser, received))
    if event is h11.NEED_DATA:
        return None
    assert isinstance(event, h11.Request)  # the only other thing h11 finds in a server's first bytes
    return _Parsed(parser, event, host_added=False)


def _with_host_stand_in(received: bytearray) -> _Parsed:
    """The request of a complete HTTP/1.1 head without Host, parsed by h11 with _HOST_STAND_IN after its
    request line."""
    end = received.index(b"\n") + 1
    parser = _new_parser()
    parser.receive_data(bytes(received[:end]) + _HOST_STAND_IN + received[end:])
    parsed = _next_head(parser, received)
    assert parsed is not None and not parsed.host_added  # the same complete head, now with one Host
    return parsed._replace(host_added=True)


def _head_of(parser: h11.Connection, received: bytearray) -> bytearray:
    """The bytes of the head h11 has taken from `received` (nothing when it refused before the head's end)."""
    return received[: len(received) - len(parser.trailing_data[0])]


def _refuse(err: h11.RemoteProtocolError, head: bytearray) -> NoReturn:
    """Answers a head h11 refused: kvscope's bounds come first (431); a length too long to be a number is a
    body over the limit (413); a transfer coding beside a Content-Length is a smuggling shape (400) before it
    is a coding not supported (501); otherwise the status h11 suggests."""
    _check_size(head)
    if str(err) == _BAD_LENGTH and _LONG_CONTENT_LENGTH.search(head):
        raise HttpError(413, "body over the limit (a Content-Length of more than 20 digits)")
    if err.error_status_hint == 501 and _CONTENT_LENGTH.search(head):
        raise HttpError(400, "Transfer-Encoding and Content-Length together")
    raise HttpError(err.error_status_hint, _detail(err))


def _check_size(head: bytes | bytearray) -> None:
    if len(head) > MAX_HEAD_BYTES:
        raise HttpError(431, f"request head over {MAX_HEAD_BYTES} bytes")
    if len(head) > MAX_LINE_BYTES and _longest_line(head) > MAX_LINE_BYTES:
        raise HttpError(431, "request head line too long")


def _longest_line(data: bytes | bytearray) -> int:
    """The length of the longest line of `data` that ends in LF, without its line ending."""
    longest, start = 0, 0
    while (end := data.find(b"\n", start)) != -1:
        longest, start = max(longest, _line_length(data, start, end)), end + 1
    return longest


def _line_length(data: bytes | bytearray, start: int, end: int) -> int:
    """The length of the line from `start` to its LF at `end`, without a CR before the LF."""
    return end - start - (end > start and data[end - 1] == 0x0D)


def _check_request_line(line: bytes | bytearray) -> None:
    """Refuses a request line that h11 refuses when it is shown the line as a whole head, or whose version
    is not 1.x."""
    probe = _new_parser()
    probe.receive_data(bytes(line.removesuffix(b"\r")) + _PROBE_HOST)
    try:
        event = probe.next_event()
    except h11.RemoteProtocolError as err:
        raise HttpError(err.error_status_hint, _detail(err)) from None
    assert isinstance(event, h11.Request)  # a whole head was given
    _check_version(event.http_version)


def _check_version(version: bytes) -> None:
    if not version.startswith(b"1."):
        raise HttpError(505, "only HTTP/1.0 and HTTP/1.1 are served")


def _checked_head(parsed: _Parsed, received: bytearray, max_body: int) -> Head:
    """The head h11 parsed, held to the bounds and refusals h11 leaves to its user."""
    head = _head_of(parsed.parser, received)
    _check_size(head)
    if _FOLD.search(head):
        raise HttpError(400, "obsolete line folding in a header")
    if _CTL.search(head):
        raise HttpError(400, "control character in a header value")
    request = parsed.request
    _check_version(request.http_version)
    fields = request.headers.raw_items()[1 if parsed.host_added else 0:]  # without the stand-in, first
    if len(fields) > MAX_HEADERS:
        raise HttpError(431, f"more than {MAX_HEADERS} header fields")
    headers = _headers(fields)
    version = "HTTP/1.0" if request.http_version == b"1.0" else "HTTP/1.1"
    return Head(request.method.decode("ascii"), request.target.decode("ascii"), version, headers,
                _body_length(headers, max_body))


def _headers(fields: Iterable[tuple[bytes, bytes]]) -> Headers:
    by_name: dict[str, list[str]] = {}
    for name, value in fields:
        by_name.setdefault(name.decode("ascii").lower(), []).append(value.decode("latin-1"))
    return Headers(by_name)


def _body_length(headers: Headers, limit: int) -> int | None:
    """The body's length from Content-Length (0 when absent), or None for a chunked body. h11 has checked
    each field: one Content-Length of at most 20 digits, Transfer-Encoding only chunked."""
    lengths = headers.get_all("content-length")
    if headers.get_all("transfer-encoding"):
        if lengths:
            raise HttpError(400, "Transfer-Encoding and Content-Length together")
        return None
    length = int(lengths[0]) if lengths else 0
    if length > limit:
        raise HttpError(413, f"body over {limit} bytes")
    return length


def _detail(err: h11.RemoteProtocolError) -> str:
    return str(err)[:_DETAIL_CHARS]
