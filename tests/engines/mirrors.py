"""Reading the pinned engines' sources from their local git mirrors (the tests that re-read a tag skip where its
mirror is not on the machine)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git_show(mirror: Path, ref: str, path: str) -> str:
    """The file at `path` as it is at `ref` in the mirror."""
    return subprocess.run(
        ["git", "-C", str(mirror), "show", f"{ref}:{path}"], capture_output=True, text=True, check=True
    ).stdout


def git_files(mirror: Path, ref: str) -> set[str]:
    """Every file path at `ref` in the mirror."""
    listed = subprocess.run(
        ["git", "-C", str(mirror), "ls-tree", "-r", "--name-only", ref],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(listed.stdout.split())
