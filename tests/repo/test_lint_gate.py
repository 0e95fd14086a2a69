"""The lint and format gate of scripts/test.sh covers every Python file git tracks, scripts/ and docs/examples/
included, so a file outside the package cannot drift from the formatter unseen."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _ruff() -> str:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed")
    return found


def _tracked_python_files() -> set[str]:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no tracked files to compare")
    out = subprocess.run(
        ["git", "ls-files", "-z", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return set(filter(None, out.split("\0")))


@pytest.mark.parametrize("gate", ["ruff check", "ruff format --check"])
def test_the_gate_reaches_every_tracked_python_file(gate: str) -> None:
    lines = [
        line for line in (ROOT / "scripts" / "test.sh").read_text().splitlines() if line.startswith(gate)
    ]
    assert len(lines) == 1, f"scripts/test.sh should run `{gate}` once, found {lines}"
    args = shlex.split(lines[0])[len(gate.split()) :]  # the paths (and options) the gate is given
    # `ruff format` finds its files as `ruff check` does (one resolver, one [tool.ruff] include), and only check
    # can list them.
    shown = subprocess.run(
        [_ruff(), "check", "--show-files", *args], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    reached = {str(Path(p).resolve().relative_to(ROOT)) for p in shown.splitlines()}
    missed = sorted(_tracked_python_files() - reached)
    assert not missed, f"`{gate}` in scripts/test.sh does not reach {missed}"
