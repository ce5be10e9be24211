"""Request heads and bodies as the servers read them: every malformed shape is a status, never an exception
of another kind, and no body is read beyond its limit. Parsing runs on asyncio's real StreamReader."""

from __future__ import annotations

import asyncio

import pytest

from kvscope.agent.http.messages import (
    Headers,
    HttpError,
    PeerGone,
    body_length,
    parse_request_line,
    read_body,
    read_head,
)


def reader_of(data: bytes, eof: bool = True, limit: int = 8192) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=limit)
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


def head(data: bytes) -> tuple[str, str, str, Headers]:
    async def run() -> tuple[str, str, str, Headers]:
        return await read_head(reader_of(data))

    return asyncio.run(run())


def status_of(data: bytes, limit: int = 1024) -> int:
    async def run() -> None:
        reader = reader_of(data)
        *_, headers = await read_head(reader)
        await read_body(reader, body_length(headers, limit), limit)

    with pytest.raises(HttpError) as err:
        asyncio.run(run())
    return err.value.status


def test_a_plain_request() -> None:
    method, target, version, headers = head(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nAccept: text/plain\r\n"
                                            b"X-Twice: 1\r\nx-twice: 2\r\n\r\n")
    assert (method, target, version) == ("GET", "/metrics?x=1", "HTTP/1.1")
    assert headers.get("ACCEPT") == "text/plain" and headers.get("x-twice") == "1, 2"
    assert headers.get_all("X-Twice") == ["1", "2"] and headers.get("missing") is None


def test_bare_lf_and_leading_empty_lines_are_accepted() -> None:
    assert head(b"\r\n\nHEAD / HTTP/1.0\nHost: a\n\n")[:3] == ("HEAD", "/", "HTTP/1.0")


@pytest.mark.parametrize(
    ("line", "status"),
    [
        (b"GET /", 400),  # HTTP/0.9
        (b"GET", 400),
        (b"GET  / HTTP/1.1", 400),
        (b"G(T / HTTP/1.1", 400),
        (b"GET /\x01 HTTP/1.1", 400),
        (b"GET /\xff HTTP/1.1", 400),
        (b"GET / HTTP/1", 400),
        (b"GET / http/1.1", 400),
        (b"GET / HTTP/2.0", 505),
        (b"PRI * HTTP/2.0", 505),
    ],
)
def test_bad_request_lines(line: bytes, status: int) -> None:
    with pytest.raises(HttpError) as err:
        parse_request_line(line)
    assert err.value.status == status


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"GET / HTTP/1.1\r\n folded: x\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nno colon\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nX: a\rb\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n", 431),
        (b"GET / HTTP/1.1\r\nX: " + b"y" * 9000 + b"\r\n\r\n", 431),
        (b"GET / HTTP/1.1\r\n" + b"".join(b"X%d: %b\r\n" % (i, b"y" * 8000) for i in range(5)) + b"\r\n",
         431),  # each line within its limit, the head over 32 KiB
    ],
)
def test_bad_heads(data: bytes, status: int) -> None:
    assert status_of(data) == status


@pytest.mark.parametrize(
    ("length", "status"),
    [
        (b"-1", 400),
        (b"abc", 400),
        (b"+5", 400),
        (b"0x10", 400),
        (b"1 2", 400),
        (b"", 400),
        ("\u00b2".encode("latin-1"), 400),  # a superscript two: str.isdigit says yes, HTTP says no
        (b"1025", 413),
        (str(2**62).encode(), 413),
        (b"9" * 5000, 413),  # longer than int() takes by default: still a length, still too large
    ],
)
def test_content_length_that_is_not_a_usable_length(length: bytes, status: int) -> None:
    data = b"POST / HTTP/1.1\r\nContent-Length: " + length + b"\r\n\r\n" + b"x" * 2000
    assert status_of(data) == status


def test_content_length_repeated_must_agree() -> None:
    ok = Headers({"content-length": ["5", "5"]})
    assert body_length(ok, 10) == 5
    assert body_length(Headers({"content-length": ["5, 5"]}), 10) == 5
    with pytest.raises(HttpError, match="conflicting"):
        body_length(Headers({"content-length": ["5", "6"]}), 10)


def test_no_length_means_no_body_even_on_post() -> None:
    """A request without Content-Length or Transfer-Encoding has no body (RFC 9112 §6.3): the bytes that
    follow are the next request, never read 'until the peer closes'."""
    async def run() -> tuple[bytes, str]:
        reader = reader_of(b"POST / HTTP/1.0\r\n\r\nGET / HTTP/1.1\r\n\r\n")
        *_, headers = await read_head(reader)
        body = await read_body(reader, body_length(headers, 1024), 1024)
        method, *_ = await read_head(reader)
        return body, method

    assert asyncio.run(run()) == (b"", "GET")


def test_smuggling_shapes_and_other_codings() -> None:
    assert status_of(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n") == 400
    assert status_of(b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n") == 501
    assert status_of(b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n") == 501


def chunked(*chunks: bytes, trailer: bytes = b"") -> bytes:
    return b"".join(b"%x\r\n%b\r\n" % (len(c), c) for c in chunks) + b"0\r\n" + trailer + b"\r\n"


def read_chunked(data: bytes, limit: int = 1024) -> bytes:
    async def run() -> bytes:
        reader = reader_of(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + data)
        *_, headers = await read_head(reader)
        return await read_body(reader, body_length(headers, limit), limit)

    return asyncio.run(run())


def test_chunked_bodies() -> None:
    assert read_chunked(chunked(b"hello ", b"world")) == b"hello world"
    assert read_chunked(b"5;ext=1\r\nhello\r\n0\r\n\r\n") == b"hello"
    assert read_chunked(chunked(b"abc", trailer=b"X-Sum: 1\r\n")) == b"abc"


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (chunked(b"x" * 600, b"y" * 600), 413),  # each chunk under the limit, the body over it
        (b"fffffffffffffff\r\n", 413),
        (b"zz\r\nab\r\n0\r\n\r\n", 400),
        (b"-1\r\n", 400),
        (b"3\r\nabcX\r\n0\r\n\r\n", 400),
        (b"11111111111111111\r\n", 400),  # 17 hex digits
    ],
)
def test_chunked_bodies_are_bounded_and_strict(data: bytes, status: int) -> None:
    with pytest.raises(HttpError) as err:
        read_chunked(data)
    assert err.value.status == status


def test_a_peer_that_leaves_mid_request() -> None:
    with pytest.raises(PeerGone):
        head(b"GET / HTTP/1.1\r\nHost:")
    with pytest.raises(PeerGone):
        head(b"")
    with pytest.raises(PeerGone):
        read_chunked(b"5\r\nhel")
