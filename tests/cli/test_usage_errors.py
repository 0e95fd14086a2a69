"""Usage errors from the installed `nemotron` entry point: exit 2, at most 6 lines, never a traceback, whichever
click the installed typer raises from (its vendored copy in typer >= 0.29, or the separate package)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

NEMOTRON = Path(sys.executable).with_name("nemotron")

CASES = [
    (["bogus"], "error: No such command 'bogus'"),
    (["stesp", "list"], "Did you mean 'steps'?"),
    (["steps", "run"], "error: Missing argument 'ID'"),
    (["steps", "list", "--bogus"], "error: No such option: --bogus"),
    (["jobs", "ls", "--limit", "abc"], "error: Invalid value for '--limit'"),
    (
        ["steps", "run", "rl/reinforce", "-c", "tiny", "--no-such-flag"],
        "error: No such option: --no-such-flag",
    ),
]


def _run(args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NEMOTRON_HOME": str(home), "COLUMNS": "100"}
    return subprocess.run([str(NEMOTRON), *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize(("args", "expect"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_usage_error_is_exit_2_in_a_few_lines(args: list[str], expect: str, tmp_path: Path) -> None:
    done = _run(args, tmp_path / "home")
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert expect in done.stderr and "Traceback" not in output
    assert len(output.strip().splitlines()) <= 6
    assert done.stderr.strip().splitlines()[-1].startswith("try 'nemotron")
    assert not (tmp_path / "home").exists()


def test_bare_nemotron_prints_the_help_and_exits_0(tmp_path: Path) -> None:
    for args in ([], ["steps"]):
        done = _run(args, tmp_path / "home")
        assert done.returncode == 0 and "Usage: nemotron" in done.stdout and "Traceback" not in done.stderr


def test_version_names_the_pinned_engine_targets(tmp_path: Path) -> None:
    done = _run(["--version"], tmp_path / "home")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("nemotron 0.")
    assert (
        "NeMo-RL v0.7.0" in done.stdout
        and "NeMo-Aligner v0.7.0" in done.stdout
        and "vLLM 0.32.0" in done.stdout
    )
