"""The local cluster itself: jobs run to COMPLETED, accounting records them, and hetjobs get both groups."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Protocol

import pytest


class SlurmCluster(Protocol):
    """What the `slurm_cluster` fixture returns (conftest cannot be imported under --import-mode=importlib)."""

    @property
    def partition(self) -> str: ...
    @property
    def nodes(self) -> tuple[str, ...]: ...


# Job states after which Slurm never changes a job's state again.
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL"}


def sbatch(*args: str) -> str:
    done = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True, check=True)
    return done.stdout.strip().split(";")[0]


def accounted_state(job_id: str, timeout_s: float = 60.0) -> str:
    """Poll `sacct` (it lags `squeue` by a second or so) until the job reaches a final state."""
    deadline = time.monotonic() + timeout_s
    state = ""
    while time.monotonic() < deadline:
        done = subprocess.run(
            ["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State"],
            capture_output=True,
            text=True,
            check=True,
        )
        # a hetjob has one line per group; "CANCELLED by 0" carries the canceller
        states = {line.split()[0] for line in done.stdout.split("\n") if line.strip()}
        if states and states <= FINAL_STATES:
            return ",".join(sorted(states))
        state = ",".join(sorted(states))
        time.sleep(0.25)
    raise AssertionError(f"job {job_id} not finished after {timeout_s} s (sacct state {state!r})")


@pytest.mark.slurm(group="single")
def test_wrap_job_completes_and_sacct_records_it(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job_id = sbatch(
        f"--partition={slurm_cluster.partition}",
        f"--output={tmp_path}/%j.out",
        "--wrap",
        f"srun sh -c 'echo $SLURM_JOB_ID > {tmp_path}/ran_as'",
    )

    assert accounted_state(job_id) == "COMPLETED"
    # the file names the job it ran in, so it cannot come from an earlier run
    assert (tmp_path / "ran_as").read_text().strip() == job_id


@pytest.mark.slurm(group="single")
def test_hetjob_starts_both_groups_on_their_own_nodes(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    script = tmp_path / "het.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH --partition={slurm_cluster.partition} --nodes=1 --ntasks=1\n"
        "#SBATCH hetjob\n"
        f"#SBATCH --partition={slurm_cluster.partition} --nodes=1 --ntasks=1\n"
        f'echo "$SLURM_JOB_NODELIST_HET_GROUP_0 $SLURM_JOB_NODELIST_HET_GROUP_1" > {tmp_path}/groups\n'
    )
    job_id = sbatch(f"--output={tmp_path}/%j.out", str(script))

    assert accounted_state(job_id) == "COMPLETED"
    # two one-node groups on a two-node cluster: backfill gives each group a node of its own
    assert sorted((tmp_path / "groups").read_text().split()) == sorted(slurm_cluster.nodes)
