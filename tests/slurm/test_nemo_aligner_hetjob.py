"""backend=nemo_aligner's heterogeneous job is one the local Slurm accepts: the dry-run's script, as the user sees
it, passes `sbatch --test-only` (NeMo-Aligner itself needs GPUs and its container, which this cluster lacks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
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
        # its nemo_aligner preset validates as NeMo-Aligner does: after steps only, in training-batch batches
        ("rl/dpo", ["train_gpt_dpo.py"], ("inputs.policy=/models/sft.nemo",)),
    ],
)
def test_the_local_slurm_accepts_the_hetjob(
    home: Path, tmp_path: Path, step: str, scripts: list[str], extra: tuple[str, ...]
) -> None:
    cmd = [sys.executable, "-m", "nemotron", "steps", "run", step, "-c", "nemo_aligner", "-b", "local_slurm"]
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


FAKE = Path(__file__).resolve().parents[1] / "fixtures" / "fake_nemo_aligner"
TINY = Path(__file__).resolve().parents[2] / "src" / "nemotron" / "shipped" / "tiny"


Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def aligner2(home: Path, tmp_path: Path) -> tuple[Run, Path]:
    """(run: `nemotron ARGS backend=nemo_aligner optim.min_lr_ratio=1 -r aligner2`, a base .nemo): a 2-node profile
    whose NeMo-Aligner checkout is tests/fixtures/fake_nemo_aligner."""
    base = tmp_path / "base.nemo"
    (tmp_path / "model_config.yaml").write_text(
        "tensor_model_parallel_size: 1\npipeline_model_parallel_size: 1\n"
    )
    with tarfile.open(base, "w") as tar:
        tar.add(tmp_path / "model_config.yaml", arcname="./model_config.yaml")
    path = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
    (tmp_path / "env.toml").write_text(f"""
[aligner2]
extends = "local_slurm"
nodes = 2
nemo_aligner_image = ""
nemo_aligner_dir = "{FAKE}"
env_vars = {{ PATH = "{path}" }}
""")
    env = {**os.environ, "COLUMNS": "200", "NEMOTRON_ENV_FILE": str(tmp_path / "env.toml")}

    def run(*args: str, remote: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "nemotron", *args]
        if remote:
            cmd += ["backend=nemo_aligner", "optim.min_lr_ratio=1", "-r", "aligner2"]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)

    return run, base


def test_sft_then_rm_train_run_their_data_step_once_and_register_the_nemo_chain(
    aligner2: tuple[Run, Path],
) -> None:
    """The real launch path on 2 nodes with tests/fixtures/fake_nemo_aligner as the checkout: the first task writes
    the data files (sft: rows kept; rm: chosen/rejected text lines), the other task starts only once they are
    there, and the .nemo each leaves is registered; rm/train starts from the SFT .nemo it registered."""
    run, base = aligner2
    started = time.monotonic()
    sft = run("steps", "run", "sft", "-c", "tiny", f"inputs.init_from={base}")
    assert sft.returncode == 0, sft.stderr[-4000:]
    records = sum(1 for line in (TINY / "sft.jsonl").read_text().splitlines() if line.strip())
    held = records // 20  # trainer.validation_fraction 0.05: every 20th record
    for task in ("0", "1"):
        assert (
            f"sft: task {task} of 2 read {records - held} train and {held} validation records" in sft.stderr
        )
    rm = run("steps", "run", "rm/train", "-c", "tiny", "inputs.init_from=tiny_sft_policy:v1")
    took = time.monotonic() - started
    assert rm.returncode == 0, rm.stderr[-4000:]
    pairs = sum(1 for line in (TINY / "preferences.jsonl").read_text().splitlines() if line.strip())
    assert (
        f"rm: task 1 of 2 read {pairs - pairs // 10} train and {pairs // 10} validation records" in rm.stderr
    )
    shown = json.loads(run("artifacts", "show", "tiny_reward_model:v1", "--json", remote=False).stdout)
    assert shown["type"] == "reward_model_nemo" and shown["path"].endswith(
        "rm_results/checkpoints/megatron_gpt.nemo"
    )
    lineage = run("artifacts", "lineage", "tiny_reward_model:v1", remote=False)
    assert "tiny_sft_policy:v1" in lineage.stdout, lineage.stdout
    print(f"sft and rm/train on the fake NeMo-Aligner, submit to registered: {took:.1f} s")


def test_dpo_writes_its_pairs_once_and_registers_the_aligned_nemo(aligner2: tuple[Run, Path]) -> None:
    """rl/dpo's tiny preset on the fake NeMo-Aligner across 2 nodes: the first task rewrites the pairs as
    DPOModelDataset's rows (every 20th held out), both tasks read them, and the .nemo is registered as the policy
    (checkpoint_nemo) with lineage to the .nemo it started from. NeMo-Aligner validates after steps only, in batches
    of the training batch."""
    run, base = aligner2
    started = time.monotonic()
    # micro 32: Megatron takes 64 pairs as micro x data parallel (2 nodes x 1 device) x whole micro-batches
    dpo = run("steps", "run", "rl/dpo", "-c", "tiny", f"inputs.policy={base}", "dpo.val_at_start=false",
              "dpo.val_global_batch_size=64", "trainer.micro_batch_size=32")  # fmt: skip
    took = time.monotonic() - started
    assert dpo.returncode == 0, dpo.stderr[-4000:]
    pairs = sum(1 for line in (TINY / "preferences.jsonl").read_text().splitlines() if line.strip())
    held = pairs // 20  # trainer.validation_fraction unset: 0.05, every 20th pair
    for task in ("0", "1"):
        said = f"dpo: task {task} of 2 read {pairs - held} train and {held} validation records"
        assert said in dpo.stderr, dpo.stderr[-4000:]
    shown = json.loads(run("artifacts", "show", "tiny_dpo_policy:v1", "--json", remote=False).stdout)
    assert shown["type"] == "checkpoint_nemo" and shown["path"].endswith(
        "dpo_results/checkpoints/megatron_gpt.nemo"
    )
    lineage = run("artifacts", "lineage", "tiny_dpo_policy:v1", remote=False)
    assert "base.nemo" in lineage.stdout and "preferences" in lineage.stdout, lineage.stdout
    print(f"rl/dpo on the fake NeMo-Aligner, submit to registered: {took:.1f} s")
