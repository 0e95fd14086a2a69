"""job.yaml as a typed model: what a job was (step, preset, config, inputs, outputs, profile, the launch text),
written once when the job is created and read by `jobs`, lineage and the executors. A record that does not match
is one clear error naming the file and the fields, not a KeyError somewhere later. Beside it, `read_status` reads
status.json, the record that changes while the job runs (jobs/dirs.py writes it, the jobs index mirrors it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from nemotron.errors import UserError


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class InputRecord(_Record):
    """One consumed input as it was bound (artifacts.binding.Binding)."""

    name: str
    expected_type: str
    ref: str  # as the user wrote it: name:vN, a path, a hub id
    kind: Literal["store", "path", "hub"]
    path: str | None = None
    actual_type: str | None = None
    artifact_id: int | None = None
    artifact: str | None = None  # name:vN for store artifacts
    model: str | None = None  # a local HF checkpoint's family, classes and parameter count


class OutputRecord(_Record):
    artifact: str  # the name it is registered under
    type: str


class GitRecord(_Record):
    commit: str | None = None
    dirty: bool | None = None


class JobRecord(_Record):
    job_id: str
    step: str
    preset: str
    created_at: str
    argv: list[str] = []
    mode: Literal["attached", "batch"]
    executor: str
    profile: dict[str, Any]  # the profile's fields, secrets masked
    config: dict[str, Any]  # the resolved config, secrets masked
    config_hash: str
    sources: dict[str, str] = {}  # dotted key -> where its value came from (preset, profile, cli)
    inputs: list[InputRecord] = []
    outputs: dict[str, OutputRecord] = {}
    resources: dict[str, Any] = {}
    launch: str  # exactly what was submitted (the command, sbatch script or job spec)
    git: GitRecord = GitRecord()
    versions: dict[str, str] = {}


def parse_record(data: object, where: Path) -> JobRecord:
    try:
        return JobRecord.model_validate(data)
    except ValidationError as e:
        problems = [f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}" for err in e.errors()]
        raise UserError(f"{where}: not a job record nemotron can read", problems) from None


_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(text: str) -> object:
    """yaml.safe_load through libyaml's C loader when PyYAML has it (10x faster on a 3 KB job.yaml)."""
    return yaml.load(text, Loader=_Loader)


def load_record(job_dir: Path) -> JobRecord:
    path = job_dir / "job.yaml"
    try:
        data = safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    return parse_record(data, path)


# The states a job ends in: status.json never changes after one
FINAL = ("succeeded", "failed", "cancelled")


def read_status(job_dir: Path) -> dict[str, Any]:
    """status.json, the record that changes while a job runs (state, times, scheduler ids): {"state": "unknown"}
    when it is absent or unreadable, e.g. half-written by an executor right now."""
    try:
        data = json.loads((job_dir / "status.json").read_text())
        return data if isinstance(data, dict) else {"state": "unknown"}
    except (OSError, ValueError):
        return {"state": "unknown"}


def gone_without_an_end(status: dict[str, Any]) -> bool:
    """Whether a job not recorded as ended has lost every process it recorded (its launcher and its step): killed
    without a word (kill -9, a reboot). False where it recorded none (a scheduler's job: its executor asks the
    scheduler)."""
    from nemotron.core.procs import is_alive

    pids = [status.get(k) for k in ("launcher_pid", "pid") if status.get(k)]
    return status.get("state") not in FINAL and bool(pids) and not any(is_alive(pid) for pid in pids)


def dump_record(record: JobRecord) -> str:
    return yaml.safe_dump(record.model_dump(mode="json"), sort_keys=False)
