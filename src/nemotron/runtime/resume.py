"""Which checkpoint a resumed run continues from, and whether it may: torch-free, so the compiler can refuse a
mismatched checkpoint before anything is submitted (the step checks again when it loads it)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from nemotron.errors import UserError

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
