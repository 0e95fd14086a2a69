"""No orphans, no stuck records: a step killed with -9 takes its reward server with it, and a job whose
launcher was killed with -9 is recorded as failed by `jobs status` and `jobs ls` instead of staying running."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nemotron.core.procs import is_alive


def _env(home: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "NEMOTRON_HOME": str(home), "COLUMNS": "200", **extra}


def _wait(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _submit(env: dict[str, str], *args: str) -> Path:
    done = subprocess.run(
        [sys.executable, "-m", "nemotron", "steps", "run", *args, "-b", "local"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return Path(env["NEMOTRON_HOME"]) / "jobs" / done.stdout.strip()


def _status(job_dir: Path) -> dict[str, object]:
    return dict(json.loads((job_dir / "status.json").read_text()))


@pytest.mark.slow
def test_kill_9_of_the_step_takes_its_reward_server_with_it(tmp_path: Path) -> None:
    job_dir = _submit(_env(tmp_path / "home"), "rl/reinforce", "-c", "tiny", "trainer.max_steps=500")
    log = job_dir / "logs" / "step.log"
    _wait(lambda: log.is_file() and "reward server (pid" in log.read_text(), 120, "the reward server")
    server = int(re.search(r"reward server \(pid (\d+)\) ready", log.read_text()).group(1))  # type: ignore[union-attr]
    step = _status(job_dir)["pid"]
    assert isinstance(step, int) and is_alive(server) and is_alive(step)

    os.kill(step, signal.SIGKILL)

    _wait(lambda: not is_alive(server), 15, f"the reward server (pid {server}) to exit")
    _wait(lambda: _status(job_dir).get("state") == "failed", 15, "the launcher to record the failure")


@pytest.mark.slow
def test_kill_9_of_an_asynchronous_step_takes_its_generator_with_it(tmp_path: Path) -> None:
    job_dir = _submit(_env(tmp_path / "home"), "rl/reinforce", "-c", "tiny", "trainer.max_steps=500",
                      "reinforce.async_grpo.enabled=true", "reinforce.use_importance_sampling_correction=true")  # fmt: skip
    log = job_dir / "logs" / "step.log"
    _wait(lambda: log.is_file() and "step 2/" in log.read_text(), 180, "the second step")
    generator = int(re.search(r"generator process \(pid (\d+)\)", log.read_text()).group(1))  # type: ignore[union-attr]
    step = _status(job_dir)["pid"]
    spawned = "spawn_main"  # the generator's command line: multiprocessing's spawn
    assert isinstance(step, int) and is_alive(generator, spawned) and is_alive(step)

    os.kill(step, signal.SIGKILL)

    _wait(lambda: not is_alive(generator, spawned), 15, f"the generator (pid {generator}) to exit")


def test_kill_9_of_the_launcher_group_is_recorded_as_failed(tmp_path: Path, fixture_steps: Path) -> None:
    env = _env(tmp_path / "home", NEMOTRON_STEPS_PATH=str(fixture_steps))
    job_dir = _submit(env, "test/count", "-c", "tiny", "trainer.max_steps=100", "trainer.sleep_s=0.5")
    _wait(lambda: _status(job_dir).get("state") == "running", 60, "the step to start")
    launcher, step = _status(job_dir)["launcher_pid"], _status(job_dir)["pid"]
    assert isinstance(launcher, int) and isinstance(step, int)

    os.killpg(launcher, signal.SIGKILL)  # the launcher's whole group; the step is in a session of its own

    _wait(lambda: not is_alive(step), 15, f"the step (pid {step}) to follow its launcher")
    assert _status(job_dir)["state"] == "running"  # nobody recorded the end ...
    shown = subprocess.run(
        [sys.executable, "-m", "nemotron", "jobs", "ls", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert [row["state"] for row in json.loads(shown.stdout)] == ["failed"]  # ... until a listing looks
    status = _status(job_dir)
    assert status["state"] == "failed" and "gone without recording an end" in str(status["error"])
    again = subprocess.run(
        [sys.executable, "-m", "nemotron", "jobs", "status", job_dir.name],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "failed" in again.stdout
