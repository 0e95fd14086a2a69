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
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from nemotron.core.atomic import write_atomic
from nemotron.core.paths import jobs_dir, writable_dir
from nemotron.core.redact import redact_tree, redact_values, secret_values
from nemotron.jobs.dirs import index_job, now
from nemotron.jobs.record import JobRecord, parse_record

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


def job_record(job: Job, rendered: str) -> JobRecord:
    """What job.yaml holds. Secrets are masked by name here; values are masked again by the caller's text pass."""
    return parse_record(
        {
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
            "inputs": [asdict(b) for b in job.bindings],
            "outputs": {k: {"artifact": v[0], "type": v[1]} for k, v in job.outputs.items()},
            "resources": job.resources._asdict(),
            "launch": rendered,
            "git": git_info(Path(job.entry)),
            "versions": package_versions(),
        },
        Path("job.yaml"),
    )


def create_job_dir(job: Job, rendered: str, files: dict[str, str] | None = None) -> Path:
    """Write the record (and `files`: name -> text, e.g. the resource plan's plan.json) into a temporary dir,
    then rename: a job dir is either complete or absent."""
    root = writable_dir(jobs_dir(), "jobs directory")
    final = root / job.job_id
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{job.job_id}."))
    try:
        secrets = secret_values(job.config_tree, job.profile.model_dump(mode="json"))
        record = redact_values(job_record(job, rendered).model_dump(mode="json"), secrets)
        write_atomic(tmp / "job.yaml", yaml.safe_dump(record, sort_keys=False))
        step_config = redact_values(redact_tree(job.step_config), secrets)
        write_atomic(tmp / "config.yaml", yaml.safe_dump(step_config, sort_keys=False))
        # The real secret values, for the step only: owner-readable, never printed.
        write_atomic(tmp / ".secrets.json", json.dumps(_secret_overrides(job.step_config)), mode=0o600)
        (tmp / "logs").mkdir()
        (tmp / "checkpoints").mkdir()
        write_atomic(tmp / "status.json", json.dumps({"state": "pending", "created_at": now()}))
        for name, text in (files or {}).items():
            write_atomic(tmp / name, text)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    index_job(final)
    return final


def _secret_overrides(tree: Any, prefix: str = "") -> dict[str, Any]:
    from nemotron.core.redact import is_secret_name

    out: dict[str, Any] = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            key = f"{prefix}{k}"
            if is_secret_name(str(k)) and v not in (None, ""):
                out[key] = v
            else:
                out.update(_secret_overrides(v, key + "."))
    return out
