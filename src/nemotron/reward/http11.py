"""HTTP/1.1 messages and their wire format for the servers' transport: request heads in, responses out.

Pure functions, standard library only. Bodies are Content-Length only (no chunked transfer coding); both
HTTP/1.0 and HTTP/1.1 clients are served. The limits follow `http.server`, which this replaced.
"""

from __future__ import annotations

import json
import re
import time
import zlib
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

MAX_REQUEST_LINE = 65536  # longer: 414
MAX_HEADER_BYTES = 65536  # all header lines together; more: 431
MAX_HEADERS = 100  # more: 431
METHODS = frozenset({"GET", "POST", "PUT", "DELETE"})  # any other well-formed method: 501

_HEAD_END = re.compile(rb"\r?\n\r?\n")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VERSION = re.compile(r"HTTP/(\d)\.(\d)")
_DIGITS = re.compile(r"[0-9]{1,18}")


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]  # lower-cased names
    body: bytes


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


class HTTPError(Exception):
    """Raised by a handler to answer `status` with the JSON body {"error": message}."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def json_response(payload: object, status: int = 200) -> Response:
    return Response(status, json.dumps(payload, allow_nan=False).encode("utf-8"))


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(status, json.dumps({"error": message}).encode("utf-8"), headers=dict(headers or {}))


def parse_json_body(request: Request) -> Any:
    """The request body as JSON, or HTTP 400 saying why not."""
    try:
        return json.loads(request.body)
    except (ValueError, RecursionError) as exc:  # ValueError also: an integer of more than 4300 digits
        raise HTTPError(400, f"the body is not valid JSON: {exc}") from exc


@dataclass(frozen=True, slots=True)
class Head:
    """A parsed request line and header section."""

    method: str
    target: str
    version: str  # "HTTP/1.0" or "HTTP/1.1"
    headers: dict[str, str]  # lower-cased names; a repeated header keeps its last value
    keep_alive: bool


def find_head_end(buffer: bytes | bytearray, start: int = 0) -> tuple[int, int] | None:
    """(length of the head, length of the head and the blank line after it), or None while incomplete.

    `start` lets a caller resume a search where the last one stopped, so a head that arrives a byte at a
    time costs linear, not quadratic, time.
    """
    match = _HEAD_END.search(buffer, start)
    return None if match is None else (match.start(), match.end())


def check_partial_head(buffer: bytes | bytearray) -> None:
    """Raise 414 or 431 as soon as an incomplete head is already longer than the limits allow."""
    line_end = buffer.find(b"\n", 0, MAX_REQUEST_LINE + 2)
    if line_end < 0:
        if len(buffer) > MAX_REQUEST_LINE + 1:
            raise HTTPError(414, f"the request line is longer than {MAX_REQUEST_LINE} bytes")
    elif len(buffer) - line_end > MAX_HEADER_BYTES + 2:
        raise HTTPError(431, f"the request headers are larger than {MAX_HEADER_BYTES} bytes")


def _line(raw: bytes) -> bytes:
    return raw[:-1] if raw.endswith(b"\r") else raw


def parse_head(raw: bytes) -> Head:
    """The bytes of a request head, without its final blank line -> Head, or HTTPError (400/414/431/501)."""
    first, _, rest = raw.partition(b"\n")
    line = _line(first).decode("latin-1")
    if len(line) > MAX_REQUEST_LINE:
        raise HTTPError(414, f"the request line is longer than {MAX_REQUEST_LINE} bytes")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[1]:
        raise HTTPError(400, f"bad request line {line[:200]!r}")
    method, target, version = parts
    match = _VERSION.fullmatch(version)
    if match is None or match[1] != "1":
        raise HTTPError(400, f"unsupported protocol {version[:20]!r}; this server speaks HTTP/1.1")
    version = "HTTP/1.0" if match[2] == "0" else "HTTP/1.1"  # RFC 9112: a higher 1.x minor is treated as 1.1
    if _TOKEN.fullmatch(method) is None:
        raise HTTPError(400, f"bad method {method[:40]!r}")
    if method not in METHODS:
        raise HTTPError(501, f"method {method} is not supported")
    if len(rest) > MAX_HEADER_BYTES:
        raise HTTPError(431, f"the request headers are larger than {MAX_HEADER_BYTES} bytes")
    headers: dict[str, str] = {}
    lines = rest.split(b"\n") if rest else []
    if len(lines) > MAX_HEADERS:
        raise HTTPError(431, f"more than {MAX_HEADERS} request headers")
    for raw_line in lines:
        text = _line(raw_line).decode("latin-1")
        name, colon, value = text.partition(":")
        if not colon or _TOKEN.fullmatch(name) is None:
            # Also a line starting with a space: obsolete line folding (RFC 9112 5.2 allows refusing it).
            raise HTTPError(400, f"bad header line {text[:100]!r}")
        name = name.lower()
        value = value.strip(" \t")
        if name == "content-length" and headers.get(name, value) != value:
            raise HTTPError(400, "conflicting Content-Length headers")  # request smuggling otherwise
        headers[name] = value
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    keep_alive = "close" not in tokens and (version == "HTTP/1.1" or "keep-alive" in tokens)
    return Head(method, target, version, headers, keep_alive)


def body_length(head: Head, limit: int) -> int:
    """How many body bytes follow `head`, or HTTPError: 411 (chunked, or POST/PUT without a length),
    400 (a bad Content-Length) or 413 (over `limit`)."""
    if "transfer-encoding" in head.headers:
        raise HTTPError(411, "chunked bodies are not supported; send Content-Length")
    text = head.headers.get("content-length")
    if text is None:
        if head.method in ("POST", "PUT"):
            raise HTTPError(411, "Content-Length is required")
        return 0
    if _DIGITS.fullmatch(text) is None:  # int() would also take "+5", " 5" and "5_0"
        raise HTTPError(400, f"bad Content-Length {text[:40]!r}")
    length = int(text)
    if length > limit:
        raise HTTPError(413, f"the body has {length} bytes; the limit is {limit}")
    return length


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """Undo a gzip or deflate Content-Encoding; 413 when the result would exceed `limit` (a zip bomb)."""
    if encoding in ("", "identity"):
        return body
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}.get(encoding)
    if wbits is None:
        raise HTTPError(415, f"Content-Encoding {encoding!r} is not supported (use gzip or deflate)")
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise HTTPError(400, f"the {encoding} body does not decompress: {exc}") from exc
    if len(out) > limit or inflater.unconsumed_tail:
        raise HTTPError(413, f"the decompressed body is larger than the limit of {limit} bytes")
    return out


_reasons: dict[int, str] = {}
_date = ("", -1)


def _reason(status: int) -> str:
    reason = _reasons.get(status)
    if reason is None:
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = "Unknown"
        _reasons[status] = reason
    return reason


def _http_date() -> str:
    global _date
    now = int(time.time())
    if _date[1] != now:  # formatting a date costs more than the rest of a response head
        _date = (formatdate(now, usegmt=True), now)
    return _date[0]


def render_response(
    response: Response, *, keep_alive: bool, http10: bool = False, head_only: bool = False
) -> bytes:
    """The bytes of `response` on the wire. `keep_alive=False` announces that the server closes after it;
    an HTTP/1.0 client is told explicitly when the connection stays open. `head_only`: the answer to HEAD."""
    lines = [
        f"HTTP/1.1 {response.status} {_reason(response.status)}",
        "Server: nemotron",
        f"Date: {_http_date()}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
    ]
    for name, value in response.headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise ValueError(f"response header {name!r} holds a line break")
        lines.append(f"{name}: {value}")
    if not keep_alive:
        lines.append("Connection: close")
    elif http10:
        lines.append("Connection: keep-alive")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + response.body
