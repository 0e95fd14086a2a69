"""The asyncio HTTP/1.1 transport over real loopback sockets: pipelining, keep-alive, timeouts, the three
kinds of route, and a graceful stop. A small app of its own keeps these independent of the reward server."""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any, BinaryIO

import pytest

from nemotron.reward import transport
from nemotron.reward.metrics import parse_samples
from nemotron.reward.transport import Deferred, Response, Route, ServerHandle


class ScriptedApp:
    """POST /echo (inline), POST /later (submit: the test resolves its futures), GET /slow (submit, never
    resolves, 0.3 s timeout), GET /block (blocking, waits for `unblock`), GET /big (1 MB, inline)."""

    def __init__(self) -> None:
        self.futures: list[Future[bytes]] = []
        self.submitted = threading.Semaphore(0)
        self.unblock = threading.Event()
        self.events: list[str] = []
        self.routes = {
            ("POST", "/echo"): Route("echo", lambda r: Response(200, r.body, "text/plain"), inline=True),
            ("POST", "/later"): Route("later", submit=self._later),
            ("GET", "/slow"): Route(
                "slow", submit=lambda _: Deferred(Future(), Future.result), timeout_s=0.3
            ),
            ("GET", "/block"): Route("block", self._block),
            ("GET", "/big"): Route("big", lambda _: Response(200, b"x" * 2**20), inline=True),
            ("GET", "/health"): Route("health", lambda _: transport.json_response({"ok": True}), inline=True),
        }

    def route(self, method: str, path: str) -> Route | None:
        return self.routes.get((method, path))

    def close(self, timeout: float) -> None:
        self.events.append("close")

    def _later(self, request: transport.Request) -> Deferred:
        future: Future[bytes] = Future()
        self.futures.append(future)
        self.submitted.release()
        return Deferred(future, self._respond)

    def _respond(self, done: Future[bytes]) -> Response:
        self.events.append("respond")
        return Response(200, done.result(), "text/plain")

    def _block(self, _: transport.Request) -> Response:
        self.unblock.wait(10)
        return transport.json_response({"unblocked": True})


@pytest.fixture
def app() -> ScriptedApp:
    return ScriptedApp()


def start(app: ScriptedApp, **settings: Any) -> ServerHandle:
    return ServerHandle(app, transport.HTTPSettings(**settings))


@pytest.fixture
def server(app: ScriptedApp) -> Iterator[ServerHandle]:
    handle = start(app, read_timeout_s=5.0)
    yield handle
    app.unblock.set()
    handle.stop(5.0)


def connect(handle: ServerHandle) -> socket.socket:
    sock = socket.create_connection((handle.host, handle.port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def request(method: str, path: str, body: bytes = b"", version: str = "HTTP/1.1", **headers: str) -> bytes:
    lines = [f"{method} {path} {version}", "Host: test"]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def read_response(reader: BinaryIO) -> tuple[int, dict[str, str], bytes]:
    """One response from a socket's reader; the reader stays positioned at the next one."""
    status_line = reader.readline()
    assert status_line.startswith(b"HTTP/1.1 "), status_line
    headers = {}
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.lower()] = value.strip()
    return int(status_line.split()[1]), headers, reader.read(int(headers.get("content-length", 0)))


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes `sock` (EOF or reset) within `seconds`, reading whatever else comes."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if select.select([sock], [], [], left)[0]:
            try:
                if not sock.recv(65536):
                    return True
            except ConnectionResetError:
                return True
    return False


def test_a_route_has_exactly_one_way_to_answer() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        Route("x")
    with pytest.raises(ValueError, match="exactly one"):
        Route("x", lambda r: Response(), submit=lambda r: Deferred(Future(), Future.result))


def test_pipelined_requests_are_answered_one_at_a_time_in_order(
    server: ServerHandle, app: ScriptedApp
) -> None:
    with connect(server) as sock, sock.makefile("rb") as reader:
        # Both requests in one write; the second is inline and would be ready at once if it were read early.
        sock.sendall(request("POST", "/later", b"first") + request("POST", "/echo", b"second"))
        assert app.submitted.acquire(timeout=5)
        assert not select.select([sock], [], [], 0.3)[0], "an answer overtook the pending first request"
        app.futures[0].set_result(b"FIRST")
        assert read_response(reader)[2] == b"FIRST"
        assert read_response(reader)[2] == b"second"


def test_http10_is_served_one_request_per_connection(server: ServerHandle) -> None:
    # h11 serves HTTP/1.0 clients without keep-alive, even when they ask for it: each answer says
    # Connection: close and the server closes after it.
    for extra in ({}, {"Connection": "keep-alive"}):
        with connect(server) as sock, sock.makefile("rb") as reader:
            sock.sendall(request("POST", "/echo", b"a", version="HTTP/1.0", **extra))
            status, headers, body = read_response(reader)
            assert (status, headers["connection"], body) == (200, "close", b"a")
            assert closed_within(sock, 2)


def test_connection_close_is_honoured(server: ServerHandle) -> None:
    with connect(server) as sock, sock.makefile("rb") as reader:
        sock.sendall(request("POST", "/echo", b"a", Connection="close") + request("POST", "/echo", b"b"))
        status, headers, body = read_response(reader)
        assert (status, headers["connection"], body) == (200, "close", b"a")
        assert closed_within(sock, 2)  # and the request after it is not served


def test_a_head_that_trickles_in_after_blank_lines_is_served(server: ServerHandle) -> None:
    with connect(server) as sock, sock.makefile("rb") as reader:
        for byte in b"\r\n\r\n" + request("POST", "/echo", b"abc"):
            sock.sendall(bytes([byte]))
            time.sleep(0.001)
        assert read_response(reader)[2] == b"abc"


def test_expect_100_continue_is_answered_before_the_body(server: ServerHandle) -> None:
    with connect(server) as sock, sock.makefile("rb") as reader:
        head = request("POST", "/echo", b"hello", Expect="100-continue")
        sock.sendall(head[: -len(b"hello")])
        assert reader.readline() == b"HTTP/1.1 100 Continue\r\n" and reader.readline() == b"\r\n"
        sock.sendall(b"hello")
        status, _, body = read_response(reader)
        assert (status, body) == (200, b"hello")


def test_an_overlong_request_line_is_refused_before_it_ends(server: ServerHandle) -> None:
    with connect(server) as sock, sock.makefile("rb") as reader:
        sock.sendall(b"GET /" + b"a" * 70_000)  # no line end: the server must not wait for one
        status, headers, body = read_response(reader)
        assert (status, headers["connection"]) == (414, "close") and "error" in json.loads(body)


def test_a_late_answer_is_504_its_work_is_cancelled_and_the_connection_lives_on(
    server: ServerHandle, app: ScriptedApp
) -> None:
    with connect(server) as sock, sock.makefile("rb") as reader:
        started = time.monotonic()
        sock.sendall(request("GET", "/slow"))
        status, _, body = read_response(reader)
        assert status == 504 and "slow took longer than 0.3 s" in json.loads(body)["error"]
        assert 0.25 < time.monotonic() - started < 3.0
        sock.sendall(request("POST", "/echo", b"still here"))
        assert read_response(reader)[2] == b"still here"
    with connect(server) as sock, sock.makefile("rb") as reader:
        sock.sendall(request("POST", "/later", b"x"))
        assert app.submitted.acquire(timeout=5)
        app.routes["POST", "/later"] = Route("later", submit=app._later, timeout_s=0.2)
        sock.sendall(request("POST", "/later", b"y"))  # pipelined; the new timeout applies to it
        app.futures[0].set_result(b"X")
        assert read_response(reader)[2] == b"X"
        assert read_response(reader)[0] == 504
        assert app.futures[1].cancelled()  # the late work was cancelled, not left to run


def test_a_blocking_handler_runs_off_the_event_loop(server: ServerHandle, app: ScriptedApp) -> None:
    with connect(server) as blocked, blocked.makefile("rb") as blocked_reader:
        blocked.sendall(request("GET", "/block"))
        time.sleep(0.1)
        with connect(server) as other, other.makefile("rb") as reader:
            started = time.monotonic()
            other.sendall(request("GET", "/health"))
            assert read_response(reader)[0] == 200
            assert time.monotonic() - started < 1.0  # served while /block still waits
        app.unblock.set()
        assert json.loads(read_response(blocked_reader)[2]) == {"unblocked": True}


def test_end_of_input_after_a_request_still_gets_its_answer(server: ServerHandle) -> None:
    with connect(server) as sock, sock.makefile("rb") as reader:
        sock.sendall(request("POST", "/echo", b"abc"))
        sock.shutdown(socket.SHUT_WR)
        assert read_response(reader)[2] == b"abc"
        assert closed_within(sock, 2)
    with connect(server) as sock, sock.makefile("rb") as reader:
        sock.sendall(request("POST", "/echo", b"abcde")[:-3])  # 2 of 5 body bytes, then EOF
        sock.shutdown(socket.SHUT_WR)
        status, _, body = read_response(reader)
        assert status == 400 and "after 2 of 5 bytes" in json.loads(body)["error"]


def test_an_idle_keep_alive_connection_is_closed_after_the_read_timeout(app: ScriptedApp) -> None:
    with start(app, read_timeout_s=0.5) as handle, connect(handle) as sock, sock.makefile("rb") as reader:
        sock.sendall(request("POST", "/echo", b"a"))
        assert read_response(reader)[0] == 200
        idle_from = time.monotonic()
        assert closed_within(sock, 3)
        assert 0.4 < time.monotonic() - idle_from < 2.0


def test_a_client_that_stops_reading_its_answers_is_cut_off(app: ScriptedApp) -> None:
    with start(app, read_timeout_s=0.5) as handle, connect(handle) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        sock.sendall(request("GET", "/big") * 100)  # 100 MB of answers that nobody reads
        time.sleep(1.5)  # the server's write buffer fills, then it waits read_timeout_s and gives up
        received = 0
        try:
            while chunk := sock.recv(2**20):
                received += len(chunk)
        except ConnectionResetError:
            pass
        assert received < 50 * 2**20  # cut off, not served to the end


def test_parse_errors_are_counted_under_endpoint_unknown(server: ServerHandle) -> None:
    with connect(server) as sock, sock.makefile("rb") as reader:
        sock.sendall(b"BREW /pot HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(reader)[0] == 501
    with connect(server) as sock, sock.makefile("rb") as reader:
        sock.sendall(b"GET /health HTTP/1.1\r\n\r\n")  # no Host
        assert read_response(reader)[0] == 400
    with connect(server) as sock, sock.makefile("rb") as reader:
        sock.sendall(request("GET", "/metrics"))
        samples = parse_samples(read_response(reader)[2].decode())
    assert samples['nemotron_http_requests_total{code="501",endpoint="unknown"}'] == 1
    assert samples['nemotron_http_requests_total{code="400",endpoint="unknown"}'] == 1
    assert samples['nemotron_http_errors_total{endpoint="unknown"}'] == 2


def test_stop_refuses_new_work_drains_then_closes_the_app_and_the_sockets(app: ScriptedApp) -> None:
    handle = start(app)
    busy, idle = connect(handle), connect(handle)
    with busy, idle, busy.makefile("rb") as reader, idle.makefile("rb") as idle_reader:
        idle.sendall(request("POST", "/echo", b"a"))
        assert read_response(idle_reader)[0] == 200  # an idle keep-alive connection from now on
        busy.sendall(request("POST", "/later", b"x"))
        assert app.submitted.acquire(timeout=5)
        stopping: Future[bool] = Future()
        threading.Thread(target=lambda: stopping.set_result(handle.stop(10.0))).start()
        assert closed_within(idle, 2)  # idle connections are closed at once
        with pytest.raises(ConnectionRefusedError):  # and no new one is accepted
            socket.create_connection((handle.host, handle.port), timeout=2).close()
        assert not stopping.done() and app.events == []  # still waiting for the request in flight
        app.futures[0].set_result(b"done")
        status, headers, body = read_response(reader)
        assert (status, headers["connection"], body) == (200, "close", b"done")
        assert stopping.result(10) is True
        assert app.events == ["respond", "close"]  # the app closed only after its last answer
        assert closed_within(busy, 2)
