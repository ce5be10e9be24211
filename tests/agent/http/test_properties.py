"""Property tests of how the HTTP servers read requests (agent/http/messages.py): whatever bytes a peer
sends, reading ends in a request, an HttpError carrying a 4xx/5xx status, or PeerGone — never another
exception, and never a body over the limit. Well-formed requests round-trip. Derandomized and bounded,
so `make test` spends a few seconds here."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvscope.agent.http.messages import Head, Headers, HttpError, PeerGone, RequestReader

LIMIT = 4096
FAST = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
STATUSES = {400, 413, 431, 501, 505}

TOKEN = st.text(alphabet="!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
                min_size=1, max_size=12)
TARGET = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7e), min_size=1, max_size=40)
VALUE = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=40).map(str.strip)
HEADERS = st.lists(st.tuples(TOKEN.filter(lambda n: n.lower() not in ("content-length", "transfer-encoding")),
                             VALUE), max_size=8)


def read(data: bytes) -> tuple[str, str, str, Headers, bytes]:
    """The request `data` holds, read as a connection reads it (head, then the body it declares)."""

    async def run() -> tuple[str, str, str, Headers, bytes]:
        requests = RequestReader(stream_of(data), LIMIT)
        head = await requests.read_head()
        body = await requests.read_body()
        return head.method, head.target, head.version, head.headers, body

    return asyncio.run(run())


def stream_of(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=8192)
    reader.feed_data(data)
    reader.feed_eof()
    return reader


def head_with_length(value: str) -> Head:
    """The head of a POST whose Content-Length field holds `value`."""
    async def run() -> Head:
        data = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: " + value.encode() + b"\r\n\r\n"
        return await RequestReader(stream_of(data), LIMIT).read_head()

    return asyncio.run(run())


def outcome(data: bytes) -> int | bytes | None:
    """The body read, the status of the HttpError raised, or None when the peer left mid-request."""
    try:
        return read(data)[4]
    except HttpError as err:
        return err.status
    except PeerGone:
        return None


PIECES = st.sampled_from([b"GET", b"POST", b" ", b"/", b"/v1/traces", b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0",
                          b"\r\n", b"\n", b"\r", b":", b"Content-Length: ", b"Transfer-Encoding: chunked",
                          b"-1", b"0", b"5", b"4097", b"99999999999999999999", b"ffff", b"\x00", b"\xff",
                          b"\t", b"hello", b"Expect: 100-continue"])


@FAST
@given(st.lists(PIECES | st.binary(max_size=16), max_size=24).map(b"".join))
def test_any_bytes_end_in_a_request_a_status_or_a_gone_peer(data: bytes) -> None:
    result = outcome(data)
    if isinstance(result, int):
        assert result in STATUSES
    elif isinstance(result, bytes):
        assert len(result) <= LIMIT


@FAST
@given(st.sampled_from(["GET", "POST", "HEAD", "PUT"]), TARGET, st.sampled_from(["HTTP/1.0", "HTTP/1.1"]),
       HEADERS, st.binary(max_size=LIMIT))
def test_well_formed_requests_round_trip(method: str, target: str, version: str, headers: list[tuple[str, str]],
                                         body: bytes) -> None:
    head = f"{method} {target} {version}\r\n" + "".join(f"{n}: {v}\r\n" for n, v in headers)
    head += f"Content-Length: {len(body)}\r\n\r\n"
    got_method, got_target, got_version, got_headers, got_body = read(head.encode() + body)
    assert (got_method, got_target, got_version, got_body) == (method, target, version, body)
    for name, value in headers:
        assert value in got_headers.get_all(name)


def read_in_pieces(data: bytes, cuts: list[int]) -> int | bytes | None:
    """`outcome` of `data` arriving in pieces, cut at `cuts`, each piece read before the next is sent."""

    async def run() -> int | bytes | None:
        reader = asyncio.StreamReader(limit=8192)

        async def feed() -> None:
            for start, end in itertools.pairwise([0, *sorted(set(cuts)), len(data)]):
                reader.feed_data(data[start:end])
                await asyncio.sleep(0)
            reader.feed_eof()

        feeding = asyncio.create_task(feed())
        requests = RequestReader(reader, LIMIT)
        try:
            await requests.read_head()
            return await requests.read_body()
        except HttpError as err:
            return err.status
        except PeerGone:
            return None
        finally:
            await feeding

    return asyncio.run(run())


@FAST
@given(st.lists(PIECES | st.binary(max_size=16), max_size=24).map(b"".join), st.lists(st.integers(0, 400)))
def test_how_bytes_arrive_does_not_change_how_they_are_read(data: bytes, cuts: list[int]) -> None:
    assert read_in_pieces(data, [c for c in cuts if c < len(data)]) == outcome(data)


@FAST
@given(st.lists(st.binary(min_size=1, max_size=1500), max_size=8))
def test_chunked_bodies_round_trip_or_stop_at_the_limit(chunks: list[bytes]) -> None:
    data = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    data += b"".join(b"%x\r\n%b\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    whole = b"".join(chunks)
    assert outcome(data) == (whole if len(whole) <= LIMIT else 413)


@FAST
@given(st.text(st.characters(exclude_characters="\r\n"), max_size=30))  # a field's value holds no line end
def test_any_content_length_is_a_length_within_the_limit_or_a_status(value: str) -> None:
    try:
        length = head_with_length(value).length
    except HttpError as err:
        assert err.status in (400, 413)
    else:
        assert length is not None and 0 <= length <= LIMIT
        assert value.strip().isascii()


@pytest.mark.parametrize("value", ["0", "4096", " 7 ", "007"])
def test_plain_lengths(value: str) -> None:
    assert head_with_length(value).length == int(value)
