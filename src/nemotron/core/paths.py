"""Where things live: the bundled steps/manifests/profiles, user step roots, and $NEMOTRON_HOME."""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # src/nemotron (this file is src/nemotron/core/paths.py)


def bundled_root() -> Path:
    """The root holding steps/, manifests/ and profiles/: inside the wheel, or the source checkout."""
    wheel_root = _PACKAGE_DIR / "_bundled"
    if (wheel_root / "manifests").is_dir():
        return wheel_root
    return _PACKAGE_DIR.parent.parent


def step_roots() -> list[Path]:
    """User roots from $NEMOTRON_STEPS_PATH (each with manifests/ and steps/), then the bundled root."""
    roots = [
        Path(p).expanduser().resolve()
        for p in os.environ.get("NEMOTRON_STEPS_PATH", "").split(os.pathsep)
        if p
    ]
    return [*roots, bundled_root()]


def nemotron_home() -> Path:
    """$NEMOTRON_HOME, default ./.nemotron in the working directory. One that exists as anything but a directory
    is bad input (exit 2): every listing would show it empty and every write fail."""
    home = Path(os.environ.get("NEMOTRON_HOME", ".nemotron")).expanduser().resolve()
    if home.exists() and not home.is_dir():
        from nemotron.errors import UserError

        raise UserError(
            f"NEMOTRON_HOME {home} is a file, not a directory", hint="Point $NEMOTRON_HOME at a directory."
        )
    return home


def check_writable(path: Path, what: str) -> None:
    """Fail (exit 2, one line) unless `path` exists as a writable directory or could be created: the nearest
    existing ancestor is a writable directory. Creates nothing."""
    from nemotron.errors import UserError

    hint = "Point $NEMOTRON_HOME at a writable directory."
    existing = next(p for p in (path, *path.parents) if p.exists() or p == p.parent)
    if not existing.is_dir():
        raise UserError(f"cannot create the {what} {path}: {existing} is not a directory", hint=hint)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"cannot create the {what} {path}: {existing} is not writable", hint=hint)


def writable_dir(path: Path, what: str) -> Path:
    """Create `path` if needed and check it can be written: a read-only or misplaced home is one clear line (exit
    2), not a PermissionError traceback halfway through a submission."""
    from nemotron.errors import UserError

    check_writable(path, what)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(
            f"cannot create the {what} {path}: {e.strerror or e}",
            hint="Point $NEMOTRON_HOME at a writable directory.",
        ) from None
    return path


def jobs_dir() -> Path:
    return nemotron_home() / "jobs"


def artifacts_dir() -> Path:
    return nemotron_home() / "artifacts"


def shipped_root() -> Path:
    """Artifacts shipped inside the package (`pkg://tiny/...`), made by `nemotron pipeline run tiny --ship`."""
    return _PACKAGE_DIR / "shipped"
