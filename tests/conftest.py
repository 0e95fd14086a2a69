"""Shared fixtures: an isolated $NEMOTRON_HOME and a helper that runs the real CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURE_STEPS = Path(__file__).resolve().parent / "fixtures" / "steproot"


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    h = tmp_path / "home"
    monkeypatch.setenv("NEMOTRON_HOME", str(h))
    monkeypatch.delenv("NEMOTRON_ENV_FILE", raising=False)
    monkeypatch.delenv("NEMOTRON_STEPS_PATH", raising=False)
    monkeypatch.chdir(tmp_path)
    yield h


def cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 120
) -> Result:
    """Run `python -m nemotron ARGS` for real: exit code, stdout and stderr as a user sees them."""
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "nemotron", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=timeout,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def run_cli() -> object:
    """The `cli` helper as a fixture (test modules cannot import conftest under --import-mode=importlib)."""
    return cli


@pytest.fixture
def fixture_steps(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Put the test-only steps (test/count) on the search path."""
    monkeypatch.setenv("NEMOTRON_STEPS_PATH", str(FIXTURE_STEPS))
    return FIXTURE_STEPS
