"""The reward server against hostile or unusual clients, over real sockets: chunked bodies, HEAD, malformed heads
(NUL, obs-fold, Host), oversized bodies and heads, slowloris, the connection cap, and the model-name oracle."""

from __future__ import annotations

import http.client
import json
import select
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from nemotron.reward.connection import LINGER_S
from nemotron.reward.metrics import parse_samples
from nemotron.reward.server import serve
from nemotron.reward.transport import HTTPSettings, ServerHandle

TOKEN = "hostile-token-123"


def length_scorer(texts: list[str]) -> list[float]:
    return [float(len(t)) for t in texts]


@pytest.fixture
def server() -> Iterator[ServerHandle]:
    with serve(length_scorer, HTTPSettings(max_body_bytes=4096)) as handle:
        yield handle


def exchange(handle: ServerHandle, raw: bytes, timeout: float = 5.0, quiet_s: float = 0.5) -> bytes:
    """Send `raw`, then read until the server closes or goes quiet for `quiet_s`. A server that answers and
    closes before reading all of `raw` (a 413 on a declared length) leaves its answer to read."""
    with socket.create_connection((handle.host, handle.port), timeout=timeout) as sock:
        try:
            sock.sendall(raw)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = b""
        while select.select([sock], [], [], quiet_s)[0]:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            answer += chunk
    return answer


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def body_of(answer: bytes) -> bytes:
    return answer.partition(b"\r\n\r\n")[2]


def test_a_chunked_body_is_read_within_the_limit(server: ServerHandle) -> None:
    payload = json.dumps({"sentences": ["ab", "abcd"]}).encode()
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(payload[i : i + 7]), payload[i : i + 7]) for i in range(0, len(payload), 7)
    )
    head = b"POST /score HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    answer = exchange(server, head + chunks + b"0\r\n\r\n")
    assert status_of(answer) == 200 and json.loads(body_of(answer)) == {"rewards": [2.0, 4.0]}

    def generated() -> Iterator[bytes]:  # httpx sends a generator body chunked
        yield b'{"sentences": '
        yield b'["abc"]}'

    reply = httpx.post(server.url + "/score", content=generated(), timeout=10)
    assert reply.status_code == 200 and reply.json() == {"rewards": [3.0]}


def test_a_chunked_body_over_the_limit_is_413(server: ServerHandle) -> None:
    head = b"POST /score HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunk = b"1000\r\n" + b"x" * 4096 + b"\r\n"
    answer = exchange(server, head + chunk * 3)
    assert status_of(answer) == 413 and "limit" in json.loads(body_of(answer))["error"]


def test_a_declared_body_over_the_limit_is_413_before_it_is_sent(server: ServerHandle) -> None:
    started = time.monotonic()
    answer = exchange(server, b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n")
    assert status_of(answer) == 413 and time.monotonic() - started < 2.0


def test_a_body_refused_before_it_is_read_still_gets_its_answer(server: ServerHandle) -> None:
    """413 on the declared length while the client is still sending the body: the server ends its side after the
    answer and drops what follows, so a client that sends the whole body before it reads (http.client, under the
    reward client) reads the 413; the connection is gone once that client closes, well before LINGER_S. Closed
    at once, the server reset the connection with the body unread, and the client saw only the reset."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    try:
        conn.request("POST", "/score", body=b"x" * (4 << 20), headers={"Content-Type": "application/json"})
        reply = conn.getresponse()
        assert reply.status == 413 and "the limit is 4096" in json.loads(reply.read())["error"]
    finally:
        conn.close()
    closed_by = time.monotonic() + LINGER_S / 2
    while (open_now := _samples(server)["nemotron_reward_http_connections"]) > 1:  # 1: this /metrics request
        assert time.monotonic() < closed_by, f"{open_now} connections open after the client closed"
        time.sleep(0.05)


def test_connections_dropping_a_refused_body_make_room_first() -> None:
    """At the cap, a connection that was answered 413 and is only dropping the rest of its body (for up to
    LINGER_S) is closed for a newcomer before any idle one: the newcomer is served, not answered 503."""
    with serve(length_scorer, HTTPSettings(max_connections=2, max_body_bytes=4096)) as handle:
        refused = _idle_sockets(handle, 2)
        try:
            for sock in refused:  # a declared length over the limit: 413 at once, then the body is dropped
                sock.sendall(
                    b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"x" * 1000
                )
                assert status_of(sock.recv(65536)) == 413
            started = time.monotonic()
            reply = httpx.post(handle.url + "/score", json={"sentences": ["abc"]}, timeout=5)
            assert reply.status_code == 200 and time.monotonic() - started < LINGER_S / 2
        finally:
            for sock in refused:
                sock.close()


def _samples(handle: ServerHandle) -> dict[str, float]:
    return parse_samples(httpx.get(handle.url + "/metrics", timeout=5).text)


def test_head_is_answered_without_a_body(server: ServerHandle) -> None:
    answer = exchange(server, b"HEAD /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert status_of(answer) == 200 and body == b""
    get = exchange(server, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert f"content-length: {len(body_of(get))}".encode() in head.lower()  # the length a GET's body has


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", "a NUL in a header value"),
        (b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\r\n  folded\r\n\r\n", "obsolete line folding"),
        (b"GET /health HTTP/1.1\r\n\r\n", "no Host"),
        (b"GET /health HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", "two Hosts"),
        (
            b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nab",
            "two lengths",
        ),
    ],
)
def test_malformed_heads_are_400(server: ServerHandle, raw: bytes, why: str) -> None:
    answer = exchange(server, raw)
    assert status_of(answer) == 400, why
    assert "error" in json.loads(body_of(answer))


def test_a_huge_header_is_431_and_a_huge_request_line_414(server: ServerHandle) -> None:
    answer = exchange(server, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n")
    assert status_of(answer) == 431
    answer = exchange(server, b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status_of(answer) == 414


def test_a_slowloris_head_is_cut_at_the_request_deadline() -> None:
    with serve(length_scorer, HTTPSettings(request_deadline_s=1.0, read_timeout_s=5.0)) as handle:
        with socket.create_connection((handle.host, handle.port), timeout=5) as sock:
            started = time.monotonic()
            closed = False
            for byte in b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:
                try:
                    sock.sendall(bytes([byte]))
                except (BrokenPipeError, ConnectionResetError):
                    closed = True
                    break
                if select.select([sock], [], [], 0.1)[0] and sock.recv(100) == b"":
                    closed = True
                    break
            assert closed  # every byte came within the read timeout, but the head as a whole was too slow
            assert 0.9 < time.monotonic() - started < 3.0


def test_without_the_token_a_right_model_name_looks_like_a_wrong_one() -> None:
    with serve(length_scorer, HTTPSettings(token=TOKEN)) as handle:
        answers = {}
        for name in ("reward_model", "guess"):
            for action in ("ready", "", "config", "infer"):
                reply = httpx.get(f"{handle.url}/v2/models/{name}/{action}".rstrip("/"), timeout=5)
                answers[name, action] = (reply.status_code, reply.content)
        assert {answer for answer in answers.values()} == {answers["guess", "ready"]}  # all the same 401
        assert answers["guess", "ready"][0] == 401
        health = httpx.get(f"{handle.url}/v2/health/ready", timeout=5)
        assert health.status_code == 200  # the health probes are the documented exception
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert httpx.get(f"{handle.url}/v2/models/reward_model/ready", headers=auth).status_code == 200
        assert httpx.get(f"{handle.url}/v2/models/guess/ready", headers=auth).status_code == 404


def _idle_sockets(handle: ServerHandle, n: int) -> list[socket.socket]:
    return [socket.create_connection((handle.host, handle.port), timeout=5) for _ in range(n)]


def test_past_the_connection_cap_idle_connections_make_room() -> None:
    with serve(length_scorer, HTTPSettings(max_connections=8)) as handle:
        idle = _idle_sockets(handle, 30)  # more idle sockets than the cap: the oldest are closed
        try:
            with httpx.Client(timeout=5) as client:
                for _ in range(4):  # a new connection each time: each needs a free place
                    reply = client.post(
                        handle.url + "/score", json={"sentences": ["abc"]}, headers={"Connection": "close"}
                    )
                    assert reply.status_code == 200
            samples = parse_samples(httpx.get(handle.url + "/metrics", timeout=5).text)
            assert samples["nemotron_reward_http_evicted_connections_total"] >= 22
            assert samples["nemotron_reward_http_connections"] <= 8
        finally:
            for sock in idle:
                sock.close()


def test_past_the_connection_cap_with_none_idle_a_newcomer_gets_503_at_once() -> None:
    with serve(length_scorer, HTTPSettings(max_connections=4)) as handle:
        busy = _idle_sockets(handle, 4)
        try:
            for sock in busy:  # each has begun a request head: not idle, and not (yet) a stalled one
                sock.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\n")
            time.sleep(0.2)
            started = time.monotonic()
            answer = exchange(handle, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status_of(answer) == 503 and b"retry-after: 1" in answer.lower()
            assert time.monotonic() - started < 2.0
            for sock in busy:  # and the connections already open are still served
                sock.sendall(b"Content-Length: 21\r\nConnection: close\r\n\r\n" + b'{"sentences": ["ab"]}')
                reply = b""
                while chunk := sock.recv(65536):
                    reply += chunk
                assert status_of(reply) == 200 and json.loads(body_of(reply)) == {"rewards": [2.0]}
        finally:
            for sock in busy:
                sock.close()
