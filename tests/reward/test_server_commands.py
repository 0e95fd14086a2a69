"""`python -m nemotron.reward.server` and `python -m nemotron.reward.chat_server` as real processes: the shipped
tiny reward model served as is, normal requests answered beside hundreds of idle sockets at a low file limit,
and where the bearer token may come from."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.processes import start_module

from nemotron.core.paths import shipped_root

TINY_REWARD_MODEL = shipped_root() / "tiny" / "reward_model"
TOKEN = "command-token-123456"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "NEMOTRON_REWARD_TOKEN"}
    return {**env, **extra}


def _command(module: str, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        f"nemotron.reward.{module}",
        "--model",
        str(TINY_REWARD_MODEL),
        "--threads",
        "1",
        *args,
    ]


def _wait_for_url(proc: Any, ready: Path, log: Path, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while not ready.exists():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the server never became ready"
        time.sleep(0.1)
    return str(json.loads(ready.read_text())["url"])


def _small_file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))  # soft and hard: the server cannot raise it


@pytest.fixture
def low_limit_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    ready, log = tmp_path / "ready.json", tmp_path / "server.log"
    with log.open("wb") as out:
        # The default --max-length (512) is over the tiny model's 32 positions: capped, not refused.
        proc = subprocess.Popen(
            _command("server", "--ready-file", str(ready)),
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_small_file_limit,
        )
    try:
        yield _wait_for_url(proc, ready, log), log
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_hundreds_of_idle_sockets_at_a_low_file_limit_leave_normal_requests_answered(
    low_limit_server: tuple[str, Path],
) -> None:
    url, log = low_limit_server
    host, port = url.removeprefix("http://").split(":")
    idle = []
    try:
        for _ in range(400):  # more than the server's 256 file descriptors
            idle.append(socket.create_connection((host, int(port)), timeout=5))
        time.sleep(0.5)
        started = time.monotonic()
        texts = ["the movie was great", "the movie was awful"]
        for _ in range(4):
            reply = httpx.post(
                url + "/score", json={"sentences": texts}, headers={"Connection": "close"}, timeout=10
            )
            assert reply.status_code == 200 and len(reply.json()["rewards"]) == 2
        assert time.monotonic() - started < 10.0
        metrics = httpx.get(url + "/metrics", timeout=10).text
        assert "nemotron_reward_http_evicted_connections_total" in metrics
    finally:
        for sock in idle:
            sock.close()
    text = log.read_text()
    assert "Traceback" not in text and "out of system resource" not in text, text[-3000:]


@pytest.mark.parametrize("module", ["server", "chat_server"])
def test_a_public_address_without_a_token_is_refused_before_loading_the_model(module: str) -> None:
    result = subprocess.run(
        _command(module, "--host", "0.0.0.0"), env=_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: refusing to serve on 0.0.0.0 without a bearer token: set $NEMOTRON_REWARD_TOKEN or give a token "
        "file (mode 0600), or bind 127.0.0.1"
    ]


def test_a_token_on_the_command_line_is_refused() -> None:
    result = subprocess.run(
        _command("server", "--token", TOKEN), env=_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "--token is refused" in result.stderr


def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o644)
    result = subprocess.run(
        _command("server", "--host", "0.0.0.0", "--token-file", str(token_file)),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "chmod 600" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("source", ["env", "file"])
def test_the_token_from_the_environment_or_a_0600_file(tmp_path: Path, source: str) -> None:
    ready, log = tmp_path / "ready.json", tmp_path / "server.log"
    args = ["--host", "0.0.0.0", "--ready-file", str(ready)]
    env = _env()
    if source == "env":
        env["NEMOTRON_REWARD_TOKEN"] = TOKEN
    else:
        token_file = tmp_path / "token"
        token_file.write_text(TOKEN + "\n")
        token_file.chmod(0o600)
        args += ["--token-file", str(token_file)]
    with log.open("wb") as out:
        proc = start_module(_command("server", *args), env, out)
    try:
        url = _wait_for_url(proc, ready, log).replace("0.0.0.0", "127.0.0.1")
        body = {"sentences": ["the movie was great"]}
        assert httpx.post(url + "/score", json=body, timeout=10).status_code == 401
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert httpx.post(url + "/score", json=body, headers=auth, timeout=10).status_code == 200
        assert TOKEN not in " ".join(proc.args)  # type: ignore[arg-type]
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_a_server_raises_its_soft_file_limit_to_the_hard_one_and_caps_connections_under_it() -> None:
    script = """
import resource, sys
from nemotron.reward.server import serve
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
with serve(lambda texts: [0.0] * len(texts)) as handle:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(soft == hard, handle.max_connections)
"""
    result = subprocess.run(
        [sys.executable, "-c", script], env=_env(), capture_output=True, text=True, timeout=60
    )
    raised, cap = result.stdout.split()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert raised == "True", result.stderr
    assert int(cap) == min(4096, (hard - 64) // 2) if hard != resource.RLIM_INFINITY else int(cap) == 4096


def test_a_port_in_use_is_exit_2_in_one_line_for_the_command_and_the_step(tmp_path: Path) -> None:
    """It was exit 1 and a traceback (OSError from bind)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        model = shipped_root() / "tiny" / "reward_model"
        command = subprocess.run([sys.executable, "-m", "nemotron.reward.server", "--model", str(model), "--port",
                                  str(port)], capture_output=True, text=True, timeout=120)  # fmt: skip
        env = {**os.environ, "NEMOTRON_HOME": str(tmp_path / "home")}
        step = subprocess.run([sys.executable, "-m", "nemotron", "steps", "run", "rm/serve", "-c", "tiny",
                               f"server.port={port}"], capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    for done in (command, step):
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert f"cannot serve on 127.0.0.1:{port}: Address already in use" in done.stderr


def test_batching_that_breaks_the_batchers_rules_is_exit_2_for_the_command_and_the_step(
    tmp_path: Path,
) -> None:
    """It was a traceback and exit 1 once the model had loaded (the step: after its job was written)."""
    command = subprocess.run(_command("server", "--max-batch-size", "4", "--preferred-batch-size", "8",
                                      "--max-queue-rows", "2"), env=_env(), capture_output=True, text=True,
                             timeout=120)  # fmt: skip
    home = tmp_path / "home"
    step = subprocess.run([sys.executable, "-m", "nemotron", "steps", "run", "rm/serve", "-c", "tiny",
                           "server.max_batch_size=4", "server.preferred_batch_size=8", "server.max_queue_rows=2"],
                          capture_output=True, text=True, env={**os.environ, "NEMOTRON_HOME": str(home)},
                          timeout=120)  # fmt: skip
    broken = "preferred_batch_size must be in [1, max_batch_size=4], got 8; max_queue_rows must be at least max_batch_size=4, got 2"  # fmt: skip
    assert command.returncode == 2 and command.stderr.splitlines() == [f"error: batching: {broken}"]
    assert step.returncode == 2, step.stderr[-2000:]
    assert step.stderr.splitlines() == [
        "error: invalid config for step 'rm/serve':",
        f"  - server: {broken} [from cli]",
    ]
    assert not (home / "jobs").exists()
