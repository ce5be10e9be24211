"""Request heads and bodies as the servers read them: every malformed shape is a status, never an exception
of another kind, and no body is read beyond its limit. Parsing runs on asyncio's real StreamReader, through
the RequestReader a connection uses (h11 framing and parsing, kvscope's bounds around it)."""

from __future__ import annotations

import asyncio

import pytest

from kvscope.agent.http.messages import Headers, HttpError, PeerGone, RequestReader


def reader_of(data: bytes, eof: bool = True, limit: int = 8192) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=limit)
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


def head(data: bytes) -> tuple[str, str, str, Headers]:
    async def run() -> tuple[str, str, str, Headers]:
        got = await RequestReader(reader_of(data), 1024).read_head()
        return got.method, got.target, got.version, got.headers

    return asyncio.run(run())


def body_of(data: bytes, limit: int = 1024) -> bytes:
    async def run() -> bytes:
        requests = RequestReader(reader_of(data), limit)
        await requests.read_head()
        return await requests.read_body()

    return asyncio.run(run())


def status_of(data: bytes, limit: int = 1024) -> int:
    with pytest.raises(HttpError) as err:
        body_of(data, limit)
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
    """Refused as soon as the line is in, the stream left open: an HTTP/0.9 client sends no blank line."""
    async def alone() -> None:
        await asyncio.wait_for(RequestReader(reader_of(line + b"\r\n", eof=False), 1024).read_head(), 2.0)

    with pytest.raises(HttpError) as err:
        asyncio.run(alone())
    assert err.value.status == status
    assert status_of(line + b"\r\nHost: a\r\n\r\n") == status  # and the same in a whole head


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
    assert body_of(b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello", 10) == b"hello"
    assert body_of(b"POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\nhello", 10) == b"hello"
    with pytest.raises(HttpError, match="conflicting"):
        body_of(b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello", 10)


def test_no_length_means_no_body_even_on_post() -> None:
    """A request without Content-Length or Transfer-Encoding has no body (RFC 9112 §6.3): the bytes that
    follow are the next request, never read 'until the peer closes'."""
    async def run() -> tuple[bytes, str]:
        requests = RequestReader(reader_of(b"POST / HTTP/1.0\r\n\r\nGET / HTTP/1.1\r\n\r\n"), 1024)
        await requests.read_head()
        body = await requests.read_body()
        return body, (await requests.read_head()).method

    assert asyncio.run(run()) == (b"", "GET")


def test_smuggling_shapes_and_other_codings() -> None:
    assert status_of(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n") == 400
    assert status_of(b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n") == 501
    assert status_of(b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n") == 501


def chunked(*chunks: bytes, trailer: bytes = b"") -> bytes:
    return b"".join(b"%x\r\n%b\r\n" % (len(c), c) for c in chunks) + b"0\r\n" + trailer + b"\r\n"


def read_chunked(data: bytes, limit: int = 1024) -> bytes:
    return body_of(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + data, limit)


def test_chunked_bodies() -> None:
    assert read_chunked(chunked(b"hello ", b"world")) == b"hello world"
    assert read_chunked(b"5;ext=1\r\nhello\r\n0\r\n\r\n") == b"hello"
    assert read_chunked(chunked(b"abc", trailer=b"X-Sum: 1\r\n")) == b"abc"


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (chunked(b"x" * 600, b"y" * 600), 413),  # each chunk under the limit, the body over it
        (b"fffffffffffffff\r\n" + b"x" * 1100, 413),  # a huge chunk: refused once what came of it passes the limit
        (b"1" * 17 + b"\r\n" + b"x" * 1100, 413),
        (b"zz\r\nab\r\n0\r\n\r\n", 400),
        (b"-1\r\n", 400),
        (b"3\r\nabcX\r\n0\r\n\r\n", 400),
        (b"1" * 21 + b"\r\n", 400),  # 21 hex digits: more than a chunk size may have (h11 takes 20)
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


@pytest.mark.parametrize("version", [b"HTTP/1.1", b"HTTP/1.0"])
@pytest.mark.parametrize("coding", [b"chunked", b"CHUNKED", b"gzip", b"gzip, chunked", b"identity"])
@pytest.mark.parametrize("length_first", [False, True])
def test_transfer_encoding_with_content_length_is_refused(version: bytes, coding: bytes, length_first: bool) -> None:
    """Both framings in one request is the request-smuggling shape (RFC 9112 §6.1): refused as a bad request
    whatever the coding, the order of the fields or the version, and the body is not read. h11 alone lets
    Transfer-Encoding win; a coding other than chunked alone would be 501."""
    fields = [b"Transfer-Encoding: " + coding, b"Content-Length: 5"]
    if length_first:
        fields.reverse()
    data = b"POST / " + version + b"\r\nHost: a\r\n" + b"\r\n".join(fields) + b"\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    with pytest.raises(HttpError, match="Transfer-Encoding and Content-Length together") as err:
        body_of(data)
    assert err.value.status == 400


def test_an_http11_request_without_host_is_read_and_none_is_made_up() -> None:
    """h11 alone refuses it (RFC 9112 §3.2); kvscope's servers have always served it, and still do."""
    method, target, version, headers = head(b"GET /metrics HTTP/1.1\r\nAccept: text/plain\r\n\r\n")
    assert (method, target, version) == ("GET", "/metrics", "HTTP/1.1")
    assert headers.fields == {"accept": ["text/plain"]}
    assert body_of(b"\r\nPOST / HTTP/1.1\nContent-Length: 2\n\nok") == b"ok"


def test_two_host_fields_are_refused() -> None:
    assert status_of(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n") == 400


@pytest.mark.parametrize("control", [b"\x01", b"\x08", b"\x0b", b"\x1b", b"\x7f"])
def test_control_characters_in_a_header_value_are_refused(control: bytes) -> None:
    assert status_of(b"GET / HTTP/1.1\r\nHost: a\r\nX: a" + control + b"b\r\n\r\n") == 400


def test_obsolete_line_folding_is_refused_after_the_first_field_too() -> None:
    assert status_of(b"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n\tb\r\n\r\n") == 400


def test_more_than_the_empty_lines_allowed_before_a_request_line() -> None:
    assert head(b"\r\n" * 4 + b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")[0] == "GET"
    assert status_of(b"\r\n" * 5 + b"GET / HTTP/1.1\r\nHost: a\r\n\r\n") == 400


def test_too_many_trailer_fields() -> None:
    with pytest.raises(HttpError) as err:
        read_chunked(chunked(b"abc", trailer=b"X: 1\r\n" * 101))
    assert err.value.status == 431


def test_pipelined_requests_are_read_in_turn() -> None:
    """What follows a request in the same read (a body, the next requests) is handed on, never lost."""
    data = (b"POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"
            b"POST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(b"de", b"f") +
            b"\r\nGET /c HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")

    async def run() -> list[tuple[str, bytes]]:
        requests = RequestReader(reader_of(data), 1024)
        read = []
        for _ in range(3):
            got = await requests.read_head()
            read.append((got.target, await requests.read_body()))
        with pytest.raises(PeerGone):
            await requests.read_head()
        return read

    assert asyncio.run(run()) == [("/a", b"abc"), ("/b", b"def"), ("/c", b"")]


async def fed_slowly(requests: RequestReader, reader: asyncio.StreamReader, data: bytes,
                     piece: int) -> tuple[str, bytes]:
    """Reads one request while `data` arrives `piece` bytes at a time."""
    async def feed() -> None:
        for i in range(0, len(data), piece):
            reader.feed_data(data[i:i + piece])
            await asyncio.sleep(0)

    feeding = asyncio.create_task(feed())
    try:
        got = await requests.read_head()
        return got.target, await requests.read_body()
    finally:
        await feeding


@pytest.mark.parametrize("piece", [1, 2, 7])
def test_a_request_that_arrives_in_pieces(piece: int) -> None:
    data = (b"\r\nPOST /otlp?x=1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunked(b"hello ", b"world", trailer=b"X-Sum: 1\r\n"))

    async def run() -> tuple[str, bytes]:
        reader = asyncio.StreamReader()
        return await fed_slowly(RequestReader(reader, 1024), reader, data, piece)

    assert asyncio.run(run()) == ("/otlp?x=1", b"hello world")


@pytest.mark.parametrize(
    ("opening", "status"),
    [
        (b"GET /metrics HTTP/1.1\r\nX: " + b"y" * 9000, 431),  # a line over its limit, still arriving
        (b"GET /" + b"a" * 9000, 431),
        (b"GET /\r\nHost: a\r\n", 400),  # HTTP/0.9, whatever follows its line
    ],
)
def test_a_head_that_cannot_become_a_request_is_refused_before_it_ends(opening: bytes, status: int) -> None:
    async def run() -> None:
        reader = asyncio.StreamReader()
        await asyncio.wait_for(fed_slowly(RequestReader(reader, 1024), reader, opening, 1000), 2.0)

    with pytest.raises(HttpError) as err:
        asyncio.run(run())
    assert err.value.status == status
