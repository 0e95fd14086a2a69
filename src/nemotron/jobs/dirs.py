"""Job records: $NEMOTRON_HOME/jobs/<id>/{job.yaml, config.yaml, status.json, logs/, metrics.jsonl, checkpoints/}."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from nemotron.core.atomic import write_atomic
from nemotron.core.paths import jobs_dir, writable_dir
from nemotron.core.redact import redact_tree, redact_values, secret_values
from nemotron.errors import NotFound, did_you_mean, disk_full
from nemotron.jobs.record import JobRecord, load_record, parse_record, read_status

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


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


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
            "config": redact_tree(job.config),
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
        secrets = secret_values(job.config, job.profile.model_dump(mode="json"))
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
    _index_job(final)
    return final


def _index_job(job_dir: Path, status: dict[str, Any] | None = None) -> None:
    """Keep the jobs index (jobs/index.py) in step with a record just written; best effort by design."""
    from nemotron.jobs.index import JobsIndex

    JobsIndex(root=job_dir.parent).record(job_dir, status)


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


def resolve_job_dir(job_id: str) -> Path:
    """A job by id or unique id prefix."""
    root = jobs_dir()
    exact = root / job_id
    if (exact / "job.yaml").is_file():
        return exact
    ids = list_job_ids()
    matches = [i for i in ids if i.startswith(job_id)]
    if len(matches) == 1:
        return root / matches[0]
    if len(matches) > 1:
        raise NotFound(f"job id prefix '{job_id}' is ambiguous: {', '.join(matches[:5])}")
    raise NotFound(
        f"no job '{job_id}' in {root}{did_you_mean(job_id, ids)}", hint="List jobs with: nemotron jobs ls"
    )


_ID_STAMP = re.compile(r"-(\d{8}-\d{6})-[0-9a-f]+$")


def list_job_ids() -> list[str]:
    """Job ids, newest first: by the creation time in the id (`<step>-YYYYMMDD-HHMMSS-<hex>`), then by the dir's
    mtime; never by the id as a string, which begins with the step name."""
    root = jobs_dir()
    if not root.is_dir():
        return []

    def created(p: Path) -> tuple[str, int]:
        m = _ID_STAMP.search(p.name)
        return (m.group(1) if m else "", p.stat().st_mtime_ns)

    return [
        p.name
        for p in sorted((p for p in root.iterdir() if (p / "job.yaml").is_file()), key=created, reverse=True)
    ]


def read_record(job_dir: Path) -> JobRecord:
    return load_record(job_dir)


def update_status(job_dir: Path, **fields: Any) -> dict[str, Any]:
    status = read_status(job_dir)
    status.update(fields)
    text = json.dumps(status)
    try:
        write_atomic(job_dir / "status.json", text)
    except OSError as err:
        if disk_full(err) is None or not _overwrite_in_place(job_dir / "status.json", text):
            raise
    _index_job(job_dir, status)
    return status


def _overwrite_in_place(path: Path, text: str) -> bool:
    """On a full disk a new file has no room, but a small one's own block does: write over it and cut it to length,
    so a job that stopped for want of space still records how it ended. False where that does not fit either."""
    try:
        with path.open("r+b") as f:
            f.write(text.encode())
            f.truncate()
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        return False
    return True


def read_metrics(job_dir: Path) -> list[dict[str, Any]]:
    path = job_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a line being written right now
    return rows
