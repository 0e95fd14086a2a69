"""Which checkpoint a resumed run continues from, and whether it may: torch-free, so the compiler can refuse a
mismatched checkpoint before anything is submitted (the step checks again when it loads it)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemotron.errors import UserError

if TYPE_CHECKING:
    from pydantic import BaseModel

    from nemotron.artifacts.binding import Binding

PREFIX = "step_"
# Keys a resumed run may change without training a different model.
RESUMABLE_KEYS = (
    "checkpoint",
    "outputs",
    "trainer.max_steps",
    "grpo.max_num_steps",
    "trainer.log_interval",
    "runtime.num_threads",
    # where rewards come from may move (a restarted server gets a new port); what they are may not
    "reward.server",
    "judge.url",
    "judge.token_file",
    "judge.timeout_s",
)


def config_fingerprint(config: dict[str, Any]) -> str:
    """Hash of the config without the keys a resume may change (where to save, how long to run)."""
    trimmed = json.loads(json.dumps(config))
    for key in RESUMABLE_KEYS:
        *parents, leaf = key.split(".")
        node = trimmed
        for p in parents:
            node = node.get(p, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(leaf, None)
    return hashlib.sha256(json.dumps(trimmed, sort_keys=True).encode()).hexdigest()[:16]


def model_fingerprint(path: str | Path) -> str:
    """Identity of a starting checkpoint: its config.json and the names and sizes of its files."""
    p = Path(path)
    h = hashlib.sha256()
    if (p / "config.json").is_file():
        h.update((p / "config.json").read_bytes())
    for f in sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else []:
        h.update(f"{f.relative_to(p)}:{f.stat().st_size}".encode())
    return h.hexdigest()[:16]


def latest(root: Path) -> Path | None:
    """The last complete checkpoint: only a renamed (finished) dir is ever named by `latest`."""
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    return path if (path / "state.json").is_file() else None


def own_checkpoint(job_dir: Path) -> Path | None:
    """The newest complete checkpoint this job wrote itself: present only when the job runs again in the same job
    dir (a Slurm requeue, a preemption, a restart after its time limit)."""
    return latest(job_dir / "checkpoints")


def check_compatible(path: Path, expect: dict[str, Any], force: bool = False) -> None:
    """Refuse a checkpoint whose recorded fingerprints differ from this run's, unless forced."""
    info = json.loads((path / "state.json").read_text())
    mismatched = [
        f"{k}: checkpoint has {info.get(k)!r}, this run has {v!r}"
        for k, v in expect.items()
        if info.get(k) != v
    ]
    if mismatched and not force:
        raise UserError(
            f"refusing to resume from {path}: it was made by a different model or config",
            mismatched,
            hint="Resume anyway with checkpoint.force=true, or start fresh without checkpoint.resume.",
        )


def _earlier_jobs(jobs: Path, step_id: str) -> bool:
    """Whether `jobs` holds any job dir of `step_id`: the candidates `unfinished_twin` reads."""
    prefix = step_id.replace("/", "-") + "-"
    return jobs.is_dir() and any(p.name.startswith(prefix) for p in jobs.iterdir())


def unfinished_twin(
    jobs: Path, step_id: str, expect: dict[str, Any], inputs: list[tuple[str, int | None, str | None]]
) -> tuple[str, dict[str, Any], str] | None:
    """(job id, its checkpoint's state.json, the job's state) of the newest earlier job of `step_id` that did not
    succeed and left a complete checkpoint made from the same config and starting model (`expect`, as
    check_compatible compares them), having read the same inputs (name, store id, path). A job still running is
    not one; one whose processes are gone without a recorded end (its launcher killed too) is."""
    prefix = step_id.replace("/", "-") + "-"
    if not jobs.is_dir():
        return None
    for other in sorted((p for p in jobs.iterdir() if p.name.startswith(prefix)), reverse=True):
        checkpoint = latest(other / "checkpoints")
        if checkpoint is None:
            continue
        # only with a candidate: the dry run of a home without one loads nothing more (its start-up is measured)
        from nemotron.jobs.record import FINAL, gone_without_an_end, load_record, read_status

        status = read_status(other)
        state = "failed" if gone_without_an_end(status) else status.get("state")
        if state not in FINAL or state == "succeeded":
            continue
        info: dict[str, Any] = json.loads((checkpoint / "state.json").read_text())
        if any(info.get(k) != v for k, v in expect.items()):
            continue
        if [(i.name, i.artifact_id, i.path) for i in load_record(other).inputs] == inputs:
            return other.name, info, str(state)
    return None


def resume_checkpoint(job_dir: Path, step_id: str, resume_from: str | None) -> Path:
    """The checkpoint to resume: from `resume_from` (a job id, a job dir or a checkpoints dir), else from the
    newest earlier job of the same step that has one."""
    jobs = job_dir.parent
    if resume_from:
        candidates = [
            Path(resume_from),
            jobs / resume_from / "checkpoints",
            Path(resume_from) / "checkpoints",
        ]
        for c in candidates:
            if (c / "state.json").is_file():
                return c
            found = latest(c) if c.is_dir() else None
            if found:
                return found
        raise UserError(
            f"checkpoint.resume_from={resume_from!r}: no checkpoint there (tried a job id, a job dir and a checkpoint dir)"
        )
    prefix = step_id.replace("/", "-") + "-"
    if not jobs.is_dir():
        raise UserError(f"checkpoint.resume=true but there are no jobs in {jobs} to resume from")
    for other in sorted(
        (p for p in jobs.iterdir() if p.name.startswith(prefix) and p != job_dir), reverse=True
    ):
        found = latest(other / "checkpoints")
        if found:
            return found
    raise UserError(
        f"checkpoint.resume=true but no earlier {step_id} job in {jobs} has a checkpoint",
        hint="Name one with checkpoint.resume_from=JOB_ID",
    )


def choose_resume(
    step_id: str, validated: BaseModel, config: dict[str, Any], sources: dict[str, str], bindings: Sequence[Binding],
    here: bool,
) -> tuple[str, ...]:  # fmt: skip
    """Where the run continues from, decided before a job exists. A resume that names (or finds) a checkpoint of
    another model or config fails here. With `checkpoint.resume=auto` (the default) on the built-in engine of a
    job that runs here, an earlier job of the same step, config and inputs that did not succeed and left a
    checkpoint is resumed: `resume_from` is set to it (in `validated`, `config` and `sources`) and the returned
    note says so."""
    ck = config.get("checkpoint")
    if not isinstance(ck, dict):
        return ()
    from nemotron.config.backends import RUNS_AS_STEP_PROCESS
    from nemotron.config.stepconfig import engine_name
    from nemotron.core.paths import jobs_dir
    from nemotron.core.redact import redact_tree

    explicit = ck.get("resume") is True or bool(ck.get("resume_from"))
    if not explicit and (
        ck.get("resume") != "auto"
        or not here
        or engine_name(config) not in RUNS_AS_STEP_PROCESS
        or not _earlier_jobs(
            jobs_dir(), step_id
        )  # nothing to resume: no fingerprint to take (a dry run's start-up)
    ):
        return ()
    expect = {"config": config_fingerprint(redact_tree(config))}
    policy = next((b for b in bindings if b.name == "policy" and b.path and Path(b.path).exists()), None)
    if policy is not None and policy.path is not None:
        expect["model"] = model_fingerprint(policy.path)
    if explicit:
        source = resume_checkpoint(jobs_dir() / "(new job)", step_id, ck.get("resume_from"))
        check_compatible(source, expect, bool(ck.get("force")))
        return ()
    inputs = [(b.name, b.artifact_id, b.path) for b in bindings]
    twin = unfinished_twin(jobs_dir(), step_id, expect, inputs)
    if twin is None:
        return ()
    job_id, checkpoint, state = twin
    ck["resume_from"] = job_id
    validated.checkpoint.resume_from = job_id  # type: ignore[attr-defined]  # a config with a checkpoint group
    sources["checkpoint.resume_from"] = "auto"
    return (
        f"resuming {job_id} ({state}) from its checkpoint at step {checkpoint.get('step')}, as checkpoint.resume=auto "
        "does for the same command after a crash; checkpoint.resume=false starts afresh",
    )
