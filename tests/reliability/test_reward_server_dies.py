"""The reward server dies mid-run: the client retries, then the step stops with a clear message naming the server
(exit 3) and a resumable checkpoint; with the server back, resume finishes the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from tests.processes import start_module

from nemotron.core.paths import shipped_root


@contextmanager
def reward_server(tmp: Path) -> Iterator[tuple[str, Any]]:
    ready = tmp / f"ready-{time.monotonic_ns()}.json"
    cmd = [sys.executable, "-m", "nemotron.reward.server", "--model", str(shipped_root() / "tiny" / "reward_model"),
           "--port", "0", "--threads", "1", "--max-length", "32", "--ready-file", str(ready)]  # fmt: skip
    proc = start_module(cmd, os.environ, None)  # a session of its own either way
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        yield json.loads(ready.read_text())["url"], proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.slow
def test_server_dies_step_stops_cleanly_and_resume_finishes(home: Path, tmp_path: Path, run_cli: Any) -> None:
    base = (
        "steps run rl/reinforce -c tiny trainer.max_steps=12 checkpoint.save_interval=2 "
        "eval.num_prompts=0 trainer.num_prompts_per_step=4 reward.server.retries=2 reward.server.timeout_s=2"
    ).split()
    with reward_server(tmp_path) as (url, server):
        env = {**os.environ, "COLUMNS": "200"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "nemotron", *base, f"reward.server.url={url}"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            metrics = list((home / "jobs").glob("*/metrics.jsonl")) if (home / "jobs").exists() else []
            if metrics and sum(1 for _ in metrics[0].open()) >= 5:
                break
            time.sleep(0.05)
        os.killpg(server.pid, signal.SIGKILL)  # the server dies mid-run
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err[-2000:]
    assert f"reward server at {url}" in err and "Traceback" not in err
    assert "the same command again goes on from its last checkpoint if it saved one" in err
    (killed,) = (home / "jobs").iterdir()
    assert json.loads((killed / "status.json").read_text())["state"] == "failed"
    assert (killed / "checkpoints" / "latest").is_file()

    with reward_server(tmp_path) as (new_url, _):
        # the same command, pointed at the new server (where rewards come from may move on resume)
        r = run_cli(*base, f"reward.server.url={new_url}", timeout=600)
    assert r.code == 0, r.err[-2000:]
    assert f"note: resuming {killed.name} (failed) from its checkpoint" in r.err, r.err[-2000:]
    resumed = max((home / "jobs").iterdir(), key=lambda p: p.stat().st_mtime_ns)
    steps = [json.loads(x)["step"] for x in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 12 and steps[0] > 1
    assert json.loads(run_cli("jobs", "show", resumed.name, "--json").out)["produced"] == [
        "tiny_reinforce_policy:v1"
    ]
