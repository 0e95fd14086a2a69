"""User-facing errors: what the CLI turns into a clear message and exit code 2, never a traceback."""

from __future__ import annotations

import difflib
import errno
import os
import shutil
from collections.abc import Iterable
from pathlib import Path


class UserError(Exception):
    """A mistake in the user's input. Carries every problem found, so all are reported at once."""

    exit_code = 2

    def __init__(self, message: str, problems: Iterable[str] = (), hint: str | None = None) -> None:
        self.message = message
        self.problems = list(problems)
        self.hint = hint
        super().__init__(self.render())

    def render(self) -> str:
        lines = [self.message]
        lines += [f"  - {p}" for p in self.problems]
        if self.hint:
            lines.append(self.hint)
        return "\n".join(lines)


class NotFound(UserError):
    """A step, preset, profile, artifact or job that does not exist."""


class ServiceError(RuntimeError):
    """A service the step depends on (the reward server, a judge) failed after its retries. `run_step` turns it
    into one clear line and exit code 3, so a scheduler or a script can tell it from a crash (1) and from bad
    input (2); the job's last checkpoint stays resumable."""

    exit_code = 3


def did_you_mean(word: str, choices: Iterable[str], n: int = 3) -> str:
    """A ` (did you mean 'x'?)` suffix, or an empty string when nothing is close."""
    close = difflib.get_close_matches(word, list(choices), n=n, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"


class DiskFull(ServiceError):
    """The filesystem a step or command writes to is full (or over quota): exit code 3 like a failed service, since
    it is no mistake in the input, and the job's last checkpoint resumes once space is freed."""


# What a full disk says when the errno does not survive: safetensors' Rust writer, SQLite, torch's zip writer.
_FULL_WORDS = ("no space left on device", "disk quota exceeded", "database or disk is full", "os error 28")
# Failed writes that say nothing of why (torch.save's zip writer, SQLite's IOERR): a full disk when `where` is full.
_UNSPECIFIC = ("inline_container.cc", "iostream error", "file write failed", "disk I/O error")


def disk_full(err: BaseException, where: str | os.PathLike[str] | None = None) -> DiskFull | None:
    """A DiskFull naming the path and the free space when `err` (or an exception it was raised from) is a full
    disk; None otherwise. `where` stands for the path when the error names none (e.g. the job dir)."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, DiskFull):
            return cause
        full = isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT)
        if full or any(word in str(cause).lower() for word in _FULL_WORDS):
            filename = getattr(cause, "filename", None) if isinstance(cause, OSError) else None
            return DiskFull(f"disk full: {_what(filename or where)}")
        if (
            where is not None
            and any(word in str(cause) for word in _UNSPECIFIC)
            and _nearly_full(Path(where))
        ):
            return DiskFull(f"disk full: {_what(where)}")
        cause = cause.__cause__ or cause.__context__
    return None


def _nearly_full(path: Path) -> bool:
    place = next((p for p in (path, *path.parents) if p.exists()), None)
    try:
        return place is not None and shutil.disk_usage(place).free < 2**20
    except OSError:
        return False


def disk_full_while(what: str, path: str | os.PathLike[str], needed: int | None = None) -> DiskFull:
    """The DiskFull of writing `what` at `path`, with the bytes it needed when known."""
    need = f", needs about {human_bytes(needed)}" if needed else ""
    return DiskFull(f"disk full: cannot write {what} {_what(path, need)}")


def _what(path: str | os.PathLike[str] | None, need: str = "") -> str:
    if path is None:
        return "no space left on device"
    return f"{path} (no space left{need}; {_free(Path(path))})"


def _free(path: Path) -> str:
    for place in (path, *path.parents):
        if place.exists():
            try:
                usage = shutil.disk_usage(place)
            except OSError:
                break
            return f"{human_bytes(usage.free)} free of {human_bytes(usage.total)} there"
    return "free space unknown"


def human_bytes(n: int) -> str:
    """1536 -> "1.5 KiB"."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


class EngineOutputError(RuntimeError):
    """An external engine's run left an output that is not what it was asked for (NeMo-RL's eval samples that are
    not the job's prompts): nothing is registered, and the job fails with this message."""


# Where the modules a step imports went when the package root was regrouped (2026-11-29): an old import in a user's
# step or schema is one clear line naming the new place (exit 2), not a traceback.
MOVED_MODULES = {
    "nemotron.stepconfig": "nemotron.config.stepconfig",
    "nemotron.workload": "nemotron.config.workload",
    "nemotron.profiles": "nemotron.config.profiles",
    "nemotron.configtree": "nemotron.config.configtree",
    "nemotron.targets": "nemotron.config.targets",
    "nemotron.devices": "nemotron.runtime.devices",
    "nemotron.faults": "nemotron.runtime.faults",
    "nemotron.metrics": "nemotron.runtime.metrics",
    "nemotron.preempt": "nemotron.runtime.preempt",
    "nemotron.resume": "nemotron.runtime.resume",
    "nemotron.paths": "nemotron.core.paths",
    "nemotron.atomic": "nemotron.core.atomic",
    "nemotron.procs": "nemotron.core.procs",
    "nemotron.redact": "nemotron.core.redact",
    "nemotron.data.batches": "nemotron.models.batches",
    "nemotron.rl.prompts": "nemotron.models.prompts",
    "nemotron.runtime": "nemotron.runtime.step",  # StepRun and its helpers; the package holds devices, faults, ...
}


def moved_import(error: ImportError) -> UserError | None:
    """The clear error for an import of a module that moved (`from nemotron.runtime import StepRun`, `import
    nemotron.stepconfig`); None for any other ImportError."""
    new = MOVED_MODULES.get(error.name or "")
    if new is None:
        return None
    return UserError(f"{error}: `{error.name}` is now `{new}`; import from there (docs/writing-a-step.md)")
