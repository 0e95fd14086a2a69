"""One client connection of the servers' HTTP/1.1 transport: an asyncio protocol that reads requests one at a
time, enforces the read timeouts and the per-request deadline, hands each request to its route, and writes the
answers in order (pipelined requests wait in the buffer until the one before them is answered).
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import time
from concurrent.futures import Future
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from nemotron.reward.http11 import (
    Head,
    HTTPError,
    Request,
    Response,
    body_length,
    check_partial_head,
    decompress,
    error_response,
    find_head_end,
    parse_head,
    render_response,
)

if TYPE_CHECKING:
    from nemotron.reward.transport import Deferred, Route, ServerCore

logger = logging.getLogger(__name__)

# What a connection is doing: waiting for a request head, for its body, or for its answer; or it is closed.
HEAD, BODY, BUSY, CLOSED = "head", "body", "busy", "closed"
PIPELINE_BUFFER = 256 * 1024  # read no further ahead than this while a request is being answered
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def split_target(target: str) -> tuple[str, str]:
    """A request target -> (path, query); HTTP 400 for one urlsplit refuses (e.g. "http://[::1/score")."""
    if target.startswith("//"):  # a path, not a network location: never read "//host/x" as host "host"
        target = "/" + target.lstrip("/")
    try:
        url = urlsplit(target)
    except ValueError as exc:
        raise HTTPError(400, f"bad request target: {exc}") from exc
    return url.path, url.query


class Connection(asyncio.BufferedProtocol):
    """The protocol of one accepted socket; every method runs on the event loop except where noted.

    A BufferedProtocol: the transport reads into `ServerCore.receive_buffer` (shared: the loop serves one
    read at a time), where a plain Protocol would have each read allocate, then shrink, a 256 KiB bytes.
    """

    def __init__(self, core: ServerCore) -> None:
        self.core, self.settings, self.loop = core, core.settings, core.loop
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.scanned = 0  # bytes at the start of `buffer` known to hold no end of a head
        self.state = HEAD
        self.eof = False
        # The request being served: from its head until its answer is written.
        self.open = False
        self.head: Head | None = None
        self.route: Route | None = None
        self.path = self.query = ""
        self.endpoint = "unknown"
        self.started = 0.0
        self.length = 0
        self.keep_alive = True
        self.pending: Deferred | None = None  # the answer being computed elsewhere
        # Timeouts are checked lazily: one timer per connection, re-armed only when it fires early.
        self.last_activity = 0.0  # the last byte read, or the last answer written: idle time counts from it
        self.deadline: float | None = None  # the current request's head and body must arrive by then
        self.answer_deadline: float | None = None
        self.writing_paused_at: float | None = None
        self.reading_paused = False
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = math.inf
        self.advancing = False

    # --- asyncio callbacks ---------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # A response must not wait for the client's delayed ACK of the previous one (~40 ms on Linux).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.core.connections.add(self)
        self.last_activity = time.monotonic()
        self._arm(self.last_activity + self.settings.read_timeout_s)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.core.receive_buffer

    def buffer_updated(self, nbytes: int) -> None:
        if self.state == CLOSED:
            return
        now = self.last_activity = time.monotonic()
        if self.state == HEAD and not self.buffer and self.deadline is None:
            self.deadline = now + self.settings.request_deadline_s  # from the first byte of the request
            self._arm(self.deadline)
        self.buffer += self.core.receive_buffer[:nbytes]
        if self.state == BUSY or self.writing_paused_at is not None:
            if len(self.buffer) > PIPELINE_BUFFER and self.transport is not None and not self.reading_paused:
                self.reading_paused = True
                self.transport.pause_reading()
            return
        self._advance()

    def eof_received(self) -> bool:
        self.eof = True
        if self.state != BUSY:
            self._advance()
        return True  # keep the socket open to write the answers to what already arrived

    def pause_writing(self) -> None:
        self.writing_paused_at = time.monotonic()
        self._arm(self.writing_paused_at + self.settings.read_timeout_s)

    def resume_writing(self) -> None:
        self.writing_paused_at = None
        self._arm(self._expiry())
        if self.state == HEAD:
            self._advance()

    def connection_lost(self, exc: Exception | None) -> None:
        busy = self.state == BUSY
        self.state = CLOSED
        self.core.connections.discard(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not busy:  # the body never fully came; a busy request is finished by answer()
            self._finish(400)

    # --- called by the server ------------------------------------------------------------------------------

    def answer(self, future: Future[Any]) -> None:
        """The future of the pending answer resolved (queued by `ServerCore.answer_when_done`): send it."""
        pending = self.pending
        if pending is None or future is not pending.future:
            return  # answered already: it timed out
        self.pending = self.answer_deadline = None
        try:
            response = pending.respond(future)
        except HTTPError as exc:
            response = error_response(exc.status, exc.message, exc.headers)
        except Exception as exc:
            logger.error("%s %s failed", self.head.method if self.head else "?", self.path, exc_info=exc)
            response = error_response(500, f"internal error: {type(exc).__name__}: {exc}")
        self._respond(response)
        self._advance()

    def close_if_idle(self) -> None:
        if self.state == HEAD and not self.buffer and not self.open:
            self.close()

    def close(self) -> None:
        """Close once what is buffered is sent. A request still being answered is counted as 400 (the
        client's answer is lost), which happens only when a stop gave up waiting for it."""
        if self.transport is not None and self.state != CLOSED:
            self.state = CLOSED
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # --- reading requests ----------------------------------------------------------------------------------

    def _advance(self) -> None:
        """Take requests from the buffer while the connection is free to serve one."""
        if self.advancing:
            return
        self.advancing = True
        try:
            while self.writing_paused_at is None:
                if self.state == HEAD and not self._take_head():
                    break
                if self.state == BODY and not self._take_body():
                    break
                if self.state not in (HEAD, BODY):
                    break
        except Exception as exc:  # a bug here must not leave the client waiting forever
            logger.error("failed to serve a request", exc_info=exc)
            self._fail(error_response(500, f"internal error: {type(exc).__name__}: {exc}"))
        finally:
            self.advancing = False
        if self.eof and self.state in (HEAD, BODY) and self.writing_paused_at is None:
            if self.state == BODY:
                self._fail(
                    error_response(400, f"the body ended after {len(self.buffer)} of {self.length} bytes")
                )
            else:
                self.close()  # nothing more can arrive; an incomplete head gets no answer
        elif self.reading_paused and len(self.buffer) <= PIPELINE_BUFFER and self.transport is not None:
            self.reading_paused = False
            self.transport.resume_reading()

    def _take_head(self) -> bool:
        buffer = self.buffer
        if buffer.startswith((b"\r", b"\n")):
            stripped = buffer.lstrip(b"\r\n")  # blank lines before a request line are allowed (RFC 9112 2.2)
            del buffer[: len(buffer) - len(stripped)]
            self.scanned = 0
            if not buffer:
                self.deadline = None  # no request has started yet
        end = find_head_end(buffer, self.scanned)
        if end is None:
            self.scanned = max(0, len(buffer) - 3)
            try:
                check_partial_head(buffer)
            except HTTPError as exc:
                self._start(None)
                self._fail(error_response(exc.status, exc.message))
            return False
        raw = bytes(buffer[: end[0]])
        del buffer[: end[1]]
        self.scanned = 0
        try:
            head = parse_head(raw)
        except HTTPError as exc:
            self._start(None)
            self._fail(error_response(exc.status, exc.message), head_only=raw.startswith(b"HEAD "))
            return False
        self._start(head)
        self._route(head)
        return True

    def _start(self, head: Head | None) -> None:
        self.open, self.head, self.route, self.endpoint = True, head, None, "unknown"
        self.started = time.perf_counter()
        self.keep_alive = head is not None and head.keep_alive
        self.core.request_started()

    def _route(self, head: Head) -> None:
        """Decide on the request from its head alone; an error here closes the connection, since the body
        (left unread) would be taken for the next request."""
        core = self.core
        try:
            if core.draining:
                raise HTTPError(503, "the server is shutting down")
            self.path, self.query = split_target(head.target)
            authorized = core.authorized(head.headers)
            try:
                self.route = core.route(head.method, self.path)
            except HTTPError:
                if authorized:
                    raise
            if self.route is not None:
                self.endpoint = self.route.name
            if not authorized and (self.route is None or not self.route.public):
                # Without the token a client learns nothing but 401: not which paths exist, nor the model's name.
                raise HTTPError(401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})
            if self.route is None:
                raise HTTPError(404, f"no endpoint {head.method} {self.path}")
            self.length = body_length(head, self.settings.max_body_bytes)
        except HTTPError as exc:
            self._fail(error_response(exc.status, exc.message, exc.headers))
            return
        self.state = BODY
        if self.length > len(self.buffer) and head.version == "HTTP/1.1":
            if head.headers.get("expect", "").lower() == "100-continue" and self.transport is not None:
                self.transport.write(CONTINUE)

    def _take_body(self) -> bool:
        length = self.length
        if len(self.buffer) < length:
            return False
        body = bytes(self.buffer[:length])
        del self.buffer[:length]
        self.deadline = None  # the request has arrived; what remains is the server's time
        self.state = BUSY
        self._dispatch(body)
        return True

    # --- answering -----------------------------------------------------------------------------------------

    def _dispatch(self, body: bytes) -> None:
        head, route = self.head, self.route
        assert head is not None and route is not None
        encoding = head.headers.get("content-encoding", "").strip().lower()
        try:
            body = decompress(body, encoding, self.settings.max_body_bytes)
        except HTTPError as exc:
            self._fail(error_response(exc.status, exc.message, exc.headers))
            return
        request = Request(head.method, self.path, self.query, head.headers, body)
        try:
            if route.submit is not None:
                pending = route.submit(request)
            elif route.inline:
                assert route.handler is not None
                self._respond(route.handler(request))
                return
            else:
                assert route.handler is not None
                pending = self.core.run_in_pool(route.handler, request)
        except HTTPError as exc:
            self._respond(error_response(exc.status, exc.message, exc.headers))
            return
        except Exception as exc:
            logger.error("%s %s failed", head.method, self.path, exc_info=exc)
            self._respond(error_response(500, f"internal error: {type(exc).__name__}: {exc}"))
            return
        self.pending = pending
        if pending.future.done():
            self.answer(pending.future)
            return
        if route.timeout_s is not None:
            self.answer_deadline = time.monotonic() + route.timeout_s
            self._arm(self.answer_deadline)
        pending.future.add_done_callback(partial(self.core.answer_when_done, self))

    def _fail(self, response: Response, head_only: bool = False) -> None:
        """Answer an error that leaves the stream unusable, then close."""
        self.keep_alive = False
        self._respond(response, head_only)

    def _respond(self, response: Response, head_only: bool = False) -> None:
        keep_alive = self.keep_alive and not self.core.draining
        transport = self.transport
        if self.state != CLOSED and transport is not None:
            head = self.head
            try:
                transport.write(
                    render_response(
                        response,
                        keep_alive=keep_alive,
                        http10=head is not None and head.version == "HTTP/1.0",
                        head_only=head_only,
                    )
                )
            except Exception as exc:  # e.g. a header with a line break: the handler's bug, not the client's
                logger.error("cannot send the answer to %s", self.path, exc_info=exc)
                transport.write(render_response(error_response(500, "internal error"), keep_alive=False))
                keep_alive = False
        self._finish(response.status)
        if self.state == CLOSED:
            return
        if not keep_alive:
            self.close()
            return
        self.state = HEAD
        self.head = self.route = None
        # Idle from now: answering may have taken longer than the read timeout.
        self.last_activity = now = time.monotonic()
        self._arm(now + self.settings.read_timeout_s)
        if self.buffer:  # a pipelined request: its deadline runs from now
            self.deadline = now + self.settings.request_deadline_s
            self._arm(self.deadline)

    def _finish(self, status: int) -> None:
        if self.open:
            self.open = False
            self.core.request_finished(self.endpoint, status, time.perf_counter() - self.started)

    # --- timeouts ------------------------------------------------------------------------------------------

    def _arm(self, at: float) -> None:
        if at < self.timer_at and self.state != CLOSED:
            if self.timer is not None:
                self.timer.cancel()
            self.timer_at = at
            self.timer = self.loop.call_at(at, self._on_timer)  # loop.time() is time.monotonic()

    def _expiry(self) -> float:
        """When the connection's next timeout is due: a client that stopped reading its answers, an answer
        that takes too long, or a request that does not arrive (between reads, or in all)."""
        read_timeout = self.settings.read_timeout_s
        if self.writing_paused_at is not None:
            due = self.writing_paused_at + read_timeout
            return min(due, self.answer_deadline) if self.answer_deadline is not None else due
        if self.state == BUSY:
            return math.inf if self.answer_deadline is None else self.answer_deadline
        due = self.last_activity + read_timeout
        return due if self.deadline is None else min(due, self.deadline)

    def _on_timer(self) -> None:
        self.timer, self.timer_at = None, math.inf
        if self.state == CLOSED or self.transport is None:
            return
        now = time.monotonic()
        if now < self._expiry():
            self._arm(self._expiry())  # it fired early: a read or an answer came since it was set
        elif (
            self.writing_paused_at is not None
            and now >= self.writing_paused_at + self.settings.read_timeout_s
        ):
            logger.debug("closing a connection whose client stopped reading")
            self.transport.abort()
        elif self.state == BUSY:
            self._time_out_answer()
        elif self.state == BODY:
            self._fail(error_response(408, "timed out reading the request body"))
        else:
            self.close()  # idle, or a head that did not arrive in time: nothing to answer

    def _time_out_answer(self) -> None:
        pending, route = self.pending, self.route
        assert pending is not None and route is not None
        self.pending = self.answer_deadline = None
        pending.future.cancel()  # work not yet started is dropped
        self._respond(error_response(504, f"{route.name} took longer than {route.timeout_s} s"))
        self._advance()
