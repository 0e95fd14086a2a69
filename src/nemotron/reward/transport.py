"""HTTP plumbing shared by the reward server and the judge server (standard library only).

One asyncio event loop on its own thread serves every connection (`connection.py`). The transport owns what
every endpoint needs: routing to an app, bearer-token auth, the body limit, gzip/deflate request bodies, JSON
errors, read timeouts and a per-request deadline, request metrics, GET /metrics, and a graceful stop (refuse new
requests, finish the ones in flight, then close the app). A route answers in one of three ways: `submit`
hands the request to other work and returns a `Deferred` answer (the reward model's batcher: no thread per
request); `inline` handlers are cheap and run on the loop; any other handler may block and runs in a thread
pool.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
import os
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from nemotron.reward.connection import Connection
from nemotron.reward.http11 import HTTPError as HTTPError
from nemotron.reward.http11 import Request as Request
from nemotron.reward.http11 import Response as Response
from nemotron.reward.http11 import error_response as error_response
from nemotron.reward.http11 import json_response as json_response
from nemotron.reward.http11 import parse_json_body as parse_json_body
from nemotron.reward.prometheus import LATENCY_BUCKETS_S, Registry

logger = logging.getLogger(__name__)

# The bearer token reaches a server process through this variable, never its command line (visible in ps).
TOKEN_ENV = "NEMOTRON_REWARD_TOKEN"
LISTEN_BACKLOG = 1024  # 64+ clients connect at once in the benchmark


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
    public: bool = False  # served without the bearer token (health probes)
    inline: bool = False
    submit: Callable[[Request], Deferred] | None = None
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        if (self.handler is None) == (self.submit is None):
            raise ValueError(f"route {self.name!r} needs exactly one of handler and submit")


class App(Protocol):
    """What a server plugs into the transport."""

    def route(self, method: str, path: str) -> Route | None:
        """The route for a request, None for 404; may raise HTTPError (e.g. 405). Called on the event loop."""
        ...

    def close(self, timeout: float) -> None:
        """Finish queued work and release the model; called after the last request."""
        ...


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


class ServerCore:
    """What all connections of one server share: settings, routing and auth, metrics, the count of requests
    in flight, the handler thread pool, and the queue of answers that other threads hand back to the loop."""

    def __init__(self, app: App, settings: HTTPSettings, registry: Registry) -> None:
        self.app, self.settings, self.registry = app, settings, registry
        prefix = settings.metric_prefix
        self.requests = registry.counter(
            f"{prefix}_http_requests_total", "HTTP requests by endpoint and code."
        )
        self.errors = registry.counter(f"{prefix}_http_errors_total", "HTTP requests answered with 4xx/5xx.")
        self.latency = registry.histogram(
            f"{prefix}_http_request_seconds", "Time from request line to response.", LATENCY_BUCKETS_S
        )
        self.loop = asyncio.new_event_loop()
        self.receive_buffer = memoryview(bytearray(256 * 1024))  # every connection reads into it, in turn
        self.executor = ThreadPoolExecutor(settings.handler_threads, thread_name_prefix="http-handler")
        self.connections: set[Connection] = set()
        self.draining = False
        self.in_flight = 0
        self.in_flight_changed = threading.Condition()
        self._answers: deque[tuple[Connection, Future[Any]]] = deque()
        self._wakeup_pending = False
        self._metrics_route = Route("metrics", self._metrics, inline=True)

    def route(self, method: str, path: str) -> Route | None:
        if path == "/metrics":
            if method != "GET":
                raise HTTPError(405, "use GET /metrics")
            return self._metrics_route
        return self.app.route(method, path)

    def _metrics(self, _: Request) -> Response:
        return Response(200, self.registry.render().encode(), "text/plain; version=0.0.4")

    def run_in_pool(self, handler: Callable[[Request], Response], request: Request) -> Deferred:
        return Deferred(self.executor.submit(handler, request), Future.result)

    def authorized(self, headers: dict[str, str]) -> bool:
        token = self.settings.token
        if token is None:
            return True
        scheme, _, value = headers.get("authorization", "").partition(" ")
        # compare_digest keeps the comparison time independent of where the tokens differ.
        return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())

    def request_started(self) -> None:
        with self.in_flight_changed:
            self.in_flight += 1

    def request_finished(self, endpoint: str, status: int, seconds: float) -> None:
        with self.in_flight_changed:
            self.in_flight -= 1
            self.in_flight_changed.notify_all()
        self.requests.inc(labels={"endpoint": endpoint, "code": str(status)})
        if status >= 400:
            self.errors.inc(labels={"endpoint": endpoint})
        self.latency.observe(seconds, labels={"endpoint": endpoint})

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
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class ServerHandle:
    """A running server: its URL, metrics, and `stop()`. Also a context manager."""

    def __init__(self, app: App, settings: HTTPSettings, registry: Registry | None = None) -> None:
        self.app = app
        self.settings = settings
        self.registry = registry or Registry()
        self._core = core = ServerCore(app, settings, self.registry)
        sock = _listening_socket(settings.host, settings.port)
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
        logger.info("serving on %s", self.url)

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


def server_command_line(prog: str, description: str | None, model_help: str) -> argparse.ArgumentParser:
    """The options both server commands share: --model, --host, --port, --token-env, --threads, --device,
    --precision, --ready-file.

    `bearer_token(args)` reads the token from the named variable (never the command line, visible in ps).
    """
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--model", type=Path, required=True, help=model_help)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument(
        "--token-env", default=TOKEN_ENV, help="environment variable holding the bearer token"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto: the GPU of LOCAL_RANK when present",
    )
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="weight dtype")
    parser.add_argument("--ready-file", type=Path, help="write the URL here once serving")
    return parser


def bearer_token(args: argparse.Namespace) -> str | None:
    return os.environ.get(args.token_env) or None


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
