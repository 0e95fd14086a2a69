"""Submitting a compiled Job: its engine says what runs, its executor says where. Dry-run and submit share
`plan`, so what --dry-run prints is what is submitted, and every refusal comes before anything is written."""

from __future__ import annotations

import json
import sys
from typing import Any

from nemotron.compile import Job
from nemotron.core.paths import jobs_dir
from nemotron.core.redact import redact_text, secret_values
from nemotron.engines.base import Launch, engine_for
from nemotron.errors import UserError
from nemotron.launch import render
from nemotron.launch.executor import Executor, executor_for
from nemotron.plan.groups import fitting_plan
from nemotron.plan.placement import Placement
from nemotron.plan.terms import refusal


def _secrets(job: Job) -> set[str]:
    return secret_values(job.config_tree, job.profile.model_dump(mode="json"), environ=job.profile.env_vars)


def plan(job: Job) -> tuple[Executor[Any], Placement, Launch, str]:
    """(executor, placement, launch, the text under `## launch`): the engine's compiled files, then what the
    executor sends (a command, an sbatch script, a job spec)."""
    executor = executor_for(job)
    where = executor.placement(job)
    launch = engine_for(job).launch(job, where)
    return executor, where, launch, launch.shown + executor.render(job, where, launch)


def rendered_launch(job: Job) -> str:
    return plan(job)[3]


def dry_run(job: Job) -> str:
    return planned_dry_run(job, plan(job))


def planned_dry_run(job: Job, planned: tuple[Executor[Any], Placement, Launch, str]) -> str:
    """`dry_run` of a job whose `plan` the caller already has (a pipeline's dry run reads its launch too)."""
    _, where, _, text = planned
    resources = fitting_plan(job, where)
    return render.dry_run_text(job, text, str(jobs_dir() / job.job_id), _secrets(job), resources)


def dry_run_json(job: Job) -> dict[str, Any]:
    """What `--dry-run --json` prints: the job's identity, its resource plan and the rendered launch."""
    _, where, _, text = plan(job)
    return {
        "step": job.step_id,
        "preset": job.preset,
        "profile": job.profile.name,
        "job_dir": str(jobs_dir() / job.job_id),
        "resource_plan": fitting_plan(job, where).as_json(),
        "launch": redact_text(text, _secrets(job)),
    }


def submit(job: Job) -> int:
    from nemotron.launch.job_dir import create_job_dir

    executor, where, launch, text = plan(job)  # every refusal happens here, before anything is written
    planned = fitting_plan(job, where)
    for group in planned.overflows():  # plan.on_no_fit=warn: the user knows better
        print(f"warning: {refusal(group)}", file=sys.stderr, flush=True)
    files = {"plan.json": json.dumps(planned.as_json(), indent=2) + "\n"}
    if where.here:
        # the store the step registers into answers now, or the run is refused here (exit 3, in seconds) instead of
        # failing after its training: a team store (PostgreSQL) is asked, with its retries; a local one is a file
        job.store.exists()
    # the store versions the inputs resolved to are held until the job registers its outputs or ends, so that no
    # `artifacts gc` removes them under it; let go if no job dir comes to record the job. A plain-path input is
    # registered (as external.NAME) with the job's outputs, in their transaction: a failed run registers nothing.
    resolved = [b for b in job.bindings if b.artifact_id is not None]
    with job.store.pinned(job.job_id, [b.artifact_id for b in resolved if b.artifact_id is not None]) as gone:
        if gone:  # removed since this command resolved it: bad input (exit 2), nothing written
            names = ", ".join(f"inputs.{b.name} ({b.artifact})" for b in resolved if b.artifact_id in gone)
            raise UserError(
                f"{names}: removed by `nemotron artifacts gc` since this command resolved it; run the command again"
            )
        job_dir = create_job_dir(job, text, files)
    return executor.submit(job, job_dir, where, launch)
