"""The servers against hostile clients, measured: the figures of docs/reliability.md ("Hostile clients").

    python bench/hostile_servers.py                 # ~1 min on 2 cores
    python bench/hostile_servers.py --json PATH     # also write the figures

Starts `python -m nemotron.reward.server` on the shipped tiny reward model with a 1,024-file limit (soft and hard,
so it cannot raise it) and a 5 s request deadline, and `python -m nemotron.reward.chat_server` on the shipped tiny
SFT policy, then: opens 3,000 idle sockets and times 4 normal requests beside them; drips a request head and a
request body a byte every 0.5 s; sends malformed, oversized and chunked requests, and to both servers each
request-smuggling form with a GET hidden behind its body; asks for a model's readiness without the token under the
right and a wrong name; and sends 500 concurrent n=8 chat requests.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from nemotron.core.paths import shipped_root

TOKEN = "hostile-bench-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def start(
    module: str, model: str, work: Path, *args: str, limit: int | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    ready = work / f"{module}.json"

    def small_file_limit() -> None:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    command = [
        sys.executable,
        "-m",
        f"nemotron.reward.{module}",
        "--model",
        str(shipped_root() / "tiny" / model),
    ]
    process = subprocess.Popen(
        [*command, "--threads", "1", "--ready-file", str(ready), *args],
        env={**os.environ, "NEMOTRON_REWARD_TOKEN": TOKEN},
        stdout=subprocess.DEVNULL,
        stderr=(work / f"{module}.log").open("wb"),
        preexec_fn=small_file_limit,
    )
    deadline = time.monotonic() + 120
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{module} did not start: {(work / f'{module}.log').read_text()[-2000:]}")
        time.sleep(0.1)
    return process, str(json.loads(ready.read_text())["url"])


def raw(url: str, data: bytes, timeout: float = 10.0) -> tuple[int | None, float]:
    """Send `data` on a fresh connection: (the answer's status or None when closed unanswered, seconds)."""
    host, port = url.removeprefix("http://").split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(data)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
                if b"\r\n\r\n" in answer:
                    break
        except (ConnectionResetError, TimeoutError):
            pass
    return (int(answer.split(b" ", 2)[1]) if answer else None), time.monotonic() - started


def drip(url: str, prefix: bytes, data: bytes, interval: float) -> tuple[int | None, float]:
    """Send `prefix`, then `data` a byte every `interval` s until the server answers or closes: (status or None,
    seconds)."""
    host, port = url.removeprefix("http://").split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=120) as sock:
        sock.sendall(prefix)
        sock.settimeout(interval)
        for byte in data:
            try:
                sock.sendall(bytes([byte]))
                answer = sock.recv(65536)
                return (int(answer.split(b" ", 2)[1]) if answer else None), time.monotonic() - started
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                return None, time.monotonic() - started
    return -1, time.monotonic() - started  # never cut


def answers(url: str, data: bytes) -> dict[str, Any]:
    """Send `data` on a fresh connection and read until the server closes it: the statuses of every answer."""
    host, port = url.removeprefix("http://").split(":")
    started, received, closed = time.monotonic(), b"", False
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(data)
        try:
            while chunk := sock.recv(65536):
                received += chunk
            closed = True
        except (ConnectionResetError, TimeoutError):
            pass
    statuses = [int(s) for s in re.findall(rb"HTTP/1\.1 (\d{3}) ", received)]
    close = b"connection: close" in received.lower()
    return {
        "answers": statuses,
        "connection_close": close,
        "closed": closed,
        "seconds": round(time.monotonic() - started, 3),
    }


# Answered 404 if the server reads the body another way than a proxy in front of it might.
SMUGGLED = b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n"
HIDDEN = b"0\r\n\r\n" + SMUGGLED
FRAMING_FORMS = {  # each: header lines, body, HTTP version
    "CL.TE": ([b"Content-Length: %d" % len(HIDDEN), b"Transfer-Encoding: chunked"], HIDDEN, b"1.1"),
    "TE.CL": (
        [b"Transfer-Encoding: chunked", b"Content-Length: 3"],
        b"%x\r\nabc%s\r\n0\r\n\r\n" % (len(SMUGGLED) + 3, SMUGGLED),
        b"1.1",
    ),
    "CL.TE, a tab before the TE value": (
        [b"Content-Length: %d" % len(HIDDEN), b"Transfer-Encoding:\tchunked"],
        HIDDEN,
        b"1.1",
    ),
    "CL.TE, upper case": (
        [b"CONTENT-LENGTH: %d" % len(HIDDEN), b"TRANSFER-ENCODING: CHUNKED"],
        HIDDEN,
        b"1.1",
    ),
    "TE twice": ([b"Transfer-Encoding: chunked"] * 2, HIDDEN, b"1.1"),
    "TE: gzip, chunked": ([b"Transfer-Encoding: gzip, chunked"], HIDDEN, b"1.1"),
    "TE on HTTP/1.0": ([b"Transfer-Encoding: chunked"], HIDDEN, b"1.0"),
    "chunk size zz": ([b"Transfer-Encoding: chunked"], b"zz\r\nabc\r\n" + HIDDEN, b"1.1"),
    "Content-Length: 1, 1": ([b"Content-Length: 1, 1"], b"a" + SMUGGLED, b"1.1"),
    "Content-Length twice": ([b"Content-Length: 1"] * 2, b"a" + SMUGGLED, b"1.1"),
}


def framing_cases(url: str, path: str) -> dict[str, Any]:
    """Each request-smuggling form, with a GET hidden behind the body: what the server answered before it closed."""
    figures = {}
    for name, (lines, body, version) in FRAMING_FORMS.items():
        head = b"POST %s HTTP/%s\r\nHost: x\r\nAuthorization: Bearer %s\r\n" % (
            path.encode(),
            version,
            TOKEN.encode(),
        )
        figures[name] = answers(url, head + b"".join(line + b"\r\n" for line in lines) + b"\r\n" + body)
    return figures


def idle_sockets(url: str, count: int) -> dict[str, Any]:
    host, port = url.removeprefix("http://").split(":")
    sockets = [socket.create_connection((host, int(port)), timeout=10) for _ in range(count)]
    try:
        time.sleep(1.0)
        answered, slowest = 0, 0.0
        for _ in range(4):
            started = time.monotonic()
            reply = httpx.post(
                url + "/score", json={"sentences": ["the movie was great"]}, headers=AUTH, timeout=30
            )
            answered += reply.status_code == 200
            slowest = max(slowest, time.monotonic() - started)
    finally:
        for sock in sockets:
            sock.close()
    return {"idle_sockets": count, "answered_of_4": answered, "slowest_s": round(slowest, 3)}


def reward_cases(url: str) -> dict[str, Any]:
    head = "POST /score HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN + "\r\n"
    body = b'{"sentences": ["the movie was great"]}'
    chunked = (
        head.encode() + b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    )
    cases: dict[str, Callable[[], tuple[int | None, float]]] = {
        "chunked body": lambda: raw(url, chunked),
        "HEAD /v2/health/ready": lambda: raw(url, b"HEAD /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"),
        "Content-Length 100 MB": lambda: raw(url, head.encode() + b"Content-Length: 100000000\r\n\r\n"),
        "100 KB header": lambda: raw(
            url, b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: " + b"a" * 100_000 + b"\r\n\r\n"
        ),
        "NUL in a header": lambda: raw(url, b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n"),
        "folded header": lambda: raw(url, b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n"),
        "no Host": lambda: raw(url, b"GET /health HTTP/1.1\r\n\r\n"),
        "two Hosts": lambda: raw(url, b"GET /health HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n"),
        "ready, right model, no token": lambda: raw(
            url, b"GET /v2/models/reward_model/ready HTTP/1.1\r\nHost: x\r\n\r\n"
        ),
        "ready, wrong model, no token": lambda: raw(
            url, b"GET /v2/models/guess/ready HTTP/1.1\r\nHost: x\r\n\r\n"
        ),
        "head dripped, 1 byte / 0.5 s": lambda: drip(
            url, b"", b"GET /health HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 200, 0.5
        ),
        "body dripped, 1 byte / 0.5 s": lambda: drip(
            url, head.encode() + b"Content-Length: 40\r\n\r\n", body, 0.5
        ),
    }
    figures = {}
    for name, case in cases.items():
        status, seconds = case()
        figures[name] = {"status": status, "seconds": round(seconds, 3)}
    return figures


def chat_burst(url: str, requests: int) -> dict[str, Any]:
    body = {
        "model": "judge",
        "messages": [{"role": "user", "content": "the movie was"}],
        "n": 8,
        "max_tokens": 8,
    }

    def one(_: int) -> tuple[int, float]:
        started = time.monotonic()
        reply = httpx.post(url + "/v1/chat/completions", json=body, headers=AUTH, timeout=300)
        return reply.status_code, time.monotonic() - started

    with ThreadPoolExecutor(requests) as pool:
        results = list(pool.map(one, range(requests)))
    ok = [s for code, s in results if code == 200]
    return {
        "requests": requests,
        "200": len(ok),
        "503": sum(code == 503 for code, _ in results),
        "other": sum(code not in (200, 503) for code, _ in results),
        "slowest_200_s": round(max(ok, default=0.0), 2),
        "slowest_503_s": round(max((s for code, s in results if code == 503), default=0.0), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", dest="json_path", type=Path)
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 65536
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this process holds 3,000 sockets
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="nemotron-hostile-") as tmp:
        work = Path(tmp)
        reward, url = start("server", "reward_model", work, "--request-deadline-s", "5", limit=1024)
        try:
            figures["idle sockets at a 1,024-file limit"] = idle_sockets(url, 3000)
            figures["requests"] = reward_cases(url)
            figures["request smuggling, reward server"] = framing_cases(url, "/score")
        finally:
            reward.terminate()
            reward.wait(60)
        log = (work / "server.log").read_text()
        figures["reward server log"] = {"bytes": len(log), "tracebacks": log.count("Traceback")}
        chat, chat_url = start("chat_server", "sft_policy", work, "--max-queue", "64")
        try:
            figures["request smuggling, chat server"] = framing_cases(chat_url, "/v1/chat/completions")
            figures["500 concurrent n=8 chat requests, max_queue 64"] = chat_burst(chat_url, 500)
        finally:
            chat.terminate()
            chat.wait(60)
    print(json.dumps(figures, indent=1))
    if args.json_path:
        args.json_path.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
