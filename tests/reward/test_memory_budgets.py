"""What one request may cost the servers' memory, read from the real server process (/proc/PID/status): a
3 MB chat message and an 8 MB reward sentence are answered from their tails, and a reward request over a budget
is 413 naming the budget, before its data is decoded. The bound is the issue's: +150 MB of peak RSS (VmHWM) over
the warm server; before the cuts these requests took +570 MB (chat) and +584 MB (reward)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from tests.processes import start_module

from nemotron.core.paths import shipped_root
from nemotron.reward.chat_server import ChatRequest, Completion, serve_chat
from nemotron.reward.transport import HTTPSettings

from .test_hostile import exchange

BOUND_MB = 150
STEP_BODY_LIMIT = str(8 << 20)  # rm/serve's default server.max_body_bytes


def peak_mb(pid: int) -> float:
    """VmHWM: the most resident memory the process has had, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


@contextmanager
def served(module: str, model: Path, tmp_path: Path, *args: str) -> Iterator[tuple[str, int]]:
    """`python -m nemotron.reward.MODULE --model MODEL ARGS` on a free loopback port: (url, pid)."""
    ready, log = tmp_path / f"{module}.json", tmp_path / f"{module}.log"
    env = {k: v for k, v in os.environ.items() if k != "NEMOTRON_REWARD_TOKEN"}
    command = [sys.executable, "-m", f"nemotron.reward.{module}", "--model", str(model), "--threads", "1"]
    with log.open("wb") as out:
        proc = start_module([*command, *args, "--ready-file", str(ready)], env, out)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the server never became ready"
            time.sleep(0.1)
        yield str(json.loads(ready.read_text())["url"]), proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def chat(url: str, content: str) -> dict[str, object]:
    reply = httpx.post(
        url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0},
        timeout=120,
    )
    assert reply.status_code == 200, reply.text[:300]
    answer: dict[str, object] = reply.json()
    return answer


def test_a_3mb_chat_message_is_answered_from_its_tail_within_the_bound(tmp_path: Path) -> None:
    tail = "the movie was great and the plot was fun. " * 200  # ~8,400 characters: more than the context
    message = "the film was awful and boring. " * (3_000_000 // 31) + tail  # ~3 MB
    with served("chat_server", shipped_root() / "tiny" / "sft_policy", tmp_path) as (url, pid):
        expected = chat(url, tail)  # also the warm-up: the model's first call, the handler threads
        before = peak_mb(pid)
        answer = chat(url, message)
        grew = peak_mb(pid) - before
    # The same prompt tokens and the same greedy answer as the tail alone: the context holds only the tail.
    print(f"\nchat server, a 3 MB message: peak RSS +{grew:.0f} MB")
    assert answer["choices"] == expected["choices"] and answer["usage"] == expected["usage"]
    assert grew < BOUND_MB, f"a 3 MB message raised the chat server's peak RSS by {grew:.0f} MB"


def test_an_8mb_sentence_is_scored_from_its_tail_within_the_bound(tmp_path: Path) -> None:
    tail = "the movie was great and the plot was fun " * 100
    sentence = "the film was awful and boring " * (8_000_000 // 30) + tail  # ~8 MB, under 16 MiB
    model = shipped_root() / "tiny" / "reward_model"
    with served("server", model, tmp_path) as (url, pid):
        expected = httpx.post(url + "/score", json={"sentences": [tail]}, timeout=120)
        before = peak_mb(pid)
        reply = httpx.post(url + "/score", json={"sentences": [sentence]}, timeout=120)
        grew = peak_mb(pid) - before
    assert (
        reply.status_code == 200 and reply.json() == expected.json()
    )  # the reward is read at the last token
    assert grew < BOUND_MB, f"an 8 MB sentence raised the reward server's peak RSS by {grew:.0f} MB"


def _tokens_request(rows: int, width: int) -> bytes:
    return json.dumps(
        {
            "inputs": [
                {"name": "tokens", "datatype": "INT64", "shape": [rows, width], "data": [[3] * width] * rows},
                {"name": "sequence_lengths", "datatype": "INT64", "shape": [rows], "data": [width] * rows},
            ]
        },
        separators=(",", ":"),
    ).encode()


def _sentences_request(rows: int) -> bytes:
    data = [f"{i % 100:02d}" for i in range(rows)]
    entry = {"name": "sentences", "datatype": "BYTES", "shape": [rows], "data": data}
    return json.dumps({"inputs": [entry]}, separators=(",", ":")).encode()


@pytest.mark.parametrize(
    ("body", "budget"),
    [
        (
            _tokens_request(1, 3_500_000),
            "1048576 per request (max_request_tokens)",
        ),  # one row of 3.5 M tokens
        (_tokens_request(40_000, 60), "1048576 per request (max_request_tokens)"),  # 2.4 M tokens
        (_sentences_request(1_200_000), "at most 65536 (max_queue_rows)"),  # 1.2 M rows
    ],
    ids=["one long row", "many rows", "too many sentences"],
)
def test_a_reward_request_over_a_budget_is_413_naming_it_within_the_bound(
    tmp_path: Path, body: bytes, budget: str
) -> None:
    assert len(body) < int(STEP_BODY_LIMIT)  # within the body limit: the budget refuses it, not the transport
    model = shipped_root() / "tiny" / "reward_model"
    with served("server", model, tmp_path, "--max-body-bytes", STEP_BODY_LIMIT) as (url, pid):
        infer = url + "/v2/models/reward_model/infer"
        assert httpx.post(url + "/score", json={"sentences": ["the movie"]}, timeout=60).status_code == 200
        before = peak_mb(pid)
        reply = httpx.post(infer, content=body, timeout=120)
        grew = peak_mb(pid) - before
        small = httpx.post(url + "/score", json={"sentences": ["the movie"]}, timeout=60)
    print(f"\nreward server, {len(body) / 1e6:.1f} MB refused ({reply.status_code}): peak RSS +{grew:.0f} MB")
    assert reply.status_code == 413 and budget in reply.json()["error"], reply.text[:300]
    assert small.status_code == 200  # and the server serves on
    assert grew < BOUND_MB, f"a refused request raised the reward server's peak RSS by {grew:.0f} MB"


class EchoModel:
    def complete(self, request: ChatRequest) -> Completion:
        return Completion(request.messages[-1][1][:8], "stop", 1, 1)


def test_the_chat_server_refuses_a_body_over_its_limit_before_reading_it() -> None:
    """The transport's limit, on the chat server too: a declared length over it is 413 at once (the body is never
    sent), and a chunked body is cut as it streams, once past the limit."""
    with serve_chat(EchoModel(), HTTPSettings(max_body_bytes=4096)) as handle:
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        started = time.monotonic()
        answer = exchange(handle, head + b"Content-Length: 100000000\r\n\r\n", 10.0, 1.0)
        assert answer.startswith(b"HTTP/1.1 413") and time.monotonic() - started < 5.0, answer[:200]
        chunk = b"1000\r\n" + b"x" * 4096 + b"\r\n"
        answer = exchange(handle, head + b"Transfer-Encoding: chunked\r\n\r\n" + chunk * 64, 10.0, 1.0)
        assert answer.startswith(b"HTTP/1.1 413") and b"limit of 4096 bytes" in answer, answer[:200]
        reply = httpx.post(
            handle.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hello"}]}
        )
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == "hello"
