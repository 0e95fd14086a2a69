"""The local Slurm cluster the tests marked `slurm` run on (scripts/slurm-up.sh: one partition, two nodes on
127.0.0.1): bringing it up, and what a test asks of it (a job's final state, its start, a description for a
failure message). tests/conftest.py's `slurm_cluster` fixture returns a `SlurmCluster`."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SLURM_UP = Path(__file__).resolve().parents[2] / "scripts" / "slurm-up.sh"
# A first call installs four Debian packages; later calls return in well under a second.
SLURM_UP_TIMEOUT_S = 900


SLURM_FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"}


@dataclass(frozen=True)
class SlurmCluster:
    """What scripts/slurm-up.sh brings up: one partition holding two nodes on 127.0.0.1."""

    partition: str = "debug"
    nodes: tuple[str, ...] = ("node1", "node2")

    def final_state(self, slurm_id: str, timeout_s: float = 180) -> str:
        """The job's final state, polling sacct (which lags squeue); a hetjob reports its leader's line first.
        Returns once squeue no longer lists the job either: sacct can say COMPLETED while squeue still shows it
        COMPLETING (its epilog, on a loaded machine), and the schedulers' status calls (torchx's, NeMo-Run's Ray
        status) read squeue first, so `jobs status` would still say running."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            out = subprocess.run(
                ["sacct", "-n", "-P", "-X", "-j", slurm_id, "-o", "State"], capture_output=True, text=True
            ).stdout
            states = [line.split()[0] for line in out.splitlines() if line.strip()]
            queued = subprocess.run(
                ["squeue", "-h", "-j", slurm_id, "-o", "%T"], capture_output=True, text=True
            )
            if states and all(s in SLURM_FINAL for s in states) and set(queued.stdout.split()) <= SLURM_FINAL:
                return states[0]
            time.sleep(0.5)
        raise AssertionError(
            f"slurm job {slurm_id} not finished after {timeout_s} s\n{self.describe(slurm_id)}"
        )

    def wait_running(self, slurm_id: str, timeout_s: float = 300) -> None:
        """Until the job has its allocation. Time in the queue (behind a job a test before this one left
        completing, on a loaded machine) is not what a test measures: its own deadlines start from here."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            out = subprocess.run(
                ["squeue", "-h", "-j", slurm_id, "-o", "%T"], capture_output=True, text=True
            ).stdout.split()
            if out[:1] != ["PENDING"]:  # running, or ran and left the queue already
                return
            time.sleep(0.5)
        raise AssertionError(
            f"slurm job {slurm_id} still pending after {timeout_s} s\n{self.describe(slurm_id)}"
        )

    def describe(self, slurm_id: str) -> str:
        """The queue, the nodes and this job, for a failure message (the cluster is gone when CI's log is read)."""
        commands = [
            ["squeue", "-o", "%i %T %r %N %M"],
            ["sinfo", "-N", "-o", "%N %T %E"],
            ["sacct", "-n", "-P", "-j", slurm_id, "-o", "JobID,State,ExitCode,Start,End,NodeList"],
        ]
        shown = []
        for argv in commands:
            done = subprocess.run(argv, capture_output=True, text=True)
            shown.append(f"$ {' '.join(argv)}\n{done.stdout}{done.stderr}")
        return "\n".join(shown)


def slurm_required() -> bool:
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("NEMOTRON_REQUIRE_SLURM") == "1"


def start_cluster() -> str | None:
    """Run scripts/slurm-up.sh; return why Slurm is unavailable, or None when it is up."""
    if shutil.which("bash") is None:
        return "bash not found"
    if os.geteuid() != 0:
        return "scripts/slurm-up.sh needs root (it installs packages and starts daemons)"
    try:
        done = subprocess.run(
            ["bash", str(SLURM_UP)], capture_output=True, text=True, timeout=SLURM_UP_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return f"scripts/slurm-up.sh did not finish within {SLURM_UP_TIMEOUT_S} s"
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-8:])
        return f"scripts/slurm-up.sh failed (exit {done.returncode}):\n{tail}"
    return None
