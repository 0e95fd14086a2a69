"""Requests and responses as the servers' routes see them, the JSON error bodies they answer with, and what the
transport and each of its connections share: routes (`Route`, a `Deferred` answer) and the `HTTPSettings`.

The wire format is h11's business (`connection.py`); these are plain data plus the body helpers every route
needs: JSON in and out, gzip/deflate request bodies with a size limit.
"""

from __future__ import annotations

import asyncio
import json
import threading
import zlib
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal

# How a server spells its errors: ours, {"error": "<message>"}, or OpenAI's error object (the judge server, so
# that the openai client raises NotFoundError etc. with the message).
ErrorStyle = Literal["plain", "openai"]


@dataclass(frozen=True)
class Request:
    method: str  # HEAD is routed as GET; its answer goes out without the body
    path: str
    query: str
    headers: dict[str, str]  # lower-cased names; a repeated header keeps its last value
    body: bytes


class BodyStream:
    """A response body that another thread writes in parts as they exist (server-sent events), sent chunked.

    The producer calls `write` and finally `end` from any thread; the connection attaches itself on the event
    loop and sends each part as it comes. `cancelled` is set when the client has gone: the producer may stop.
    """

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self._lock = threading.Lock()
        self._pending: list[bytes] = []
        self._ended = False
        self._sink: tuple[asyncio.AbstractEventLoop, Callable[[bytes], None], Callable[[], None]] | None = (
            None
        )

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._sink is None:
                self._pending.append(data)
                return
            loop, on_part, _ = self._sink
        loop.call_soon_threadsafe(on_part, data)

    def end(self) -> None:
        with self._lock:
            self._ended = True
            if self._sink is None:
                return
            loop, _, on_end = self._sink
        loop.call_soon_threadsafe(on_end)

    def attach(
        self, loop: asyncio.AbstractEventLoop, on_part: Callable[[bytes], None], on_end: Callable[[], None]
    ) -> None:
        """Called on `loop`: what was written so far is sent now, the rest as it comes."""
        with self._lock:
            pending, self._pending, ended = self._pending, [], self._ended
            self._sink = (loop, on_part, on_end)
        for data in pending:
            on_part(data)
        if ended:
            on_end()

    def cancel(self) -> None:
        self.cancelled.set()


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    stream: BodyStream | None = None  # the body comes in parts from another thread instead of `body`


class HTTPError(Exception):
    """Raised by a handler to answer `status` with an error body saying `message`.

    `code` and `param` fill OpenAI's error object (e.g. code "model_not_found"); plain-style servers ignore them.
    """

    def __init__(
        self,
        status: int,
        message: str,
        headers: dict[str, str] | None = None,
        *,
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}
        self.code, self.param = code, param


def json_response(payload: object, status: int = 200) -> Response:
    return Response(status, json.dumps(payload, allow_nan=False).encode("utf-8"))


def _openai_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 429:
        return "rate_limit_error"
    return "server_error" if status >= 500 else "invalid_request_error"


def error_response(
    status: int,
    message: str,
    headers: dict[str, str] | None = None,
    *,
    style: ErrorStyle = "plain",
    code: str | None = None,
    param: str | None = None,
) -> Response:
    if style == "openai":
        error = {"message": message, "type": _openai_type(status), "param": param, "code": code}
        body = json.dumps({"error": error})
    else:
        body = json.dumps({"error": message})
    return Response(status, body.encode("utf-8"), headers=dict(headers or {}))


def error_from(exc: HTTPError, style: ErrorStyle) -> Response:
    return error_response(exc.status, exc.message, exc.headers, style=style, code=exc.code, param=exc.param)


def parse_json_body(request: Request) -> Any:
    """The request body as JSON, or HTTP 400 saying why not."""
    try:
        return json.loads(request.body)
    except (ValueError, RecursionError) as exc:  # ValueError also: an integer of more than 4300 digits
        raise HTTPError(400, f"the body is not valid JSON: {exc}") from exc


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


@dataclass(frozen=True, slots=True)
class Deferred:
    """The answer to a request that other work computes: once `future` resolves (in any thread), the
    transport calls `respond(future)` on the event loop and sends what it returns (or the HTTPError it
    raises). So the thread that resolves the future, the model's, spends no time encoding answers."""

    future: Future[Any]
    respond: Callable[[Future[Any]], Response]


@dataclass(frozen=True)
class Route:
    """How one endpoint answers. Give exactly one of `handler` and `submit`.

    - `submit(request)` is called on the event loop, must not block, and returns a `Deferred` answer.
      `timeout_s`: answer 504 if its future takes longer (and cancel it).
    - `handler(request)` runs in the transport's thread pool, or on the event loop itself when `inline`
      (only for cheap handlers that never block: health, metadata).
    """

    name: str  # the `endpoint` label of the request metrics
    handler: Callable[[Request], Response] | None = None
    inline: bool = False
    submit: Callable[[Request], Deferred] | None = None
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        if (self.handler is None) == (self.submit is None):
            raise ValueError(f"route {self.name!r} needs exactly one of handler and submit")


@dataclass(frozen=True)
class HTTPSettings:
    host: str = "127.0.0.1"
    port: int = 0
    token: str | None = None
    max_body_bytes: int = 16 * 1024 * 1024
    read_timeout_s: float = 30.0  # the longest silence between two reads
    request_deadline_s: float = 60.0  # a request's head and body must arrive within this, from its first byte
    drain_timeout_s: float = 30.0
    metric_prefix: str = "nemotron"
    handler_threads: int = 16  # the pool that runs blocking handlers
    max_connections: int | None = (
        None  # None: half of the file limit left after transport.FILES_KEPT_FREE, at most 4096
    )
    error_style: ErrorStyle = "plain"
