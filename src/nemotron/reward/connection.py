"""One client connection of the servers' HTTP/1.1 transport: an asyncio protocol around an h11 state machine.

h11 parses and renders HTTP/1.1 (heads, Content-Length and chunked bodies, keep-alive, HEAD). This protocol
keeps what h11 leaves to its user: the size limits (head, body, decompressed body), a body framed one way only,
the timeouts (each `State` has one deadline), a request at a time with pipelined ones waiting in h11's buffer,
auth before routing, and the hand-off of each request to its route.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import socket
import time
from collections.abc import Callable
from concurrent.futures import Future
from email.utils import formatdate
from functools import cache, partial
from http import HTTPStatus
from typing import Any, Protocol

import h11

from nemotron.reward.messages import (
    BodyStream,
    Deferred,
    HTTPError,
    HTTPSettings,
    Request,
    Response,
    Route,
    decompress,
    error_from,
    error_response,
)
from nemotron.reward.request_head import (
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    folded,
    framing_error,
    head_of,
    split_target,
    too_long,
)

logger = logging.getLogger(__name__)

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE"})  # any other method: 501
PIPELINE_BUFFER = 256 * 1024  # read no further ahead than this while a request is being answered
# A body refused before it was read (413, 401, ...) is read and dropped this long at most after the answer, so that
# the client, still sending it, reads the answer rather than a reset (a lingering close, as Apache and nginx do)
LINGER_S = 5.0


class State(enum.Enum):
    """What a connection waits for. `Connection.due` is the state's one deadline; when it passes (`_on_timer`):

    - IDLE, a request's first byte: due read_timeout_s after the last read or answer; closed, nothing is lost.
    - HEAD, the rest of its head: due at the request deadline, or as IDLE if sooner; closed, unanswered.
    - BODY, its body: due as HEAD; 408, then closed.
    - ANSWER, the server's answer, computed and then sent: due at the route's timeout_s, if it has one; 504.

    Apart from these, a client that reads none of our answers for read_timeout_s is cut off (`write_stall`).
    """

    IDLE = "idle"
    HEAD = "head"
    BODY = "body"
    ANSWER = "answer"
    CLOSED = "closed"


_date = ("", -1)


def http_date() -> str:
    global _date
    now = int(time.time())
    if _date[1] != now:  # formatting a date costs more than the rest of a response head
        _date = (formatdate(now, usegmt=True), now)
    return _date[0]


@cache
def reason_phrase(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b""


class Server(Protocol):
    """What a connection asks of the server that accepted it (`transport.ServerCore`, which creates connections)."""

    settings: HTTPSettings
    loop: asyncio.AbstractEventLoop
    receive_buffer: memoryview  # shared by all connections: the loop serves one read at a time
    draining: bool  # stopping: answer what is in flight, take nothing new
    public_paths: frozenset[str]  # answered without the token

    def admit(self, connection: Connection) -> bool: ...
    def forget(self, connection: Connection) -> None: ...
    def authorized(self, headers: dict[str, str]) -> bool: ...
    def route(self, method: str, path: str) -> Route | None: ...
    def run_in_pool(self, handler: Callable[[Request], Response], request: Request) -> Deferred: ...
    def answer_when_done(self, connection: Connection, future: Future[Any]) -> None: ...
    def request_started(self) -> None: ...
    def request_finished(self, endpoint: str, status: int, seconds: float) -> None: ...


class Connection(asyncio.BufferedProtocol):
    """The protocol of one accepted socket; every method runs on the event loop except where noted.

    A BufferedProtocol: the transport reads into `ServerCore.receive_buffer` (shared: the loop serves one
    read at a time), where a plain Protocol would have each read allocate, then shrink, a 256 KiB bytes.
    """

    def __init__(self, core: Server) -> None:
        self.core, self.settings, self.loop = core, core.settings, core.loop
        self.transport: asyncio.Transport | None = None
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.state = State.IDLE
        self.due = math.inf  # when the state times out
        self.request_due = math.inf  # the current request's head and body must have arrived by then
        # One timer per connection, re-armed only when it fires early (a read moved `due` on).
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = math.inf
        self.write_stall: asyncio.TimerHandle | None = None  # while the client reads none of our answers
        self.linger: asyncio.TimerHandle | None = None  # closed, dropping a refused body until it ends
        self.head_seen = bytearray()  # bytes of the coming request head (h11 keeps no raw head to check)
        self.read_ahead = 0  # bytes that arrived while a request was being answered
        self.reading_paused = self.advancing = False
        # The request being served: from its head until its answer is written.
        self.started: float | None = None  # None: no request is counted in flight
        self.method = self.path = self.query = ""
        self.headers: dict[str, str] = {}
        self.route: Route | None = None
        self.endpoint = "unknown"
        self.body = bytearray()
        self.pending: Deferred | None = None  # the answer being computed elsewhere
        self.streaming: BodyStream | None = None  # the body of the answer being sent in parts

    # --- asyncio callbacks ---------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if not self.core.admit(self):
            self.state = State.CLOSED
            return
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # A response must not wait for the client's delayed ACK of the previous one (~40 ms on Linux).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._enter(State.IDLE, time.monotonic() + self.settings.read_timeout_s)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.core.receive_buffer

    def buffer_updated(self, nbytes: int) -> None:
        if self.state is State.CLOSED:
            return
        now = time.monotonic()
        data = bytes(self.core.receive_buffer[:nbytes])
        if self.state is State.IDLE:
            data = data.lstrip(b"\r\n")  # blank lines before a request line are allowed (RFC 9112 2.2)
            if not data:
                self.due = now + self.settings.read_timeout_s
                return
            self._start_head(now)
        if self.state is State.HEAD and len(self.head_seen) <= MAX_HEAD_BYTES:
            self.head_seen += data
        if self.state in (State.HEAD, State.BODY):
            self.due = min(self.request_due, now + self.settings.read_timeout_s)
        self.h11.receive_data(data)
        if self.state is State.ANSWER or self.write_stall is not None:
            self.read_ahead += len(data)
            if self.read_ahead > PIPELINE_BUFFER and self.transport is not None and not self.reading_paused:
                self.reading_paused = True
                self.transport.pause_reading()
            return
        self._advance()

    def eof_received(self) -> bool:
        if self.linger is not None:
            return False  # the refused body has ended: close now
        if self.state is not State.CLOSED:
            self.h11.receive_data(b"")
            if self.state is not State.ANSWER:
                self._advance()
        return True  # keep the socket open to write the answers to what already arrived

    def pause_writing(self) -> None:
        # A client that reads none of its answers for read_timeout_s is cut off, whatever the state.
        self.write_stall = self.loop.call_later(self.settings.read_timeout_s, self.abort)

    def resume_writing(self) -> None:
        if self.write_stall is not None:
            self.write_stall.cancel()
            self.write_stall = None
        self._arm(self.due)  # the state's deadline waited while writing was paused
        if self.state in (State.IDLE, State.HEAD, State.BODY):
            self._advance()

    def connection_lost(self, exc: Exception | None) -> None:
        answering = self.state is State.ANSWER
        self.state = State.CLOSED
        if self.streaming is not None:
            self.streaming.cancel()  # nobody reads the rest: its producer may stop
        self.core.forget(self)
        for timer in (self.timer, self.write_stall, self.linger):
            if timer is not None:
                timer.cancel()
        if not answering:  # the body never fully came; an answer in progress is finished by answer()
            self._finish(400)

    # --- called by the server ------------------------------------------------------------------------------

    def answer(self, future: Future[Any]) -> None:
        """The future of the pending answer resolved (queued by `ServerCore.answer_when_done`): send it."""
        pending = self.pending
        if pending is None or future is not pending.future:
            return  # answered already: it timed out
        self.pending, self.due = None, math.inf  # a streamed answer has no deadline but the write stall
        try:
            response = pending.respond(future)
        except HTTPError as exc:
            response = error_from(exc, self.settings.error_style)
        except Exception as exc:
            logger.error("%s %s failed", self.method, self.path, exc_info=exc)
            response = self._error(500, f"internal error: {type(exc).__name__}: {exc}")
        self._respond(response)
        self._advance()

    def close_if_idle(self) -> None:
        if self.state is State.IDLE:  # between requests with no byte of the next: nothing lost (RFC 9112 9.5)
            self.close()

    def close(self) -> None:
        """Close once what is buffered is sent. A client still sending a body gets our end of the stream after
        the answer, and what it sends is read and dropped until it ends or LINGER_S: closing with its bytes
        unread would reset the connection, and the client would see the reset instead of the answer."""
        transport = self.transport
        if transport is None or self.state is State.CLOSED:
            return
        self.state = State.CLOSED
        if self.h11.their_state is h11.SEND_BODY and transport.can_write_eof():
            transport.write_eof()
            self.linger = self.loop.call_later(LINGER_S, transport.close)
            if self.reading_paused:
                self.reading_paused = False
                transport.resume_reading()
            return
        transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # --- reading requests ----------------------------------------------------------------------------------

    def _advance(self) -> None:
        """Take h11's events while the connection is free to serve a request."""
        if self.advancing:
            return
        self.advancing = True
        try:
            while self.write_stall is None and self.state in (State.IDLE, State.HEAD, State.BODY):
                try:
                    event = self.h11.next_event()
                except h11.RemoteProtocolError as exc:
                    self._protocol_error(exc)
                    break
                if event is h11.NEED_DATA or event is h11.PAUSED:
                    break
                if isinstance(event, h11.Request):
                    self._on_request(event)
                elif isinstance(event, h11.Data):
                    self._on_data(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    self._on_end()
                elif isinstance(event, h11.ConnectionClosed):
                    self.close()  # nothing more can arrive; an incomplete head gets no answer
        except Exception as exc:  # a bug here must not leave the client waiting forever
            logger.error("failed to serve a request", exc_info=exc)
            self._fail(self._error(500, f"internal error: {type(exc).__name__}: {exc}"))
        finally:
            self.advancing = False
        if self.reading_paused and self.read_ahead <= PIPELINE_BUFFER and self.transport is not None:
            self.reading_paused = False
            self.transport.resume_reading()

    def _start_head(self, now: float) -> None:
        """A request's first byte is here: its head and body must arrive by the request deadline."""
        self.request_due = now + self.settings.request_deadline_s
        self._enter(State.HEAD, min(self.request_due, now + self.settings.read_timeout_s))

    def _protocol_error(self, exc: h11.RemoteProtocolError) -> None:
        """What h11 refused: a bad head (400), one too long (414/431), a bad chunk or a body cut short (400)."""
        if self.state is State.BODY:
            if self.h11.their_state is h11.ERROR and "without sending complete" in str(exc):
                length = self.headers.get("content-length")
                whole = f" of {length}" if length else ""
                self._fail(self._error(400, f"the body ended after {len(self.body)}{whole} bytes"))
            else:
                self._fail(self._error(400, f"bad request body: {exc}"))
            return
        if self.state is State.IDLE:
            self.close()  # an end of input between requests: nothing to answer
            return
        self._start()
        refusal = too_long(self.head_seen)
        framing = framing_error(head_of(self.head_seen))
        if refusal is not None or exc.error_status_hint == 431:
            refusal = refusal or HTTPError(431, f"the request head is larger than {MAX_HEAD_BYTES} bytes")
            self._fail(error_from(refusal, self.settings.error_style))
        else:  # h11 answers 501 to a Transfer-Encoding it does not know; it is a framing error like the others
            self._fail(
                self._error(400 if framing else exc.error_status_hint, framing or f"bad request: {exc}")
            )

    def _start(self) -> None:
        self.route, self.endpoint, self.body = None, "unknown", bytearray()
        self.started = time.perf_counter()
        self.core.request_started()

    def _on_request(self, event: h11.Request) -> None:
        """Decide on the request from its head alone. An error here answers at once and closes the
        connection: the body, left unread, would be taken for the next request."""
        self._start()
        self.method = event.method.decode("ascii")
        self.headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in event.headers}
        head, self.head_seen = head_of(self.head_seen), bytearray()
        core = self.core
        try:
            refusal = too_long(head) or folded(head)
            if refusal is not None:
                raise refusal
            if (framing := framing_error(head)) is not None:
                raise HTTPError(400, framing)  # h11 would read the body one way; a proxy may read it another
            if len(event.headers) > MAX_HEADERS:
                raise HTTPError(431, f"more than {MAX_HEADERS} request headers")
            if self.method not in METHODS:
                raise HTTPError(501, f"method {self.method} is not supported")
            if core.draining:
                raise HTTPError(503, "the server is shutting down")
            self.path, self.query = split_target(event.target.decode("latin-1"))
            # Auth before routing: without the token a client learns nothing but 401, not which paths exist
            # nor the model's name. Only the health probes answer without it.
            if not core.authorized(self.headers) and self.path not in core.public_paths:
                raise HTTPError(401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})
            self.route = core.route("GET" if self.method == "HEAD" else self.method, self.path)
            if self.route is None:
                raise HTTPError(404, f"no endpoint {self.method} {self.path}")
            self.endpoint = self.route.name
            length = self.headers.get("content-length")
            limit = self.settings.max_body_bytes
            if length is not None and int(length) > limit:  # framing_error checked that it is a number
                raise HTTPError(413, f"the body has {length} bytes; the limit is {limit}")
        except HTTPError as exc:
            self._fail(error_from(exc, self.settings.error_style))
            return
        self.state = State.BODY  # under the same deadline as the head
        if self.h11.they_are_waiting_for_100_continue and self.transport is not None:
            self.transport.write(
                self.h11.send(h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue"))
            )

    def _on_data(self, data: bytes) -> None:
        self.body += data
        if len(self.body) > self.settings.max_body_bytes:  # a chunked body says its size only as it comes
            self._fail(
                self._error(413, f"the body is larger than the limit of {self.settings.max_body_bytes} bytes")
            )

    def _on_end(self) -> None:
        self._enter(State.ANSWER, math.inf)  # the request has arrived; what remains is the server's time
        self._dispatch(bytes(self.body))

    # --- answering -----------------------------------------------------------------------------------------

    def _error(self, status: int, message: str) -> Response:
        return error_response(status, message, style=self.settings.error_style)

    def _dispatch(self, body: bytes) -> None:
        route = self.route
        assert route is not None
        self.body = bytearray()
        encoding = self.headers.get("content-encoding", "").strip().lower()
        try:
            body = decompress(body, encoding, self.settings.max_body_bytes)
            request = Request(self.method, self.path, self.query, self.headers, body)
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
            self._respond(error_from(exc, self.settings.error_style))
            return
        except Exception as exc:
            logger.error("%s %s failed", self.method, self.path, exc_info=exc)
            self._respond(self._error(500, f"internal error: {type(exc).__name__}: {exc}"))
            return
        self.pending = pending
        if pending.future.done():
            self.answer(pending.future)
            return
        if route.timeout_s is not None:
            self._enter(State.ANSWER, time.monotonic() + route.timeout_s)
        pending.future.add_done_callback(partial(self.core.answer_when_done, self))

    def _fail(self, response: Response) -> None:
        """Answer an error that leaves the stream unusable, then close."""
        self._respond(response, close=True)

    def _response_event(self, response: Response, close: bool) -> h11.Response:
        headers = [("Server", "nemotron"), ("Date", http_date()), ("Content-Type", response.content_type)]
        if (
            response.stream is None
        ):  # else h11 sends the parts chunked (HTTP/1.0: until the connection closes)
            headers.append(("Content-Length", str(len(response.body))))
        headers += response.headers.items()
        if close:
            headers.append(("Connection", "close"))
        return h11.Response(
            status_code=response.status, headers=headers, reason=reason_phrase(response.status)
        )

    def _respond(self, response: Response, close: bool = False) -> None:
        close = close or self.core.draining
        transport = self.transport
        if self.state is not State.CLOSED and transport is not None:
            try:
                event = self._response_event(response, close)
            except h11.LocalProtocolError as exc:  # e.g. a header with a line break: the handler's bug
                logger.error("cannot send the answer to %s", self.path, exc_info=exc)
                response, close = self._error(500, "internal error"), True
                event = self._response_event(response, close)
            try:
                parts: list[bytes | None] = [self.h11.send(event)]
                if response.stream is not None and self.method != "HEAD":
                    transport.writelines(p for p in parts if p)
                    self.streaming = response.stream
                    response.stream.attach(
                        self.loop, self._send_part, partial(self._end_stream, response.status)
                    )
                    return  # answered in parts; _end_stream finishes the request
                if response.stream is not None:
                    response.stream.cancel()  # HEAD: the headers only
                if self.method != "HEAD" and response.body:
                    parts += self.h11.send_with_data_passthrough(h11.Data(data=response.body)) or []
                parts.append(self.h11.send(h11.EndOfMessage()))
                transport.writelines(p for p in parts if p)
            except h11.LocalProtocolError as exc:  # h11 is in no state to answer (a broken request)
                logger.debug("closing without an answer: %s", exc)
                transport.abort()
                self.state = State.CLOSED
        self._answered(response.status)

    def _send_part(self, data: bytes) -> None:
        if self.state is State.CLOSED or self.transport is None or self.streaming is None:
            return
        if data:
            self.transport.write(self.h11.send(h11.Data(data=data)))

    def _end_stream(self, status: int) -> None:
        self.streaming = None
        if self.state is not State.CLOSED and self.transport is not None:
            self.transport.write(self.h11.send(h11.EndOfMessage()))
        self._answered(status)
        self._advance()

    def _answered(self, status: int) -> None:
        """The answer is written: count it, then close, or wait for the next request."""
        self._finish(status)
        self.method = ""
        if self.state is State.CLOSED:
            return
        if self.h11.our_state is not h11.DONE or self.h11.their_state is not h11.DONE:
            self.close()  # Connection: close, HTTP/1.0, or an error before the request was read
            return
        self.h11.start_next_cycle()
        self.route, self.read_ahead = None, 0
        self.head_seen = bytearray(self.h11.trailing_data[0][: MAX_HEAD_BYTES + 1])
        now = time.monotonic()  # deadlines run from now: answering may have taken longer than they allow
        if self.head_seen:
            self._start_head(now)  # a pipelined request
        else:
            self._enter(State.IDLE, now + self.settings.read_timeout_s)

    def _finish(self, status: int) -> None:
        if self.started is not None:
            self.core.request_finished(self.endpoint, status, time.perf_counter() - self.started)
            self.started = None

    # --- timeouts: each state's one deadline ---------------------------------------------------------------

    def _enter(self, state: State, due: float) -> None:
        self.state, self.due = state, due
        self._arm(due)

    def _arm(self, at: float) -> None:
        if at < self.timer_at and self.state is not State.CLOSED:
            if self.timer is not None:
                self.timer.cancel()
            self.timer_at = at
            self.timer = self.loop.call_at(at, self._on_timer)  # loop.time() is time.monotonic()

    def _on_timer(self) -> None:
        self.timer, self.timer_at = None, math.inf
        if self.state is State.CLOSED or self.write_stall is not None:
            return  # while the client reads none of our answers only the write stall counts; resume re-arms
        if time.monotonic() < self.due:
            self._arm(self.due)  # it fired early: a read moved the deadline on since it was set
        elif self.state is State.BODY:
            self._fail(self._error(408, "timed out reading the request body"))
        elif self.state is State.ANSWER:
            self._time_out_answer()
        else:
            self.close()  # IDLE, or a HEAD that did not arrive in time (slowloris): nothing to answer

    def _time_out_answer(self) -> None:
        pending, route = self.pending, self.route
        assert pending is not None and route is not None
        self.pending, self.due = None, math.inf
        pending.future.cancel()  # work not yet started is dropped
        self._respond(self._error(504, f"{route.name} took longer than {route.timeout_s} s"))
        self._advance()
