"""Liveness of NeMo-RL on Lepton (launch/ray_watchdog.py), for real: the watchdog file that the Ray job ships runs
around a real driver process on a real local Ray cluster of two raylets; freezing (a hung node) or killing (a
dead node) every process of the second raylet fails the job within the bound, with liveness.json naming that node; the Lepton stub then
reports the Ray job FAILED, and `jobs status` and `jobs ls` agree on `failed` with the watchdog's record."""

from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from nemotron.core.procs import free_port

INTERVAL_S, TIMEOUT_S = 1, 4
PROFILES = (
    f'[lep2]\nextends = "lepton_rl"\nnodes = 2\nheartbeat_interval_s = {INTERVAL_S}\n'
    f"heartbeat_timeout_s = {TIMEOUT_S}\n"
)


def _raylet(node_manager_port: int, *args: str) -> subprocess.Popen[bytes]:
    """`ray start --block` in its own session (ended by its group), ports of its own (other tests may run Ray)."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    ports = ["--node-manager-port", str(node_manager_port), "--dashboard-agent-listen-port", str(free_port())]
    ports += ["--metrics-export-port", str(free_port()), "--runtime-env-agent-port", str(free_port())]
    return subprocess.Popen(
        ["ray", "start", "--block", "--num-cpus=1", *ports, *args],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _end(proc: subprocess.Popen[bytes]) -> None:
    try:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, psutil.NoSuchProcess):
        pass
    proc.wait(10)


@pytest.fixture
def ray_cluster() -> Iterator[tuple[str, subprocess.Popen[bytes], int]]:
    """A head and a worker raylet on this machine: (address, the worker's `ray start`, its node manager port)."""
    temp = tempfile.mkdtemp(prefix="/tmp/nlv")  # Ray's socket paths must stay short
    port = free_port()
    address = f"127.0.0.1:{port}"
    head = _raylet(
        free_port(),
        "--head",
        f"--port={port}",
        "--node-ip-address=127.0.0.1",
        "--include-dashboard=false",
        f"--ray-client-server-port={free_port()}",
        f"--temp-dir={temp}",
    )
    worker_port = free_port()
    try:
        time.sleep(3)
        worker = _raylet(
            worker_port, f"--address={address}", "--node-ip-address=127.0.0.1", f"--temp-dir={temp}"
        )
        yield address, worker, worker_port
    finally:
        if "worker" in locals():
            _end(worker)
        _end(head)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture
def profiles(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "env.toml").write_text(PROFILES)
    monkeypatch.setenv("NEMOTRON_ENV_FILE", str(tmp_path / "env.toml"))


def _break(proc: subprocess.Popen[bytes], how: str) -> None:
    """Every process of that raylet (the raylet, its workers, the heartbeat actor): stopped (a node that hangs)
    or killed (a node that dies)."""
    for p in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
        p.suspend() if how == "frozen" else p.kill()


def _resume(proc: subprocess.Popen[bytes]) -> None:
    try:
        for p in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
            p.resume()
    except psutil.NoSuchProcess:
        pass


@pytest.mark.parametrize("how", ["frozen", "killed"])
def test_a_lost_node_fails_the_lepton_ray_job_within_the_bound(
    how: str,
    nemotron: Any,
    submitted: Callable[..., str],
    profiles: None,
    home: Path,
    lepton_api: Any,
    tmp_path: Path,
    ray_cluster: tuple[str, subprocess.Popen[bytes], int],
) -> None:
    job_id = submitted("rl/rlhf", "-c", "default", "-b", "lep2")
    (ray_job,) = lepton_api.ray_jobs.values()
    entry = ray_job["entrypoint"]
    assert (
        "ray_watchdog.py --job-dir " in entry
        and f"--interval {INTERVAL_S} --timeout {TIMEOUT_S} --progress 600,5,1800,1800,1800 --step-line "
        in entry
        and " -- bash " in entry
    )
    assert entry.endswith("/ray_driver.sh")
    (package,) = lepton_api.packages.values()
    shipped = tmp_path / "working_dir"
    zipfile.ZipFile(io.BytesIO(package)).extractall(shipped)

    # the head's side of the Ray job: the shipped watchdog around a real driver, in a job dir of its own
    address, worker, worker_port = ray_cluster
    job_dir = tmp_path / "shared" / "job"
    job_dir.mkdir(parents=True)
    driver = f"echo $$ > {shlex.quote(str(job_dir / 'driver.pid'))}; exec sleep 600"
    watchdog = subprocess.Popen(
        [
            sys.executable,
            str(shipped / "ray_watchdog.py"),
            "--job-dir",
            str(job_dir),
            "--interval",
            str(INTERVAL_S),
            "--timeout",
            str(TIMEOUT_S),
            "--",
            "bash",
            "-c",
            driver,
        ],
        env={**os.environ, "RAY_ADDRESS": address, "RAY_AUTH_MODE": "disabled"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        beats: list[Path] = []
        while time.monotonic() < deadline and len(beats) < 2:
            assert watchdog.poll() is None, watchdog.stdout.read() if watchdog.stdout else ""
            beats = list((job_dir / "heartbeats").glob("*/*"))
            time.sleep(0.5)
        assert len(beats) == 2, "both nodes should beat"
        time.sleep(2 * INTERVAL_S)
        assert watchdog.poll() is None  # healthy nodes: the driver runs on
        driver_pid = int((job_dir / "driver.pid").read_text())

        _break(worker, how)
        frozen_at = time.monotonic()
        code = watchdog.wait(60)
        took = time.monotonic() - frozen_at
    finally:
        if watchdog.poll() is None:
            watchdog.kill()
        _resume(worker)
    log = watchdog.stdout.read() if watchdog.stdout else ""
    print(
        f"liveness on Ray: the job ended {took:.1f} s after the worker was {how} (interval {INTERVAL_S} s, bound {TIMEOUT_S} s)"
    )
    assert code == 1, log
    # bound: timeout + interval after the last beat, plus the driver's stop (it ends at once on TERM here)
    assert took <= TIMEOUT_S + 2 * INTERVAL_S + 3, (took, log)
    seen = json.loads((job_dir / "liveness.json").read_text())
    assert seen["address"].endswith(f":{worker_port}") and seen["bound_s"] == TIMEOUT_S, seen  # the worker
    assert seen["silent_s"] >= TIMEOUT_S and seen["seen"].startswith("no heartbeat for")
    assert not psutil.pid_exists(driver_pid) or psutil.Process(driver_pid).status() == psutil.STATUS_ZOMBIE

    # Lepton's side: the Ray job FAILED with the entrypoint's code; nemotron reads the record from its log
    lepton_api.finish(ray_job["submission_id"], code, log)
    status = json.loads(nemotron("jobs", "status", job_id, "--json").out)
    assert status["state"] == "failed", status
    assert status["error"] == f"node {seen['node']} stopped answering: {seen['seen']} (bound {TIMEOUT_S} s)"
    assert status["liveness"] == seen
    assert json.loads((home / "jobs" / job_id / "liveness.json").read_text()) == seen
    assert lepton_api.clusters == {}  # the nodes are freed
    listed = nemotron("jobs", "ls", "--json")
    assert listed.code == 0, listed.err
    (row,) = [r for r in json.loads(listed.out) if job_id in json.dumps(r)]
    assert row["state"] == "failed", row


def test_a_bound_not_above_the_interval_is_refused(
    nemotron: Any, home: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    (tmp_path / "env.toml").write_text(
        '[lep2]\nextends = "lepton_rl"\nnodes = 2\nheartbeat_interval_s = 30\nheartbeat_timeout_s = 30\n'
    )
    monkeypatch.setenv("NEMOTRON_ENV_FILE", str(tmp_path / "env.toml"))
    refused = nemotron("steps", "run", "rl/rlhf", "-c", "default", "-b", "lep2", "--dry-run")
    assert refused.code == 2 and "heartbeat_timeout_s (30) must be above" in refused.err, refused.err
    assert "Traceback" not in refused.err
