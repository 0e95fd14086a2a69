"""Slurm's time-limit warning (SIGUSR1, `#SBATCH --signal=USR1@N`) mid-run: the built-in step does not die of it,
saves a checkpoint at the end of the training step it is in, and goes on to finish (here, with no Slurm job to
requeue, it just finishes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nemotron.runtime.resume import latest

# no periodic checkpoint: the only one can come from the warning
ARGS = (
    "steps run rl/reinforce -c tiny trainer.max_steps=8 checkpoint.save_interval=0 reward.source=in_process "
    "trainer.num_prompts_per_step=8 eval.num_prompts=0"
).split()


@pytest.mark.slow
def test_the_time_limit_warning_saves_a_checkpoint_and_the_run_goes_on(home: Path) -> None:
    # the step hangs 5 s in step 5's rollout: the warning lands inside step 5
    env = {**os.environ, "NEMOTRON_FAULT": "stall@5", "NEMOTRON_FAULT_STALL_S": "5"}
    env.pop("SLURM_JOB_ID", None)
    proc = subprocess.Popen([sys.executable, "-m", "nemotron", *ARGS], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        job_dir: Path | None = None
        while time.monotonic() < deadline:
            jobs = list((home / "jobs").glob("rl-reinforce-*")) if (home / "jobs").is_dir() else []
            job_dir = jobs[0] if jobs else None
            metrics = job_dir / "metrics.jsonl" if job_dir else None
            if metrics and metrics.is_file() and '"step": 4,' in metrics.read_text():
                break
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.2)
        assert job_dir is not None
        pid = json.loads((job_dir / "status.json").read_text())["pid"]
        os.kill(pid, signal.SIGUSR1)
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    saved = latest(job_dir / "checkpoints")
    assert saved is not None and saved.name == "step_000005"  # at the end of the step it was in
    assert sorted(p.name for p in (job_dir / "checkpoints").glob("step_*")) == ["step_000005"]  # once only
    steps = [json.loads(x)["step"] for x in (job_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 9))
