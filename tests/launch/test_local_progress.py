"""The progress watch on this machine (launch/local.py): off by default (a debugger's breakpoint is not a hang), a
local profile with `progress_floor_s` set fails a step whose ranks stop making progress, as on a cluster: the step
stopped, `failed` with the record, nothing registered. The rule itself: tests/runtime/test_progress.py."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


def test_a_local_step_that_stops_making_progress_fails(
    home: Path, fixture_steps: Path, run_cli: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    (tmp_path / "env.toml").write_text(
        '[watched]\nextends = "local"\nprogress_floor_s = 2\nprogress_pace_factor = 3\nprogress_startup_s = 60\n'
    )
    monkeypatch.setenv("NEMOTRON_ENV_FILE", str(tmp_path / "env.toml"))
    started = time.monotonic()
    r = run_cli("steps", "run", "test/count", "-c", "tiny", "trainer.max_steps=100", "trainer.hang_at=4",
                "-r", "watched")  # fmt: skip
    took = time.monotonic() - started
    assert r.code == 1, (r.out, r.err)
    assert "hanging on purpose at step 4" in r.out + r.err
    assert "nemotron: liveness: no progress: no progress for " in r.out + r.err, r.err
    (job_dir,) = (home / "jobs").iterdir()
    status = json.loads((job_dir / "status.json").read_text())
    assert status["state"] == "failed" and status["error"].startswith("no progress: "), status
    seen = status["liveness"]
    assert (seen["kind"], seen["rank"], seen["step"], seen["section"], seen["bound_s"]) == (
        "progress",
        0,
        3,
        "step",
        2,
    )
    assert json.loads((job_dir / "liveness.json").read_text()) == seen
    assert took < 60, took  # the floor (2 s) and a look, not the hour the step sleeps
    assert run_cli("artifacts", "ls", "--json").out.count("count_result") == 0  # nothing registered


def test_off_by_default_on_this_machine(home: Path, fixture_steps: Path, run_cli: Any) -> None:
    r = run_cli("steps", "run", "test/count", "-c", "tiny", "trainer.max_steps=2")
    assert r.code == 0, r.err
    (job_dir,) = (home / "jobs").iterdir()
    assert not (job_dir / "progress").exists()  # no beacons: nothing watches a run in front of you
