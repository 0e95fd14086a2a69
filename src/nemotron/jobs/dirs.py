"""Job records: $NEMOTRON_HOME/jobs/<id>/{job.yaml, config.yaml, status.json, logs/, metrics.jsonl, checkpoints/}:
found, read, updated, listed and indexed here; created from the compiled Job by launch.job_dir."""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nemotron.core.atomic import write_atomic
from nemotron.core.paths import jobs_dir
from nemotron.errors import NotFound, did_you_mean, disk_full
from nemotron.jobs.record import JobRecord, load_record, read_status


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def index_job(job_dir: Path, status: dict[str, Any] | None = None) -> None:
    """Keep the jobs index (jobs/index.py) in step with a record just written; best effort by design."""
    from nemotron.jobs.index import JobsIndex

    JobsIndex(root=job_dir.parent).record(job_dir, status)


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
    index_job(job_dir, status)
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
