"""A server step on the real local cluster: rm/serve on 2 nodes x 2 tasks starts exactly one server per node,
each announced under <job dir>/servers/, then `jobs cancel` stops them."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from tests.slurm.jobs import nemotron

from nemotron.reward.address import announced_servers
from nemotron.reward.client import wait_ready

pytestmark = pytest.mark.slurm
PROFILE = """
[two_by_two]
extends = "local_slurm"
nodes = 2
ntasks_per_node = 2
"""


def server_processes(job_dir: Path) -> list[int]:
    """Live rm/serve step processes of this job (run_step runs the step in its own process, one per task)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            live = b"State:\tZ" not in (proc / "status").read_bytes()
        except OSError:
            continue
        # python -m nemotron.run_step .../rm/serve/step.py --job-dir DIR (srun's own argv holds the same words later)
        if (
            live
            and len(argv) > 3
            and argv[1:3] == [b"-m", b"nemotron.run_step"]
            and argv[3].endswith(b"rm/serve/step.py")
            and str(job_dir).encode() in argv
        ):
            pids.append(int(proc.name))
    return pids


def job_logs(job_dir: Path) -> str:
    """The tail of the job's Slurm logs, for a failure message."""
    remote = Path(json.loads((job_dir / "status.json").read_text())["remote_dir"])
    text = (
        "".join(p.read_text(errors="replace") for p in sorted(remote.glob("*.out")))
        if remote.is_dir()
        else ""
    )
    return text[-4000:]


def test_rm_serve_runs_one_server_per_node_however_many_tasks_the_profile_asks(
    home: Path, tmp_path: Path, slurm_cluster: Any
) -> None:
    (tmp_path / "env.toml").write_text(PROFILE)  # the working directory: found by walking up from it
    # both test nodes are this host: port 0 lets each server pick its own (on a real cluster, one port for all)
    env = {**os.environ, "COLUMNS": "200"}
    done = nemotron(env, "steps", "run", "rm/serve", "-c", "tiny", "server.port=0", "-b", "two_by_two")
    assert done.returncode == 0, done.stderr[-3000:]
    job_id = done.stdout.strip().splitlines()[-1]
    job_dir = home / "jobs" / job_id
    slurm_id = str(json.loads((job_dir / "status.json").read_text())["remote_id"])
    try:
        slurm_cluster.wait_running(slurm_id)
        deadline = (
            time.monotonic() + 180
        )  # four step processes loading torch on 2 cores beside the other worker
        while len(entries := announced_servers(job_dir) if (job_dir / "servers").is_dir() else []) < 2:
            assert time.monotonic() < deadline, (
                f"servers announced: {entries}\n{slurm_cluster.describe(slurm_id)}\n{job_logs(job_dir)}"
            )
            time.sleep(0.2)
        # every task srun started is running by now: exactly the two announced servers, one per node
        assert sorted(server_processes(job_dir)) == sorted(e["pid"] for e in entries)
        assert [(e["node"], e["node_index"], e["nodes"]) for e in entries] == [
            ("node1", 0, 2),
            ("node2", 1, 2),
        ]
        for entry in entries:
            wait_ready(entry["url"], timeout=10)
        assert json.loads((job_dir / "server.json").read_text()) == entries[0]
    finally:
        cancelled = nemotron(env, "jobs", "cancel", job_id)
    assert cancelled.returncode == 0, cancelled.stderr[-3000:]
    assert slurm_cluster.final_state(slurm_id, timeout_s=60).startswith("CANCELLED")
