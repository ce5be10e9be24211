"""HTTP/1.1 requests and responses as kvscope's servers read and write them (RFC 9112), strictly and bounded.

Whatever a peer sends ends in a request or in an `HttpError` carrying the status to answer with: a
request line without a version (HTTP/0.9) or with a bad method or target is 400, a version other
than 1.x is 505, a head over its byte or line budget is 431, a Content-Length that is not one plain
decimal number is 400 and one over the body limit 413 (the body is not read), Transfer-Encoding
together with Content-Length is 400 (a request-smuggling shape), a transfer coding other than chunked
is 501, and a chunked body is counted against the same limit as it arrives. A request with neither
header has no body: nothing is ever read "until the peer closes".
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus

MAX_HEADERS = 100
MAX_HEAD_BYTES = 32 * 1024  # request line and header fields together (each line also within the reader's limit)
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TARGET = re.compile(rb"[\x21-\x7e]+")  # visible ASCII: no spaces, controls or raw 8-bit bytes
_VERSION = re.compile(rb"HTTP/([0-9])\.([0-9])")
_DIGITS = re.compile(r"[0-9]{1,18}")  # up to 10**18: any larger length is over every limit anyway
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
_CTL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # header values may hold HTAB, never other controls


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


def parse_request_line(line: bytes) -> tuple[str, str, str]:
    """(method, target, version) of a request line without its line ending."""
    parts = line.split(b" ")
    if len(parts) == 2:
        raise HttpError(400, "HTTP/0.9 requests are not served: send HTTP/1.0 or HTTP/1.1")
    if len(parts) != 3:
        raise HttpError(400, "malformed request line")
    method, target, version = parts
    if not _TOKEN.fullmatch(method):
        raise HttpError(400, "malformed method")
    if not _TARGET.fullmatch(target):
        raise HttpError(400, "malformed request target")
    match = _VERSION.fullmatch(version)
    if match is None:
        raise HttpError(400, "malformed HTTP version")
    if match.group(1) != b"1":
        raise HttpError(505, "only HTTP/1.0 and HTTP/1.1 are served")
    return method.decode("ascii"), target.decode("ascii"), "HTTP/1.1" if match.group(2) != b"0" else "HTTP/1.0"


def parse_header_line(line: bytes, into: dict[str, list[str]]) -> None:
    if line[:1] in (b" ", b"\t"):
        raise HttpError(400, "obsolete line folding in a header")
    name, sep, value = line.partition(b":")
    if not sep or not _TOKEN.fullmatch(name):
        raise HttpError(400, "malformed header line")
    value = value.strip(b" \t")
    if _CTL.search(value):
        raise HttpError(400, "control character in a header value")
    into.setdefault(name.decode("ascii").lower(), []).append(value.decode("latin-1"))


def body_length(headers: Headers, limit: int) -> int | None:
    """The body's length from Content-Length (0 when absent), or None for a chunked body."""
    coding = headers.get("transfer-encoding")
    lengths = headers.get_all("content-length")
    if coding is not None:
        if lengths:
            raise HttpError(400, "Transfer-Encoding and Content-Length together")
        if coding.strip().lower() != "chunked":
            raise HttpError(501, f"transfer coding {coding[:40]!r} is not supported (only chunked)")
        return None
    if not lengths:
        return 0
    values = {v.strip() for item in lengths for v in item.split(",")}
    if len(values) != 1:
        raise HttpError(400, "conflicting Content-Length values")
    (value,) = values
    if not _DIGITS.fullmatch(value):
        if value.isascii() and value.isdigit():
            raise HttpError(413, f"body over {limit} bytes")
        raise HttpError(400, f"Content-Length {value[:40]!r} is not a length")
    length = int(value)
    if length > limit:
        raise HttpError(413, f"body over {limit} bytes")
    return length


async def read_line(reader: asyncio.StreamReader) -> bytes:
    """One line without its ending (CRLF, or a bare LF as RFC 9112 allows a server to accept)."""
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise HttpError(431, "request head line too long") from None
    except asyncio.IncompleteReadError:
        raise PeerGone from None
    line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
    if b"\r" in line:
        raise HttpError(400, "bare CR in the request head")
    return line


async def read_head(reader: asyncio.StreamReader) -> tuple[str, str, str, Headers]:
    """The request line and header fields; the reader's limit bounds each line's length, MAX_HEAD_BYTES
    and MAX_HEADERS the whole."""
    line = await read_line(reader)
    for _ in range(4):  # RFC 9112 §2.2: empty lines before a request line are ignored
        if line:
            break
        line = await read_line(reader)
    method, target, version = parse_request_line(line)
    fields: dict[str, list[str]] = {}
    size = len(line)
    for _ in range(MAX_HEADERS + 1):
        line = await read_line(reader)
        if not line:
            return method, target, version, Headers(fields)
        size += len(line)
        if size > MAX_HEAD_BYTES:
            raise HttpError(431, f"request head over {MAX_HEAD_BYTES} bytes")
        parse_header_line(line, fields)
    raise HttpError(431, f"more than {MAX_HEADERS} header fields")


async def read_body(reader: asyncio.StreamReader, length: int | None, limit: int) -> bytes:
    """A body of `length` bytes, or chunked (None) and at most `limit` bytes: see `body_length`."""
    try:
        if length is None:
            return await _read_chunked(reader, limit)
        return await reader.readexactly(length) if length else b""
    except asyncio.IncompleteReadError:
        raise PeerGone from None


async def _read_chunked(reader: asyncio.StreamReader, limit: int) -> bytes:
    body = bytearray()
    while True:
        size_text = (await read_line(reader)).split(b";", 1)[0].strip(b" \t")
        if not _HEX.fullmatch(size_text):
            raise HttpError(400, "malformed chunk size")
        size = int(size_text, 16)
        if size == 0:
            break
        if len(body) + size > limit:
            raise HttpError(413, f"body over {limit} bytes")
        chunk = await reader.readexactly(size + 2)
        if not chunk.endswith(b"\r\n"):
            raise HttpError(400, "chunk not followed by CRLF")
        body += chunk[:-2]
    for _ in range(MAX_HEADERS + 1):  # trailer fields, read and dropped
        if not await read_line(reader):
            return bytes(body)
    raise HttpError(431, f"more than {MAX_HEADERS} trailer fields")
