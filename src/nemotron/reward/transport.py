"""HTTP plumbing shared by the reward server and the judge server: h11 parses, prometheus_client counts.

One asyncio event loop on its own thread serves every connection (`connection.py`). The transport owns what
every endpoint needs: routing to an app, bearer-token auth before routing, the body limit, gzip/deflate request
bodies, JSON errors, read timeouts and a per-request deadline, a cap on open connections, request metrics,
GET /metrics, and a graceful stop (refuse new requests, finish the ones in flight, then close the app). A route
answers in one of three ways: `submit` hands the request to other work and returns a `Deferred` answer (the
reward model's batcher: no thread per request); `inline` handlers are cheap and run on the loop; any other
handler may block and runs in a thread pool.
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import json
import logging
import os
import resource
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

import h11
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from nemotron.errors import UserError
from nemotron.reward.bind import TOKEN_ENV as TOKEN_ENV
from nemotron.reward.connection import Connection, State
from nemotron.reward.messages import Deferred as Deferred
from nemotron.reward.messages import ErrorStyle, error_response
from nemotron.reward.messages import HTTPError as HTTPError
from nemotron.reward.messages import HTTPSettings as HTTPSettings
from nemotron.reward.messages import Request as Request
from nemotron.reward.messages import Response as Response
from nemotron.reward.messages import Route as Route
from nemotron.reward.messages import json_response as json_response
from nemotron.reward.messages import parse_json_body as parse_json_body
from nemotron.reward.metrics import CONTENT_TYPE, LATENCY_BUCKETS_S, exposition

logger = logging.getLogger(__name__)

LISTEN_BACKLOG = 1024  # 64+ clients connect at once in the benchmark
# Answered without the bearer token, so that probes need no secret. Nothing else is: an unauthenticated
# request gets 401 before routing, whatever its path or model name.
HEALTH_PATHS = frozenset({"/health", "/v2/health/live", "/v2/health/ready"})
FILES_KEPT_FREE = 64  # file descriptors left for the model, logs and threads beside the connections
WARNING_INTERVAL_S = 60.0  # at most one warning this often about refused connections


def health_answer(closing: bool) -> Response:
    """What a server's health probes (HEALTH_PATHS) answer: ready, or 503 once its app is closing."""
    if closing:
        raise HTTPError(503, "the server is shutting down")
    return json_response({"ready": True})


class App(Protocol):
    """What a server plugs into the transport."""

    def route(self, method: str, path: str) -> Route | None:
        """The route for a request, None for 404; may raise HTTPError (e.g. 405). Called on the event loop,
        only for requests that carry the token (or for HEALTH_PATHS)."""
        ...

    def close(self, timeout: float) -> None:
        """Finish queued work and release the model; called after the last request."""
        ...


def raise_file_limit() -> int:
    """Raise the soft limit on open files to the hard one (Linux defaults to 1024 of 1M+); the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:  # e.g. above the kernel's nr_open
            logger.debug("cannot raise the open-file limit to %d: %s", target, exc)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def connection_cap(wanted: int | None, file_limit: int) -> int:
    """How many connections a server keeps open: `wanted`, or a default, always well under the file limit."""
    room = max(8, (file_limit - FILES_KEPT_FREE) // 2)
    if wanted is None:
        return min(4096, room)
    if wanted > room:
        logger.warning(
            "max_connections %d is too close to the open-file limit of %d; serving at most %d",
            wanted,
            file_limit,
            room,
        )
        return room
    return wanted


def _busy_answer(style: ErrorStyle) -> bytes:
    """The whole 503 a connection over the cap gets, rendered once by h11."""
    response = error_response(503, "too many connections; retry shortly", style=style)
    conn = h11.Connection(h11.SERVER)
    head = [
        ("Content-Type", response.content_type),
        ("Content-Length", str(len(response.body))),
        ("Retry-After", "1"),
        ("Connection", "close"),
    ]
    return (
        conn.send(h11.Response(status_code=503, headers=head, reason=b"Service Unavailable"))
        + conn.send(h11.Data(data=response.body))
        + conn.send(h11.EndOfMessage())
    )


class ServerCore:
    """What all connections of one server share: settings, routing and auth, the connection cap, metrics, the
    count of requests in flight, the handler thread pool, and the queue of answers that other threads hand
    back to the loop."""

    def __init__(self, app: App, settings: HTTPSettings, registry: CollectorRegistry) -> None:
        self.app, self.settings, self.registry = app, settings, registry
        prefix = settings.metric_prefix
        self.requests = Counter(
            f"{prefix}_http_requests_total",
            "HTTP requests by endpoint and code.",
            ["endpoint", "code"],
            registry=registry,
        )
        self.errors = Counter(
            f"{prefix}_http_errors_total",
            "HTTP requests answered with 4xx/5xx.",
            ["endpoint"],
            registry=registry,
        )
        self.latency = Histogram(
            f"{prefix}_http_request_seconds",
            "Time from request line to response.",
            ["endpoint"],
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.open_connections = Gauge(
            f"{prefix}_http_connections", "Open client connections.", registry=registry
        )
        self.refused = Counter(
            f"{prefix}_http_refused_connections_total",
            "Connections answered 503 at once: the connection cap was reached and none was idle.",
            registry=registry,
        )
        self.evicted = Counter(
            f"{prefix}_http_evicted_connections_total",
            "Idle or stalled connections closed to make room under the connection cap.",
            registry=registry,
        )
        self.max_connections = connection_cap(settings.max_connections, raise_file_limit())
        self.busy_answer = _busy_answer(settings.error_style)
        self.public_paths = HEALTH_PATHS
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(self._on_loop_error)
        self.receive_buffer = memoryview(bytearray(256 * 1024))  # every connection reads into it, in turn
        self.executor = ThreadPoolExecutor(settings.handler_threads, thread_name_prefix="http-handler")
        self.connections: dict[Connection, None] = {}  # in the order they were accepted
        self.draining = False
        self.in_flight = 0
        self.in_flight_changed = threading.Condition()
        self._answers: deque[tuple[Connection, Future[Any]]] = deque()
        self._wakeup_pending = False
        self._metrics_route = Route("metrics", self._metrics, inline=True)
        self._last_warning = -WARNING_INTERVAL_S
        self._refused_since_warning = 0

    def route(self, method: str, path: str) -> Route | None:
        if path == "/metrics":
            if method != "GET":
                raise HTTPError(405, "use GET /metrics")
            return self._metrics_route
        return self.app.route(method, path)

    def _metrics(self, _: Request) -> Response:
        return Response(200, exposition(self.registry), CONTENT_TYPE)

    def run_in_pool(self, handler: Callable[[Request], Response], request: Request) -> Deferred:
        return Deferred(self.executor.submit(handler, request), Future.result)

    def authorized(self, headers: dict[str, str]) -> bool:
        token = self.settings.token
        if token is None:
            return True
        scheme, _, value = headers.get("authorization", "").partition(" ")
        # compare_digest keeps the comparison time independent of where the tokens differ.
        return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())

    # --- the connection cap ---------------------------------------------------------------------------------

    def admit(self, connection: Connection) -> bool:
        """Take a new connection, closing an idle (or stalled) one to make room at the cap; else answer it
        503 at once and close it, so the clients already connected keep being served."""
        if len(self.connections) >= self.max_connections and not self._make_room():
            assert connection.transport is not None
            connection.transport.write(self.busy_answer)
            connection.transport.close()
            self.refused.inc()
            self._warn_refused()
            return False
        self.connections[connection] = None
        self.open_connections.set(len(self.connections))
        return True

    def _make_room(self) -> bool:
        """Close one that is closing already (dropping a refused body); else the connection that waited longest
        for its next request; else the one whose request head has taken longest, if over a second (a slowloris
        client: a real head arrives in milliseconds)."""
        closing = [c for c in self.connections if c.state is State.CLOSED]
        idle = [c for c in self.connections if c.state is State.IDLE]
        if closing:
            victim = closing[0]
        elif idle:
            victim = min(idle, key=lambda c: c.due)  # the idle deadline runs from the last read or answer
        else:
            # A head that started over a second ago has a deadline before this.
            started_before = time.monotonic() + self.settings.request_deadline_s - 1.0
            stalled = [
                c for c in self.connections if c.state is State.HEAD and c.request_due < started_before
            ]
            if not stalled:
                return False
            victim = min(stalled, key=lambda c: c.request_due)
        del self.connections[victim]
        victim.abort()
        self.evicted.inc()
        return True

    def forget(self, connection: Connection) -> None:
        if connection in self.connections:
            del self.connections[connection]
            self.open_connections.set(len(self.connections))

    def _warn_refused(self) -> None:
        self._refused_since_warning += 1
        now = time.monotonic()
        if now - self._last_warning >= WARNING_INTERVAL_S:
            logger.warning(
                "%d connections refused with 503: %d are open, the cap (max_connections); none was idle",
                self._refused_since_warning,
                len(self.connections),
            )
            self._last_warning, self._refused_since_warning = now, 0

    def _on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """One line a minute, not a traceback per attempt, when accept() runs out of file descriptors."""
        if "out of system resource" in str(context.get("message", "")):
            now = time.monotonic()
            if now - self._last_warning >= WARNING_INTERVAL_S:
                self._last_warning = now
                logger.warning("accept() failed: %s (open-file limit reached)", context.get("exception"))
            return
        loop.default_exception_handler(context)

    # --- requests -------------------------------------------------------------------------------------------

    def request_started(self) -> None:
        with self.in_flight_changed:
            self.in_flight += 1

    def request_finished(self, endpoint: str, status: int, seconds: float) -> None:
        with self.in_flight_changed:
            self.in_flight -= 1
            self.in_flight_changed.notify_all()
        self.requests.labels(endpoint, str(status)).inc()
        if status >= 400:
            self.errors.labels(endpoint).inc()
        self.latency.labels(endpoint).observe(seconds)

    def answer_when_done(self, connection: Connection, future: Future[Any]) -> None:
        """Called from the thread that resolved `future`: queue the answer and wake the loop once for all
        answers queued before it runs (a batch of 64 answers costs one wake-up, not 64)."""
        self._answers.append((connection, future))
        if not self._wakeup_pending:
            self._wakeup_pending = True
            try:
                self.loop.call_soon_threadsafe(self._write_answers)
            except RuntimeError:  # the loop is closed: the server stopped without waiting for this request
                logger.debug("an answer arrived after the server stopped")

    def _write_answers(self) -> None:
        self._wakeup_pending = False  # before draining: a later answer schedules another wake-up
        while self._answers:
            connection, future = self._answers.popleft()
            connection.answer(future)


def _listening_socket(host: str, port: int) -> socket.socket:
    """A bound socket; a port in use, an address this machine does not have or a privileged port is UserError
    (exit 2, one line): the user's host/port, not a crash."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.setblocking(False)
    except OSError as e:
        sock.close()
        if e.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            raise UserError(
                f"cannot serve on {host}:{port}: {e.strerror}", hint="Pick another port (0: a free one)"
            ) from None
        raise
    return sock


class ServerHandle:
    """A running server: its URL, metrics, and `stop()`. Also a context manager."""

    def __init__(self, app: App, settings: HTTPSettings, registry: CollectorRegistry | None = None) -> None:
        self.app = app
        self.settings = settings
        self.registry = registry or CollectorRegistry()
        try:
            sock = _listening_socket(settings.host, settings.port)
        except BaseException:  # the port is taken (or the host unknown): the app's workers stop with it
            app.close(1.0)
            raise
        self._core = core = ServerCore(app, settings, self.registry)
        address = sock.getsockname()
        self.host, self.port = str(address[0]), int(address[1])
        self._thread = threading.Thread(target=core.loop.run_forever, name="http-loop", daemon=True)
        self._thread.start()
        start = core.loop.create_server(lambda: Connection(core), sock=sock, backlog=LISTEN_BACKLOG)
        try:
            self._server = asyncio.run_coroutine_threadsafe(start, core.loop).result(10.0)
        except BaseException:
            sock.close()
            self._close_loop()
            raise
        self._stopped = False
        # The cap in force: the setting, or the default under the file limit.
        self.max_connections = core.max_connections
        logger.info("serving on %s (at most %d connections)", self.url, self.max_connections)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def stop(self, timeout: float | None = None) -> bool:
        """Refuse new requests, wait for in-flight ones, close the app. True if everything drained in time."""
        if self._stopped:
            return True
        if threading.current_thread() is self._thread:
            raise RuntimeError("stop() was called on the server's own event loop; it would wait for itself")
        self._stopped = True
        limit = self.settings.drain_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + limit
        core = self._core
        asyncio.run_coroutine_threadsafe(self._refuse_new(), core.loop).result(10.0)
        with core.in_flight_changed:
            drained = core.in_flight_changed.wait_for(
                lambda: core.in_flight == 0, max(0.0, deadline - time.monotonic())
            )
        if not drained:
            logger.warning("%d requests still running after %.1f s; closing anyway", core.in_flight, limit)
        self.app.close(max(0.0, deadline - time.monotonic()))
        try:
            asyncio.run_coroutine_threadsafe(self._close_connections(), core.loop).result(10.0)
        except TimeoutError:
            logger.warning("connections did not close in time")
        self._close_loop()
        core.executor.shutdown(wait=False, cancel_futures=True)
        logger.info("stopped %s", self.url)
        return drained

    async def _refuse_new(self) -> None:
        self._core.draining = True  # requests that arrive from now on get 503
        self._server.close()  # and new connections are refused
        for connection in list(self._core.connections):
            connection.close_if_idle()

    async def _close_connections(self) -> None:
        """Close every connection once its buffered answers are sent, waiting at most a second."""
        core = self._core
        for connection in list(core.connections):
            connection.close()
        for _ in range(100):
            if not core.connections:
                break
            await asyncio.sleep(0.01)
        for connection in list(core.connections):
            connection.abort()
        await self._server.wait_closed()

    def _close_loop(self) -> None:
        loop = self._core.loop
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout=5.0)
        if not self._thread.is_alive():
            loop.close()

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def write_ready_file(path: Path, handle: ServerHandle) -> None:
    """Atomically write {"url": ..., "pid": ...} so a parent process learns the port once we serve."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"url": handle.url, "pid": os.getpid()}))
    os.replace(tmp, path)


def run_until_signal(
    handle: ServerHandle, signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT)
) -> int:
    """Block until SIGTERM or Ctrl-C, then stop gracefully. Returns the process exit code (0 when drained).

    Call from the main thread (Python delivers signals there only).
    """
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        logger.info("received %s; shutting down", signal.Signals(signum).name)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in signals}
    try:
        while not stop.wait(0.2):
            pass
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0 if handle.stop() else 1
