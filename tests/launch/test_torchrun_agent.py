"""A distributed step's exit code means what it means on one process (launch/torchrun_agent.py): two real ranks
under torchrun on this machine (the local_ddp profile) that both meet a user mistake end the job with 2, their one
line and no traceback, where torchrun alone ends 1 with its own; a crash still ends 1, with torchrun's table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

RANKS_STEPS = Path(__file__).resolve().parents[1] / "slurm" / "steproot"  # test/ranks


@pytest.mark.parametrize(("fail_with", "code"), [("user", 2), ("crash", 1)])
def test_the_first_failed_ranks_code_is_the_jobs(
    home: Path, run_cli: Any, monkeypatch: pytest.MonkeyPatch, fail_with: str, code: int
) -> None:
    monkeypatch.setenv("NEMOTRON_STEPS_PATH", str(RANKS_STEPS))
    r = run_cli("steps", "run", "test/ranks", "-c", "tiny", "-r", "local_ddp", "fail_at_round=2",
                f"fail_with={fail_with}")  # fmt: skip
    said = r.out + r.err
    assert r.code == code, said
    assert "fails on purpose (fail_at_round)" in said
    if fail_with == "user":
        assert "error: round 2: rank " in said and "Traceback" not in said, said
        assert "nemotron: rank " in said and "ended with exit code 2" in said
    else:
        assert "RuntimeError" in said and "Root Cause" in said, said  # torchrun's failure table
    (job_dir,) = (home / "jobs").iterdir()
    status = json.loads((job_dir / "status.json").read_text())
    assert (status["state"], status["exit_code"]) == ("failed", code), status
    assert "ranks_result" not in run_cli("artifacts", "ls", "--json").out  # nothing registered
