"""The Slurm executor: our step process as an sbatch job (a heterogeneous one with the reward model or the vLLM judge served beside it), a
Ray cluster across the profile's nodes for engines that bring their own driver (NeMo-RL), or an engine's own
heterogeneous job (NeMo-Aligner's servers and actor); all through NeMo-Run.
Status, logs and cancel go through NeMo-Run's runner and the job's log files."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from nemotron.compile import Job
from nemotron.engines.base import HetJob, Launch, Placement, StepProcess
from nemotron.launch import het_slurm, ray_slurm, remote, slurm, slurm_script
from nemotron.launch.served import served_model
from nemotron.paths import nemotron_home
from nemotron.profiles import SlurmProfile


def slurm_plan(job: Job) -> slurm.SlurmPlan:
    """The Slurm plan of our own step process: the interpreter, the cluster paths, the served reward model."""
    paths = slurm.cluster_paths(job, nemotron_home(), _python(job))
    return slurm.plan_slurm(job, paths, served_model(job))


def _python(job: Job) -> str:
    profile = job.profile
    assert isinstance(profile, SlurmProfile)
    return profile.python or (
        "python" if profile.container_image else sys.executable if profile.tunnel == "local" else "python3"
    )


class SlurmExecutor(remote.SchedulerJobs):
    kind = "slurm"
    cheap_refresh = False

    def placement(self, job: Job) -> Placement:
        profile = job.profile
        assert isinstance(profile, SlurmProfile)
        paths = slurm.cluster_paths(job, nemotron_home(), _python(job))
        slurm.refuse_unsafe_paths(paths)
        return Placement(paths.job_dir, profile.nodes, profile.gpus_per_node)

    def render(self, job: Job, where: Placement, launch: Launch) -> str:
        if isinstance(launch, StepProcess):
            return slurm_script.render_text(slurm_plan(job))
        if isinstance(launch, HetJob):
            return slurm_script.render_text(het_slurm.plan_het(job, launch))
        return ray_slurm.render_text(ray_slurm.plan_for(job, where, launch))

    def submit(self, job: Job, job_dir: Path, where: Placement, launch: Launch) -> int:
        if isinstance(launch, StepProcess):
            return remote.submit_remote(
                job, job_dir, lambda: slurm_script.submit_job(job, job_dir, slurm_plan(job)), self
            )
        if isinstance(launch, HetJob):
            het = het_slurm.plan_het(job, launch)
            outputs = {"register": dict(launch.outputs)} if launch.outputs else {}
            return remote.submit_remote(
                job, job_dir, lambda: slurm_script.submit_job(job, job_dir, het) | outputs, self
            )
        plan = ray_slurm.plan_for(job, where, launch)
        return remote.submit_remote(job, job_dir, lambda: ray_slurm.submit(job, job_dir, plan, launch), self)

    # ------------------------------------------------------------------ the scheduler's answers (remote.Scheduler)

    def state(self, status: dict[str, Any]) -> str:
        if (
            status.get("launch") == "ray"
        ):  # submitted as a NeMo-Run Ray cluster, not through the torchx runner
            return ray_slurm.state(_profile_of(status), status)
        with remote.nemo_run() as run:
            app = remote.runner(run).status(str(status["handle"]))
        return remote.APP_STATES.get(app.state.name, "unknown") if app is not None else "unknown"

    def exit_code(self, status: dict[str, Any]) -> int | None:
        return remote.exit_line_code(status.get("remote_dir"), f"sbatch_*_{status.get('remote_id')}.out")

    def log_reader(self, job_dir: Path, role: str | None = None) -> remote.LogReader:
        from nemotron.jobs import read_status

        return remote.LogTail(lambda: remote.step_log_files(read_status(job_dir), role))

    def cancel_remote(self, status: dict[str, Any]) -> None:
        if status.get("launch") == "ray":
            ray_slurm.cancel(_profile_of(status), status)
            return
        with remote.nemo_run() as run:
            remote.runner(run).cancel(str(status["handle"]))


def _profile_of(status: dict[str, Any]) -> SlurmProfile:
    """The profile a job was submitted with (kept in status.json: job.yaml's copy has its secrets masked)."""
    return SlurmProfile.model_validate(status["profile"])
