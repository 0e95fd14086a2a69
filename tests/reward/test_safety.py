"""Server safety: loopback by default, bearer token, body limit, slow clients, scorer crashes, graceful stop."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import pytest
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from nemotron.reward.client import RewardClient, RewardServerError
from nemotron.reward.metrics import parse_samples
from nemotron.reward.server import FULL_BATCHES, serve
from nemotron.reward.transport import HTTPSettings, ServerHandle

from .test_server import http_call

TOKEN = "s3cret-token"
QUICK_BATCHES = replace(FULL_BATCHES, max_queue_delay_ms=1.0)


def length_scorer(sentences: list[str]) -> list[float]:
    return [float(len(s)) for s in sentences]


@pytest.fixture
def token_server() -> Iterator[ServerHandle]:
    with serve(length_scorer, HTTPSettings(token=TOKEN), QUICK_BATCHES) as handle:
        yield handle


def test_binds_loopback_by_default() -> None:
    with serve(length_scorer) as handle:
        assert handle.host == "127.0.0.1"


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}, {"Authorization": "Basic " + TOKEN}],
)
def test_missing_or_wrong_token_is_401(token_server: ServerHandle, headers: dict[str, str]) -> None:
    body = json.dumps({"sentences": ["abc"]}).encode()
    status, response_headers, response = http_call(token_server.url, "/score", body, headers)
    assert status == 401
    assert response_headers.get("WWW-Authenticate") == "Bearer"
    assert "bearer token" in json.loads(response)["error"]
    assert http_call(token_server.url, "/metrics", headers=headers)[0] == 401
    assert http_call(token_server.url, "/v2/models/reward_model", headers=headers)[0] == 401


def test_right_token_is_served_and_health_is_public(
    token_server: ServerHandle, triton_client: Callable[[ServerHandle], triton_http.InferenceServerClient]
) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    status, _, response = http_call(
        token_server.url, "/score", json.dumps({"sentences": ["abc"]}).encode(), auth
    )
    assert status == 200 and json.loads(response) == {"rewards": [3.0]}
    assert http_call(token_server.url, "/v2/health/ready")[0] == 200  # probes need no token
    assert RewardClient(token_server.url, token=TOKEN).score(["ab", "abcd"]) == [2.0, 4.0]
    with pytest.raises(RewardServerError, match="HTTP 401") as caught:
        RewardClient(token_server.url, token="nope").score(["ab"])
    assert caught.value.status == 401

    client = triton_client(token_server)
    data = triton_http.InferInput("sentences", [1], "BYTES")
    data.set_data_from_numpy(np.array([b"hello"], dtype=object))
    assert client.infer("reward_model", [data], headers=auth).as_numpy("rewards").tolist() == [[5.0]]
    with pytest.raises(InferenceServerException, match="bearer token"):
        client.infer("reward_model", [data])


def test_body_over_the_limit_is_413_and_gzip_bombs_too() -> None:
    with serve(length_scorer, HTTPSettings(max_body_bytes=1024)) as handle:
        big = json.dumps({"sentences": ["x" * 2000]}).encode()
        status, _, response = http_call(handle.url, "/score", big)
        assert status == 413 and "limit is 1024" in json.loads(response)["error"]
        bomb = gzip.compress(json.dumps({"sentences": ["y" * 100_000]}).encode())  # ~300 bytes on the wire
        assert len(bomb) < 1024
        status, _, response = http_call(handle.url, "/score", bomb, {"Content-Encoding": "gzip"})
        assert status == 413 and "decompressed" in json.loads(response)["error"]
        small = gzip.compress(json.dumps({"sentences": ["zz"]}).encode())
        assert (
            http_call(handle.url, "/score", small, {"Content-Encoding": "gzip"})[2] == b'{"rewards": [2.0]}'
        )


def test_slow_client_does_not_block_others_and_is_cut_off() -> None:
    with serve(length_scorer, HTTPSettings(read_timeout_s=1.5), QUICK_BATCHES) as handle:
        slow = socket.create_connection((handle.host, handle.port))
        try:
            slow.sendall(
                b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"
            )  # 99 bytes never come
            started = time.monotonic()
            assert RewardClient(handle.url, retries=0).score(["abc"]) == [3.0]
            assert time.monotonic() - started < 1.0  # served while the slow client is still stalling
            slow.settimeout(5.0)
            answer = slow.recv(4096)
            assert answer.startswith(b"HTTP/1.1 408")  # the server gave up on the slow body
        finally:
            slow.close()
        assert RewardClient(handle.url, retries=0).score(["ab"]) == [2.0]


def test_scorer_crash_is_500_and_the_server_keeps_serving() -> None:
    def flaky(sentences: list[str]) -> list[float]:
        if "boom" in sentences:
            raise RuntimeError("model exploded")
        return length_scorer(sentences)

    with serve(flaky, batching=QUICK_BATCHES) as handle:
        status, _, response = http_call(handle.url, "/score", json.dumps({"sentences": ["boom"]}).encode())
        assert status == 500 and "model exploded" in json.loads(response)["error"]
        assert RewardClient(handle.url, retries=0).score(["abcd"]) == [4.0]
        samples = parse_samples(http_call(handle.url, "/metrics")[2].decode())
        assert samples["nemotron_reward_scorer_failures_total"] == 1
        assert samples['nemotron_reward_http_errors_total{endpoint="score"}'] == 1


def test_stop_finishes_in_flight_requests_then_refuses() -> None:
    entered = threading.Event()

    def slow(sentences: list[str]) -> list[float]:
        entered.set()
        time.sleep(0.5)
        return length_scorer(sentences)

    handle = serve(slow, batching=QUICK_BATCHES)
    url = handle.url
    with ThreadPoolExecutor(2) as pool:
        in_flight = pool.submit(RewardClient(url, retries=0).score, ["abcdef"])
        assert entered.wait(5)
        stopping = pool.submit(handle.stop)
        assert in_flight.result(10) == [6.0]  # finished, not cut off
        assert stopping.result(10) is True
    with pytest.raises(RewardServerError, match="cannot connect"):
        RewardClient(url, retries=0, timeout=2).score(["x"])


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"PATCH /score HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", b"501"),
        (b"GET /score HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 101 + b"\r\n", b"431"),
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", b"414"),
    ],
)
def test_protocol_errors_from_http_server_are_json_too(raw: bytes, status: bytes) -> None:
    with serve(length_scorer) as handle:
        with socket.create_connection((handle.host, handle.port), timeout=5) as connection:
            connection.sendall(raw)
            answer = b""
            while chunk := connection.recv(65536):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.split(b" ")[1] == status
        assert "error" in json.loads(body)
        assert RewardClient(handle.url, retries=0).score(["ok"]) == [2.0]
