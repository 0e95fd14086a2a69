"""Our sbatch rendering (dry-run, goldens, job.yaml) equals the script NeMo-Run itself writes for the executors we
submit, byte for byte: single jobs, heterogeneous jobs, containers with squash import, torchrun, the NeMo-RL backend.
tests/slurm checks the same on real submissions."""

from __future__ import annotations

import difflib
import json
import os
import sys
from pathlib import Path

from tests.launch.checkpoints import reward_model_dir
from tests.processes import run_to_exit_0

HELPER = Path(__file__).with_name("nemo_run_render.py")
SERVED_STEPS = Path(__file__).resolve().parents[1] / "slurm" / "steproot"
ENV_TOML = """
[gpu_local]            # the SSH template's GPU/container settings, submitted from the login node itself
extends = "slurm_rlhf"
tunnel = "local"

[gpu_one]
extends = "slurm_rlhf"
tunnel = "local"
nodes = 1
gpus_per_node = 0
container_image = "/images/nemo.sqsh"
env_vars = { WANDB_API_KEY = "sk-secret-123456", HF_HOME = "/hf" }
"""


def test_rendered_sbatch_equals_what_nemo_run_writes(home: Path, tmp_path: Path) -> None:
    (tmp_path / "env.toml").write_text(ENV_TOML)
    rm = reward_model_dir(tmp_path / "rm", positions=32)
    cases = [
        ["test/served", "tiny", "local_slurm", [f"inputs.reward_model={rm}"]],  # hetjob, no container
        [
            "rl/reinforce",
            "default",
            "gpu_local",
            ["--force-squash"],
        ],  # hetjob, squash import, torchrun on 2 nodes
        ["rl/ppo", "default", "gpu_one", []],  # hetjob, ready-made .sqsh, a secret in the profile
        ["rl/rlhf", "default", "gpu_one", []],  # one group (generative judge from the hub)
    ]
    env = {**os.environ, "NEMOTRON_HOME": str(home), "NEMOTRON_STEPS_PATH": str(SERVED_STEPS)}
    done = run_to_exit_0([sys.executable, str(HELPER), json.dumps(cases)], env, tmp_path, timeout=300)
    results = json.loads(done.stdout)
    assert len(results) == len(cases)
    for r in results:
        diff = "".join(
            difflib.unified_diff(
                r["ours"].splitlines(True), r["nemo_run"].splitlines(True), "ours", "nemo_run"
            )
        )
        assert r["ours"] == r["nemo_run"], f"{r['case']}:\n{diff}"
    het = results[0]["ours"]
    assert "#SBATCH hetjob" in het and "--het-group=1" in het  # the comparison covered a real hetjob
    assert "sk-secret-123456" not in results[2]["ours"]
