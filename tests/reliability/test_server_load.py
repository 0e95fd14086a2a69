"""The reward server under load and under slow clients, on 127.0.0.1 with real sockets.

- 64 clients for 30 s (slow): `bench/load_reward_server.py` drives a server process; zero errors, no client
  starved, the server's RSS flat under load, and a clean SIGTERM. The figures go to the terminal.
- Slow clients: connections that drip their request a byte a second are cut off at the request deadline,
  while a normal client keeps its usual latency through the same batcher.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from nemotron.reward.client import RewardClient
from nemotron.reward.server import FULL_BATCHES, serve
from nemotron.reward.transport import HTTPSettings

REPO = Path(__file__).resolve().parents[2]
RSS_GROWTH_BOUND_MB = 20.0  # over ~50k requests: a leak of 400 bytes a request would show
READ_TIMEOUT_S = 2.0  # longer than the drip interval, so the socket timeout alone never fires
DEADLINE_S = 3.0
DRIP_INTERVAL_S = 1.0


@pytest.mark.slow
def test_64_clients_for_30_s_with_zero_errors_and_flat_memory(
    tmp_path: Path, report: Callable[[str], None]
) -> None:
    out = tmp_path / "load.json"
    command = [
        sys.executable,
        str(REPO / "bench" / "load_reward_server.py"),
        "--clients",
        "64",
        "--seconds",
        "30",
    ]
    proc = subprocess.run(
        [*command, "--json", str(out)], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    figures = json.loads(out.read_text())
    assert figures["errors"] == 0, figures["first_errors"]
    assert figures["server_exit_code"] == 0  # SIGTERM after the load: drained and exited cleanly
    assert figures["min_client_requests"] >= 30, "a client got less than one answer a second"
    assert set(figures["requests_by_mode"]) == {"binary sentences", "token ids", "json /score"}
    growth = figures["rss_end_mb"] - figures["rss_warm_mb"]
    assert growth < RSS_GROWTH_BOUND_MB, f"server RSS grew {growth:.1f} MB under load"
    for line in proc.stdout.splitlines():
        report(f"reward-server load: {line}")


@dataclass
class Dripped:
    """What one slow client saw: when it held its connection (its first byte sent), when and after how many bytes
    the server answered or closed, and what it sent."""

    holding_at: float = 0.0
    ended_at: float = 0.0
    sent: int = 0
    answer: bytes = b""

    @property
    def elapsed(self) -> float:
        return self.ended_at - self.holding_at


def drip(port: int, payload: bytes, head: bytes = b"") -> Dripped:
    """Send `head` at once, then `payload` one byte per DRIP_INTERVAL_S until the server answers or closes.

    Gives up after DEADLINE_S + 4 bytes (answer "(still open)"), so a server that never cuts the client off fails
    the test instead of hanging it.
    """
    seen = Dripped()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        seen.holding_at = time.monotonic()
        conn.sendall(head)
        for byte in payload[: int(DEADLINE_S / DRIP_INTERVAL_S) + 4]:
            try:
                conn.sendall(bytes([byte]))
            except OSError:
                break
            seen.sent += 1
            readable, _, _ = select.select([conn], [], [], DRIP_INTERVAL_S)
            if readable:
                break
        else:
            seen.ended_at, seen.answer = time.monotonic(), b"(still open)"
            return seen
        try:
            seen.answer = conn.recv(4096)
        except ConnectionResetError:
            seen.answer = b""
        seen.ended_at = time.monotonic()
        return seen


def test_slow_clients_are_cut_off_at_the_deadline_and_do_not_block_the_batcher() -> None:
    """Measured so that other load on the machine (a training test on the other worker) cannot fail it: the cut-off
    by the bytes a slow client got to send; the normal client by what it got answered while every slow client held
    its connection, and by its latency against a twin server without slow clients, asked alternately."""
    batches: list[int] = []

    def scorer(texts: list[str]) -> list[float]:
        batches.append(len(texts))
        return [float(len(t)) for t in texts]

    def twin_scorer(texts: list[str]) -> list[float]:
        return [float(len(t)) for t in texts]

    http = HTTPSettings(read_timeout_s=READ_TIMEOUT_S, request_deadline_s=DEADLINE_S)
    batching = replace(FULL_BATCHES, max_queue_delay_ms=1.0)
    with serve(scorer, http, batching) as handle, serve(twin_scorer, http, batching) as twin_handle:
        client = RewardClient(handle.url, retries=0, timeout=10)
        twin = RewardClient(twin_handle.url, retries=0, timeout=10)

        def timed(to: RewardClient) -> tuple[float, float]:
            started = time.monotonic()
            assert to.score(["abc", "de"]) == [3.0, 2.0]
            return started, time.monotonic()

        for _ in range(10):  # warm both
            timed(client), timed(twin)
        body_head = b"POST /v2/models/reward_model/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
        results: dict[str, Dripped] = {}

        def slow_client(name: str, payload: bytes, head: bytes) -> None:
            results[name] = drip(handle.port, payload, head)

        # Ten send their head and drip the body; two drip the head itself.
        slow = [
            threading.Thread(target=slow_client, args=(f"body {i}", b"{" * 1000, body_head))
            for i in range(10)
        ]
        slow += [threading.Thread(target=slow_client, args=(f"head {i}", body_head, b"")) for i in range(2)]
        for thread in slow:
            thread.start()
        during: list[tuple[float, float]] = []
        twin_during: list[tuple[float, float]] = []
        batches_before = len(batches)
        while any(thread.is_alive() for thread in slow):
            twin_during.append(timed(twin))
            during.append(timed(client))
            time.sleep(0.01)
        for thread in slow:
            thread.join(10)

    assert len(results) == 12
    for name, seen in results.items():
        # Cut off at the deadline, never before it. The per-read timeout never fires (a byte comes every second);
        # a server without the deadline would take every byte offered and stay open.
        assert seen.elapsed > DEADLINE_S - 0.3, (name, seen)
        assert seen.answer != b"(still open)" and seen.sent <= DEADLINE_S / DRIP_INTERVAL_S + 1, (name, seen)
        if name.startswith("body"):
            assert seen.answer.startswith(b"HTTP/1.1 408"), (name, seen)  # the body never came: 408
        else:
            assert seen.answer == b"", (name, seen)  # the head never came: the connection is simply closed
    # Meanwhile the normal client went through the batcher: requests answered while all twelve held their
    # connections (a server whose threads or batcher waited on them would answer none before the first cut-off).
    held_from = max(seen.holding_at for seen in results.values())
    first_cut = min(seen.ended_at for seen in results.values())
    window = [i for i, (start, end) in enumerate(during) if start >= held_from and end <= first_cut]
    assert len(window) >= 10, (len(window), len(during), first_cut - held_from)
    assert len(batches) - batches_before >= len(during)
    # and about as fast as the twin, asked just before each request on the same machine at the same moment
    ours = statistics.median(during[i][1] - during[i][0] for i in window)
    usual = statistics.median(twin_during[i][1] - twin_during[i][0] for i in window)
    assert ours < 3 * usual + 0.005, (ours, usual)


def test_the_deadline_is_per_request_and_idle_time_between_requests_does_not_count() -> None:
    """A keep-alive connection may idle (under the read timeout) between requests longer than the deadline."""
    with serve(
        lambda texts: [1.0] * len(texts), HTTPSettings(read_timeout_s=2.0, request_deadline_s=0.5)
    ) as handle:
        connection = http.client.HTTPConnection(handle.host, handle.port, timeout=10)
        try:
            for _ in range(2):
                connection.request("POST", "/score", json.dumps({"sentences": ["a"]}))
                response = connection.getresponse()
                assert response.status == 200 and json.loads(response.read()) == {"rewards": [1.0]}
                time.sleep(1.0)  # idle: twice the deadline, half the read timeout
        finally:
            connection.close()
