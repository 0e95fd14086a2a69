"""Where NeMo-Run keeps a job's files, spelled in one place (pure: nemo_run is not imported). nemotron submits a job
as an experiment titled EXPERIMENT_TITLE that holds one task, or as a Ray cluster, under NeMo-Run's experiments
root: $NEMORUN_HOME/experiments as the job's machines see it (a Slurm tunnel's job_dir, the Lepton mount's copy)."""

from __future__ import annotations

import shlex
from typing import NamedTuple

EXPERIMENT_TITLE = "nemotron"
# run.Experiment's options for a detached submission that prints nothing but warnings
QUIET_EXPERIMENT = {
    "clean_mode": True,
    "enable_goodbye_message": False,
    "skip_status_at_exit": True,
    "log_level": "WARNING",
}
RESTART = "${SLURM_RESTART_COUNT:-0}"  # the restart count in a Slurm log's name, as the shell expands it


def srun_log(folder: str, job_name: str, suffix: str = ".out") -> str:
    """The log NeMo-Run names for a task's srun, `'<folder>/log-<name>_%j_'${SLURM_RESTART_COUNT:-0}<suffix>`
    (`%j`: the Slurm job id), as one shell word whatever the folder holds."""
    return shlex.quote(f"{folder}/log-{job_name}_%j_") + RESTART + suffix


class Experiment(NamedTuple):
    """The experiment of one job: <root>/<title>/<experiment id> holds each task's dir and sbatch script."""

    root: str  # NeMo-Run's experiments root
    job_id: str

    @property
    def id(self) -> str:
        # NeMo-Run recovers the title from the id with rpartition("_"): the job id's own "_" become "-".
        return f"{EXPERIMENT_TITLE}_{self.job_id.replace('_', '-')}"

    def task_dir(self, task: str) -> str:
        """A task's dir: its packaged code/, its logs, and on Lepton its launch script."""
        return f"{self.root}/{EXPERIMENT_TITLE}/{self.id}/{task}"

    def sbatch_script(self, task: str) -> str:
        """The sbatch script NeMo-Run writes for a task, beside the task's dir."""
        return f"{self.task_dir(task)}_sbatch.sh"


class RayClusterDirs(NamedTuple):
    """A Slurm Ray cluster as NeMo-Run's SlurmRayCluster keeps it: <root>/<name> holds its sbatch script,
    job_ids.json and logs/."""

    root: str  # NeMo-Run's experiments root
    name: str  # the cluster's name in NeMo-Run

    @property
    def dir(self) -> str:
        return f"{self.root}/{self.name}"

    @property
    def logs(self) -> str:
        """The raylets', the driver's and sbatch's output."""
        return f"{self.dir}/logs"

    @property
    def script(self) -> str:
        """The cluster's sbatch script, under NeMo-Run's name for it whatever rendered it."""
        return f"{self.dir}/ray.sub"
