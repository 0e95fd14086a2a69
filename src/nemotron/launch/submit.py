"""Submitting a compiled Job: its engine says what runs, its executor says where. Dry-run and submit share
`plan`, so what --dry-run prints is what is submitted, and every refusal comes before anything is written."""

from __future__ import annotations

from pathlib import Path

from nemotron.compile import Job
from nemotron.engines.base import HetJob, Launch, Placement, RayDriver, engine_for
from nemotron.launch import render
from nemotron.launch.executor import Executor, executor_for
from nemotron.paths import jobs_dir
from nemotron.redact import secret_values


def _secrets(job: Job) -> set[str]:
    return secret_values(job.config, job.profile.model_dump(mode="json"), environ=job.profile.env_vars)


def plan(job: Job) -> tuple[Executor, Placement, Launch, str]:
    """(executor, placement, launch, the text under `## launch`): the engine's compiled files, then what the
    executor sends (a command, an sbatch script, a job spec)."""
    executor = executor_for(job)
    where = executor.placement(job)
    launch = engine_for(job).launch(job, where)
    shown = launch.shown if isinstance(launch, RayDriver | HetJob) else ""
    return executor, where, launch, shown + executor.render(job, where, launch)


def rendered_launch(job: Job) -> str:
    return plan(job)[3]


def dry_run(job: Job) -> str:
    return render.dry_run_text(job, rendered_launch(job), str(jobs_dir() / job.job_id), _secrets(job))


def submit(job: Job) -> int:
    from nemotron.artifacts.store import ArtifactStore
    from nemotron.compile import register_path_inputs
    from nemotron.jobs import create_job_dir
    from nemotron.paths import artifacts_dir

    executor, where, launch, text = plan(job)  # every refusal happens here, before anything is written
    root = job.profile.artifacts_root
    job = register_path_inputs(job, ArtifactStore(Path(root).expanduser() if root else artifacts_dir()))
    job_dir = create_job_dir(job, text)
    return executor.submit(job, job_dir, where, launch)
