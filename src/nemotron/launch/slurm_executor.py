"""The Slurm executor: our step process as an sbatch job (a heterogeneous one with the reward model or the vLLM
judge served beside it), a Ray cluster across the profile's nodes for engines that bring their own driver
(NeMo-RL), or an engine's own heterogeneous job (NeMo-Aligner's servers and actor); all through NeMo-Run.
Status, logs and cancel: the sbatch jobs' through NeMo-Run's runner and their log files (`SlurmBatch`), the Ray
cluster's through NeMo-Run's Slurm Ray API (`ray_slurm.SlurmRay`)."""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, TypeAdapter

from nemotron.compile import Job
from nemotron.config.profiles import SlurmProfile
from nemotron.core.paths import nemotron_home
from nemotron.engines.base import HetJob, Launch, StepProcess
from nemotron.launch import het_slurm, remote, slurm, slurm_script
from nemotron.launch.records import SHAPE_FIELD, RemoteRecord, RemoteState, read_record
from nemotron.plan.placement import Placement
from nemotron.plan.served import served_model

if TYPE_CHECKING:
    from nemotron.launch.ray_slurm import SlurmRay


def slurm_plan(job: Job[SlurmProfile]) -> slurm.SlurmPlan:
    """The Slurm plan of our own step process: the interpreter, the cluster paths, the served reward model."""
    paths = slurm.cluster_paths(job, nemotron_home(), _python(job))
    return slurm.plan_slurm(job, paths, served_model(job))


def _python(job: Job[SlurmProfile]) -> str:
    profile = job.profile
    return profile.python or (
        "python" if profile.container_image else sys.executable if profile.tunnel == "local" else "python3"
    )


class SlurmBatch(slurm_script.SlurmJob):
    """A job NeMo-Run submitted as an sbatch script: its state is NeMo-Run's torchx runner's."""

    def state(self) -> RemoteState:
        with remote.nemo_run() as run:
            app = remote.runner(run).status(self.handle)
        return RemoteState(remote.APP_STATES.get(app.state.name, "unknown") if app is not None else "unknown")

    def cancel(self) -> None:
        with remote.nemo_run() as run:
            remote.runner(run).cancel(self.handle)


class SlurmProcess(SlurmBatch):
    """Our step process (`StepProcess`), with the reward model or the vLLM judge served beside it where asked."""

    shape: Literal["process"] = "process"


class SlurmHetJob(SlurmBatch):
    """An engine's own heterogeneous job (`HetJob`: NeMo-Aligner's servers and actor)."""

    shape: Literal["hetjob"] = "hetjob"


@cache
def records() -> TypeAdapter[SlurmProcess | SlurmHetJob | SlurmRay]:
    """The shapes a Slurm job's record can have, built on the first record read (a dry run reads none, so it
    imports no Ray module)."""
    from nemotron.launch.ray_slurm import SlurmRay

    return TypeAdapter(Annotated[SlurmProcess | SlurmHetJob | SlurmRay, Field(discriminator=SHAPE_FIELD)])


class SlurmExecutor(remote.SchedulerJobs):
    kind = "slurm"
    cheap_refresh = False
    profile = SlurmProfile

    def placement(self, job: Job[SlurmProfile]) -> Placement:
        profile = job.profile
        paths = slurm.cluster_paths(job, nemotron_home(), _python(job))
        slurm.refuse_unsafe_paths(paths)
        ranks = profile.gpus_per_node or profile.ntasks_per_node  # slurm.plan_slurm's nproc
        return Placement(paths.job_dir, profile.nodes, profile.gpus_per_node, ranks_per_node=ranks)

    def render(self, job: Job[SlurmProfile], where: Placement, launch: Launch) -> str:
        if isinstance(launch, StepProcess):
            return slurm_script.render_text(slurm_plan(job))
        if isinstance(launch, HetJob):
            return slurm_script.render_text(het_slurm.plan_het(job, launch))
        from nemotron.launch import ray_slurm

        return ray_slurm.render_text(ray_slurm.plan_for(job, where, launch))

    def submit(self, job: Job[SlurmProfile], job_dir: Path, where: Placement, launch: Launch) -> int:
        if isinstance(launch, StepProcess):
            plan = slurm_plan(job)
            return remote.submit_remote(
                job, job_dir, lambda: SlurmProcess(**slurm_script.submit_job(job, job_dir, plan)), self.record
            )
        if isinstance(launch, HetJob):
            het = het_slurm.plan_het(job, launch)
            return remote.submit_remote(
                job,
                job_dir,
                lambda: SlurmHetJob(
                    **slurm_script.submit_job(job, job_dir, het), outputs=dict(launch.outputs)
                ),
                self.record,
            )
        from nemotron.launch import ray_slurm

        ray = ray_slurm.plan_for(job, where, launch)
        return remote.submit_remote(
            job, job_dir, lambda: ray_slurm.submit(job, job_dir, ray, launch), self.record
        )

    def record(self, status: dict[str, Any], job_dir: Path) -> RemoteRecord:
        return read_record(records(), status, job_dir)
