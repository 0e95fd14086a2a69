"""backend=nemo_aligner's heterogeneous job is one the local Slurm accepts: the dry-run's script, as the user sees
it, passes `sbatch --test-only` (NeMo-Aligner itself needs GPUs and its container, which this cluster lacks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm(group="single")  # one job of one or two one-CPU tasks at a time


# sft and rm/train start from a .nemo and decay no learning rate (NeMo-Aligner's schedule is cosine)
SUPERVISED = ("inputs.init_from=/models/base.nemo", "optim.min_lr_ratio=1")


@pytest.mark.parametrize(
    ("step", "scripts", "extra"),
    [
        ("rl/ppo", ["serve_ppo_critic.py", "serve_reward_model.py", "train_gpt_ppo_actor.py"], ()),
        ("rl/reinforce", ["serve_reward_model.py", "train_gpt_reinforce_actor.py"], ()),
        ("rm/serve", ["serve_reward_model.py"], ()),
        ("sft", ["train_gpt_sft.py"], SUPERVISED),
        ("rm/train", ["train_reward_model.py"], SUPERVISED),
    ],
)
def test_the_local_slurm_accepts_the_hetjob(
    home: Path, tmp_path: Path, step: str, scripts: list[str], extra: tuple[str, ...]
) -> None:
    cmd = [sys.executable, "-m", "nemotron", "steps", "run", step, "-c", "default", "-b", "local_slurm"]
    done = subprocess.run(
        [*cmd, "backend=nemo_aligner", *extra, "--dry-run"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    script = done.stdout[done.stdout.index("#!/bin/bash") :]
    sruns = [line for line in script.splitlines() if line.startswith("srun ")]
    beats = [
        line for line in sruns if "/heartbeats/" in line
    ]  # launch/liveness.py: one per group of a hetjob
    assert len(beats) == (len(scripts) if len(scripts) > 1 else 0)
    srun_lines = [line for line in sruns if line not in beats]
    assert [
        next(s for s in scripts if s in line) for line in srun_lines
    ] == scripts  # servers first, actor last
    assert script.count("#SBATCH hetjob") == len(scripts) - 1
    (tmp_path / "job.sh").write_text(script)
    test = subprocess.run(["sbatch", "--test-only", str(tmp_path / "job.sh")], capture_output=True, text=True)
    assert test.returncode == 0 and "to start" in test.stderr, test.stderr
