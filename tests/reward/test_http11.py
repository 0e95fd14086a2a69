"""The HTTP/1.1 wire format of the servers' transport: request heads in, responses out, bodies and limits."""

from __future__ import annotations

import gzip
import zlib

import pytest

from nemotron.reward.http11 import (
    MAX_HEADER_BYTES,
    MAX_HEADERS,
    MAX_REQUEST_LINE,
    Head,
    HTTPError,
    Response,
    body_length,
    check_partial_head,
    decompress,
    find_head_end,
    parse_head,
    render_response,
)


def status_of(raw: bytes) -> int:
    with pytest.raises(HTTPError) as caught:
        parse_head(raw)
    return caught.value.status


def test_a_head_parses_to_method_target_version_and_lower_cased_headers() -> None:
    head = parse_head(b"POST /v2/models/m/infer?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length:  12 \r\nX-Y: b: c")
    assert head == Head(
        "POST",
        "/v2/models/m/infer?x=1",
        "HTTP/1.1",
        {"host": "a", "content-length": "12", "x-y": "b: c"},
        True,
    )


@pytest.mark.parametrize(
    ("raw", "keep_alive"),
    [
        (b"GET / HTTP/1.1", True),  # HTTP/1.1 keeps the connection unless told otherwise
        (b"GET / HTTP/1.1\r\nConnection: close", False),
        (b"GET / HTTP/1.1\r\nConnection: Upgrade, Close", False),
        (b"GET / HTTP/1.0", False),  # HTTP/1.0 closes unless it asks to keep it
        (b"GET / HTTP/1.0\r\nConnection: keep-alive", True),
        (b"GET / HTTP/1.2", True),  # a later 1.x minor is served as 1.1
    ],
)
def test_keep_alive_follows_the_version_and_the_connection_header(raw: bytes, keep_alive: bool) -> None:
    assert parse_head(raw).keep_alive is keep_alive


def test_bare_lf_line_ends_are_accepted() -> None:
    assert parse_head(b"GET /x HTTP/1.1\nHost: a").headers == {"host": "a"}
    assert find_head_end(b"GET /x HTTP/1.1\nHost: a\n\nbody") == (23, 25)


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET /", 400),  # HTTP/0.9: no version
        (b"GET  / HTTP/1.1", 400),  # two spaces: an empty target
        (b"GET / HTTP/1.1 x", 400),
        (b"GET / HTTP/x", 400),
        (b"GET / HTTP/2.0", 400),  # not 505: the fuzz tests hold every 5xx but 501 to be a server fault
        (b"GET / HTTP/0.9", 400),
        (b"G(T / HTTP/1.1", 400),  # not a token
        (b"PATCH / HTTP/1.1", 501),  # a well-formed method we do not serve
        (b"HEAD / HTTP/1.1", 501),
        (b"GET / HTTP/1.1\r\nno colon", 400),
        (b"GET / HTTP/1.1\r\nHost : a", 400),  # whitespace before the colon (RFC 9112 5.1)
        (b"GET / HTTP/1.1\r\nX: a\r\n folded", 400),  # obsolete line folding
        (b"GET / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6", 400),  # smuggling
    ],
)
def test_malformed_heads_are_refused(raw: bytes, status: int) -> None:
    assert status_of(raw) == status


def test_a_repeated_identical_content_length_is_fine() -> None:
    assert (
        parse_head(b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5").headers["content-length"]
        == "5"
    )


def test_limits_of_the_request_line_and_the_headers() -> None:
    assert status_of(b"GET /" + b"a" * MAX_REQUEST_LINE + b" HTTP/1.1") == 414
    assert status_of(b"GET / HTTP/1.1" + b"\r\nX: y" * (MAX_HEADERS + 1)) == 431
    parse_head(b"GET / HTTP/1.1" + b"\r\nX: y" * MAX_HEADERS)  # exactly at the limit: fine
    assert status_of(b"GET / HTTP/1.1\r\nX: " + b"y" * MAX_HEADER_BYTES) == 431


def test_an_incomplete_head_is_refused_as_soon_as_it_is_too_long() -> None:
    check_partial_head(b"GET /" + b"a" * 1000)  # still growing, and small: wait for more
    with pytest.raises(HTTPError) as caught:
        check_partial_head(b"GET /" + b"a" * MAX_REQUEST_LINE)  # no line end yet, and over the limit
    assert caught.value.status == 414
    with pytest.raises(HTTPError) as caught:
        check_partial_head(b"GET / HTTP/1.1\r\nX: " + b"y" * (MAX_HEADER_BYTES + 10))
    assert caught.value.status == 431


def test_the_search_for_the_end_of_a_head_resumes_where_it_stopped() -> None:
    data = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"
    # Resuming 3 bytes before the old end of the buffer still finds a terminator split across two reads.
    assert find_head_end(data[:-2]) is None
    assert find_head_end(data, len(data[:-2]) - 3) == (23, 27)
    assert find_head_end(data, 26) is None  # started past the blank line: not found


def head(method: str = "POST", **headers: str) -> Head:
    return Head(method, "/", "HTTP/1.1", {k.replace("_", "-"): v for k, v in headers.items()}, True)


@pytest.mark.parametrize(
    ("request_head", "status"),
    [
        (head(transfer_encoding="chunked", content_length="5"), 411),
        (head(), 411),  # POST without a length
        (head("PUT"), 411),
        (head(content_length="+5"), 400),  # int() would take these three
        (head(content_length="5_0"), 400),
        (head(content_length=" 5"), 400),
        (head(content_length="-1"), 400),
        (head(content_length="1" * 40), 400),
        (head(content_length="101"), 413),
    ],
)
def test_body_length_refusals(request_head: Head, status: int) -> None:
    with pytest.raises(HTTPError) as caught:
        body_length(request_head, limit=100)
    assert caught.value.status == status


def test_body_length() -> None:
    assert body_length(head(content_length="100"), limit=100) == 100
    assert body_length(head("GET"), limit=100) == 0  # GET and DELETE may go without a length
    assert body_length(head("DELETE", content_length="7"), limit=100) == 7


def test_decompress() -> None:
    text = b'{"sentences": ["a"]}'
    assert decompress(gzip.compress(text), "gzip", 100) == text
    assert decompress(zlib.compress(text), "deflate", 100) == text
    assert decompress(text, "identity", 100) == text
    for body, encoding, status in [
        (text, "br", 415),
        (text, "gzip", 400),  # not gzip at all
        (gzip.compress(b"x" * 101), "gzip", 413),  # 101 bytes inflated from ~25: over the limit of 100
    ]:
        with pytest.raises(HTTPError) as caught:
            decompress(body, encoding, 100)
        assert caught.value.status == status


def response_lines(data: bytes) -> tuple[list[str], bytes]:
    head_bytes, _, body = data.partition(b"\r\n\r\n")
    return head_bytes.decode("latin-1").split("\r\n"), body


def test_render_response() -> None:
    lines, body = response_lines(
        render_response(Response(201, b"{}", headers={"Retry-After": "1"}), keep_alive=True)
    )
    assert lines[0] == "HTTP/1.1 201 Created"
    assert {
        "Server: nemotron",
        "Content-Type: application/json",
        "Content-Length: 2",
        "Retry-After: 1",
    } < set(lines)
    assert any(line.startswith("Date: ") and line.endswith(" GMT") for line in lines)
    assert not any(line.startswith("Connection:") for line in lines) and body == b"{}"


def test_render_response_connection_header_and_head() -> None:
    closing, _ = response_lines(render_response(Response(400, b"{}"), keep_alive=False))
    assert "Connection: close" in closing
    http10, _ = response_lines(render_response(Response(200, b"{}"), keep_alive=True, http10=True))
    assert "Connection: keep-alive" in http10  # an HTTP/1.0 client assumes a close otherwise
    lines, body = response_lines(
        render_response(Response(501, b'{"error": "x"}'), keep_alive=False, head_only=True)
    )
    assert "Content-Length: 14" in lines and body == b""  # HEAD: the length of the body it would have had
    assert (
        response_lines(render_response(Response(599, b""), keep_alive=True))[0][0] == "HTTP/1.1 599 Unknown"
    )


def test_a_header_with_a_line_break_is_never_sent() -> None:
    with pytest.raises(ValueError, match="line break"):
        render_response(Response(200, headers={"X": "a\r\nSet-Cookie: evil=1"}), keep_alive=True)
