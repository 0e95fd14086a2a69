"""kill -9 during rollout, during the optimizer step and while writing a checkpoint: the same command again resumes
(checkpoint.resume=auto) and finishes with final weights bitwise identical to an uninterrupted run, no half-written checkpoint is ever taken for a valid one,
and the killed run registers nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from nemotron.runtime.resume import latest

# in_process rewards: bitwise equality needs every reward computed the same way in both runs
ARGS = (
    "steps run rl/reinforce -c tiny trainer.max_steps=8 checkpoint.save_interval=3 "
    "reward.source=in_process trainer.num_prompts_per_step=8 eval.num_prompts=0"
).split()


def _newest(home: Path) -> Path:
    return max((home / "jobs").iterdir(), key=lambda p: p.stat().st_mtime_ns)


def _weights(job: Path) -> dict[str, Any]:
    return load_file(str(job / "outputs" / "policy" / "model.safetensors"))


@pytest.fixture(scope="module")
def reference_weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import subprocess
    import sys

    home = tmp_path_factory.mktemp("ref") / "home"
    env = {**os.environ, "NEMOTRON_HOME": str(home)}
    subprocess.run(
        [sys.executable, "-m", "nemotron", *ARGS], env=env, check=True, capture_output=True, timeout=600
    )
    return _weights(_newest(home))


@pytest.mark.slow
@pytest.mark.parametrize(("fault", "resumes_at"), [("rollout@5", 3), ("optimizer@5", 3), ("checkpoint@6", 3)])
def test_kill_9_then_resume_is_bitwise_identical(
    fault: str, resumes_at: int, reference_weights: dict[str, Any], home: Path, run_cli: Any
) -> None:
    r = run_cli(*ARGS, env={**os.environ, "NEMOTRON_FAULT": fault}, timeout=600)
    assert r.code != 0, "the fault did not fire"
    killed = _newest(home)
    status = json.loads((killed / "status.json").read_text())
    assert status["state"] == "failed" and status["exit_code"] == -9  # SIGKILL, as the kernel would
    # the last *complete* checkpoint is the only one that counts; a half-written one is never `latest`
    good = latest(killed / "checkpoints")
    assert good is not None and good.name == f"step_{resumes_at:06d}"
    if fault.startswith("checkpoint"):
        assert list((killed / "checkpoints").glob(".step_000006.tmp")), (
            "the fault should leave a partial dir behind"
        )
    assert json.loads(run_cli("jobs", "show", killed.name, "--json").out)["produced"] == []

    # the same command again resumes the killed job (checkpoint.resume=auto), in one line; resume=false would not
    note = (
        f"note: resuming {killed.name} (failed) from its checkpoint at step {resumes_at}, as checkpoint.resume=auto"
        " does for the same command after a crash; checkpoint.resume=false starts afresh"
    )
    shown = run_cli(*ARGS, "--dry-run")
    assert note in shown.out and f"resume_from: {killed.name}  # auto" in shown.out, shown.out[:3000]
    afresh = run_cli(*ARGS, "checkpoint.resume=false", "--dry-run")
    assert afresh.code == 0 and "note: resuming" not in afresh.out + afresh.err, afresh.out[:3000]
    r = run_cli(*ARGS, timeout=600)
    assert r.code == 0, r.err[-2000:]
    assert r.err.count("resuming") == 1 and note in r.err, r.err[-3000:]
    resumed = _newest(home)
    assert json.loads(run_cli("jobs", "show", resumed.name, "--json").out)["step"] == "rl/reinforce"
    steps = [json.loads(x)["step"] for x in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(resumes_at + 1, 9))
    final = _weights(resumed)
    assert final.keys() == reference_weights.keys()
    for k, v in reference_weights.items():
        assert bool((final[k] == v).all()), f"{k} differs from the uninterrupted run"


@pytest.mark.slow
def test_two_ranks_resume_bitwise_and_refuse_another_rank_count(home: Path, run_cli: Any) -> None:
    """Each rank samples from its own stream; a resumed 2-rank run must restore every rank's, not rank 0's twice."""
    ddp = [*ARGS, "-r", "local_ddp"]
    r = run_cli(*ddp, timeout=600)
    assert r.code == 0, r.err[-2000:]
    uninterrupted = _weights(_newest(home))

    r = run_cli(*ddp, env={**os.environ, "NEMOTRON_FAULT": "optimizer@5"}, timeout=600)
    assert r.code != 0, "the fault did not fire"
    killed = _newest(home)
    checkpoint = latest(killed / "checkpoints")
    assert checkpoint is not None and checkpoint.name == "step_000003"
    state = json.loads((checkpoint / "state.json").read_text())
    assert state["world_size"] == 2 and len(state["python_random"]) == 2

    # One rank cannot continue two ranks' sampling streams: a clear usage error, not a silently different run.
    r = run_cli(*ARGS, f"checkpoint.resume_from={killed.name}", timeout=600)
    assert r.code == 2, r.err[-2000:]
    assert "written by 2 rank(s) and this run has 1" in r.err + r.out

    r = run_cli(*ddp, f"checkpoint.resume_from={killed.name}", timeout=600)
    assert r.code == 0, r.err[-2000:]
    final = _weights(_newest(home))
    for k, v in uninterrupted.items():
        assert bool((final[k] == v).all()), f"{k} differs from the uninterrupted 2-rank run"
