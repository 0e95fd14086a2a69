"""Which earlier job the same command resumes (checkpoint.resume=auto: nemotron.runtime.resume.unfinished_twin): one
that did not succeed, left a complete checkpoint of the same config and model, and read the same inputs. A job whose
launcher was killed too (status still `running`, every recorded process gone) counts as failed; one still running
does not. Real job dirs, written by the code that writes them for a submit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from nemotron.catalog import Catalog
from nemotron.compile import compile_job
from nemotron.core.paths import jobs_dir
from nemotron.jobs.dirs import update_status
from nemotron.launch.job_dir import create_job_dir
from nemotron.runtime.resume import unfinished_twin


def test_the_twin_is_an_unfinished_job_of_the_same_config_and_inputs(home: Path) -> None:
    job = compile_job(Catalog(), "rl/reinforce", "tiny", dry_run=True)
    d = create_job_dir(job, "(launch)")
    checkpoint = d / "checkpoints" / "step_000003"
    checkpoint.mkdir()
    (checkpoint / "state.json").write_text(json.dumps({"step": 3, "config": "c1", "model": "m1"}))
    (d / "checkpoints" / "latest").write_text("step_000003")
    inputs = [(b.name, b.artifact_id, b.path) for b in job.bindings]
    expect = {"config": "c1", "model": "m1"}

    dead = subprocess.Popen(["true"])
    dead.wait()
    update_status(d, state="running", pid=dead.pid, launcher_pid=dead.pid)  # kill -9 of the launcher, too
    assert unfinished_twin(jobs_dir(), "rl/reinforce", expect, inputs) == (
        d.name, {"step": 3, "config": "c1", "model": "m1"}, "failed"
    )  # fmt: skip
    assert json.loads((d / "status.json").read_text())["state"] == "running"  # asked, not written

    # alive (a process whose command line names nemotron, as a launcher's does): still running, not a twin
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "nemotron"])
    try:
        update_status(d, pid=live.pid, launcher_pid=live.pid)
        assert unfinished_twin(jobs_dir(), "rl/reinforce", expect, inputs) is None
    finally:
        live.kill()
        live.wait()

    update_status(d, state="cancelled")
    assert unfinished_twin(jobs_dir(), "rl/reinforce", expect, inputs) is not None
    assert unfinished_twin(jobs_dir(), "rl/reinforce", {**expect, "config": "c2"}, inputs) is None
    assert unfinished_twin(jobs_dir(), "rl/reinforce", {**expect, "model": "m2"}, inputs) is None
    other_inputs = [(n, i, p if n != "prompts" else "/elsewhere.jsonl") for n, i, p in inputs]
    assert unfinished_twin(jobs_dir(), "rl/reinforce", expect, other_inputs) is None
    assert unfinished_twin(jobs_dir(), "rl/ppo", expect, inputs) is None

    update_status(d, state="succeeded")  # a finished job is never continued by itself
    assert unfinished_twin(jobs_dir(), "rl/reinforce", expect, inputs) is None
