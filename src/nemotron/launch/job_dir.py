"""A submitted job's directory, written from its compiled Job: job.yaml (the record, secrets masked by name and by
value), config.yaml, the step's secret values (owner-readable, never printed) and status.json, in a temporary dir
renamed into place, so that a job dir is complete or absent. Reading, listing and indexing job dirs is jobs.dirs'."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from nemotron.core.atomic import write_atomic
from nemotron.core.paths import jobs_dir, writable_dir
from nemotron.core.redact import redact_tree, redact_values, secret_overrides, secret_values
from nemotron.jobs.dirs import index_job, now
from nemotron.jobs.record import parse_record

if TYPE_CHECKING:
    from nemotron.compile import Job

_VERSIONED = (
    "nemotron",
    "torch",
    "transformers",
    "nemo-run",
    "pydantic",
    "omegaconf",
    "safetensors",
    "tokenizers",
)


def package_versions() -> dict[str, str]:
    """Versions from metadata only: importing torch here would cost seconds on the CLI path."""
    out = {"python": sys.version.split()[0]}
    for name in _VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def git_info(path: Path) -> dict[str, Any]:
    """Commit and dirty flag of the checkout holding `path` (the step's code), if it is one."""
    cwd = path if path.is_dir() else path.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5
        )
        if commit.returncode != 0:
            return {"commit": None, "dirty": None}
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=5,
        )
        return {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": None, "dirty": None}


def job_files(job: Job, rendered: str) -> dict[str, tuple[str, int]]:
    """name -> (text, mode) of every file a new job dir holds: job.yaml (the record) and config.yaml with secrets
    masked by name and by value, .secrets.json with the real values for the step alone (owner-readable, never
    printed), status.json. Pure but for the clock, git and the installed versions."""
    secrets = secret_values(job.config_tree, job.profile.model_dump(mode="json"))
    overrides = secret_overrides(job.step_config)
    record = {
        "job_id": job.job_id,
        "step": job.step_id,
        "preset": job.preset,
        "created_at": now(),
        "argv": list(job.argv),
        "mode": job.mode,
        "executor": job.profile.executor,
        "profile": redact_tree(job.profile.model_dump(mode="json", by_alias=True)),
        "config": redact_tree(job.config_tree),
        "config_hash": job.config_hash,
        "sources": job.sources,
        "inputs": [b._asdict() for b in job.bindings],
        "outputs": {k: {"artifact": v[0], "type": v[1]} for k, v in job.outputs.items()},
        "resources": job.resources._asdict(),
        "launch": rendered,
        "git": git_info(Path(job.entry)),
        "versions": package_versions(),
    }
    masked, step_config = redact_values([record, redact_tree(job.step_config)], secrets)
    return {
        "job.yaml": (
            yaml.safe_dump(parse_record(masked, Path("job.yaml")).model_dump(mode="json"), sort_keys=False),
            0o644,
        ),
        "config.yaml": (yaml.safe_dump(step_config, sort_keys=False), 0o644),
        ".secrets.json": (json.dumps(overrides), 0o600),
        "status.json": (json.dumps({"state": "pending", "created_at": now()}), 0o644),
    }


def create_job_dir(job: Job, rendered: str, files: dict[str, str] | None = None) -> Path:
    """Write the job's files (and `files`: name -> text, e.g. the resource plan's plan.json) into a temporary dir,
    then rename: a job dir is either complete or absent."""
    written = job_files(job, rendered) | {name: (text, 0o644) for name, text in (files or {}).items()}
    root = writable_dir(jobs_dir(), "jobs directory")
    final = root / job.job_id
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{job.job_id}."))
    try:
        for name, (text, mode) in written.items():
            write_atomic(tmp / name, text, mode=mode)
        (tmp / "logs").mkdir()
        (tmp / "checkpoints").mkdir()
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    index_job(final)
    return final
