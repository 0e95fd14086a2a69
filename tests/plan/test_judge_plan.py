"""The judge planned where it runs (issue 43): a generative judge was "not planned (outside the policy's GPUs)" on a
1-GPU profile where no other GPU exists. The built-in engine's judge server is planned on the device it starts on
(beside local rank 0, or a node of its own in a Slurm job's group 0); NeMo-RL's is NeMo-Gym's own vLLM, which needs
GPUs outside NeMo-RL's cluster: none are left, and the dry run says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ONE_GPU = """
[one_gpu]
extends = "slurm_rlhf"
nodes = 1
gpus_per_node = 1
"""
BUILTIN = ("backend=builtin", "env.should_use_nemo_gym=false", "judge.kind=generative")


def _plan(out: str) -> tuple[dict[str, str], str]:
    """The dry run's plan table: its rows by group name, and the whole section."""
    plan = out.split("## resource plan")[1].split("## launch")[0]
    rows = {line.split("  ")[0]: line for line in plan.splitlines()[2:] if line and not line.startswith("#")}
    return rows, plan


def test_a_builtin_judge_server_is_planned_on_the_policys_gpu(
    home: Path, tmp_path: Path, run_cli: Any
) -> None:
    """The step starts the judge's chat server itself (no group 0: the sbatch script has no hetjob), under local
    rank 0 on its GPU: on one GPU its memory is on the policy's device, and a judge too large for it is refused
    naming the judge server."""
    (tmp_path / "env.toml").write_text(ONE_GPU)
    r = run_cli("steps", "run", "rl/rlhf", "-c", "default", "-b", "one_gpu", *BUILTIN, "--dry-run")
    assert r.code == 0, r.err
    rows, plan = _plan(r.out)
    assert list(rows) == ["policy training"] and "judge server" in rows["policy training"], plan
    assert "node 0" in rows["policy training"] and "not planned" not in plan
    assert "#SBATCH hetjob" not in r.out
    big = run_cli("steps", "run", "rl/rlhf", "-c", "default", "-b", "one_gpu", *BUILTIN,
                  "env.nemo_gym.genrm_model.responses_api_models.vllm_model.model=meta-llama/Llama-3.1-8B-Instruct",
                  "--dry-run")  # fmt: skip
    assert big.code == 2, big.out[-2000:]
    (line,) = big.err.strip().splitlines()
    assert "resource plan: policy training (node 0)" in line and "the largest term is judge server" in line, (
        line
    )


def test_a_vllm_judge_under_slurm_is_planned_on_its_own_node_at_its_share(
    home: Path, tmp_path: Path, run_cli: Any
) -> None:
    """judge.server=vllm: group 0 of the hetjob runs `vllm serve --gpu-memory-utilization` on a node of its own, so
    the plan's judge is that node's GPU holding vLLM's share of it."""
    (tmp_path / "env.toml").write_text(ONE_GPU)
    r = run_cli("steps", "run", "rl/rlhf", "-c", "default", "-b", "one_gpu", *BUILTIN, "judge.server=vllm",
                "judge.vllm_gpu_memory_utilization=0.5", "--dry-run")  # fmt: skip
    assert r.code == 0, r.err
    rows, _ = _plan(r.out)
    assert list(rows) == ["policy training", "judge"]
    assert "#SBATCH hetjob" in r.out and "--memory 0.5" in r.out
    assert "node 1 (a node of its own)" in rows["judge"]
    assert "vLLM share (weights + KV cache) 39.8 GiB" in rows["judge"]  # half of the H100's 79.6 GiB
    assert "judge server" not in rows["policy training"]


def test_nemo_rls_generative_judge_has_no_gpu_left_and_the_dry_run_warns(
    home: Path, tmp_path: Path, run_cli: Any
) -> None:
    """NeMo-Gym's GenRM (genrm_compare.yaml at the Gym commit NeMo-RL v0.7.0 pins: vLLM DP 2 x TP 4) places 8 GPUs of
    its own; our config gives NeMo-RL's cluster every GPU of the job. The dry run shows the judge without GPUs and
    warns, naming the ways out that plan without the warning on that profile."""
    (tmp_path / "env.toml").write_text(ONE_GPU)
    r = run_cli("steps", "run", "rl/rlhf", "-c", "default", "-b", "one_gpu", "--dry-run")
    assert r.code == 0, r.err
    rows, plan = _plan(r.out)
    assert "no GPU left" in rows["judge (NeMo-Gym GenRM)"] and " NO " in rows["judge (NeMo-Gym GenRM)"]
    assert "not planned" not in plan
    (warning,) = [line for line in r.out.splitlines() if line.startswith("warning: resource plan")]
    assert "judge (NeMo-Gym GenRM) (no GPU left): NeMo-Gym's GenRM vLLM needs 8 GPUs outside NeMo-RL's cluster, " \
           "which takes every one of the job's 1" in warning, warning  # fmt: skip
    # each way out it names plans without the warning; a reward model would leave the policy no GPU of one
    assert (
        "To fit: backend=builtin env.should_use_nemo_gym=false (" in warning and "reward_model" not in warning
    )
    fixed = run_cli("steps", "run", "rl/rlhf", "-c", "default", "-b", "one_gpu", "backend=builtin",
                    "env.should_use_nemo_gym=false", "--dry-run")  # fmt: skip
    assert fixed.code == 0 and "warning: resource plan" not in fixed.out, fixed.err
    r = run_cli("steps", "run", "rl/rlhf", "-c", "default", "-b", "slurm_rlhf", "--dry-run")
    (warning,) = [line for line in r.out.splitlines() if line.startswith("warning: resource plan")]
    assert "every one of the job's 16 (" in warning and "To fit: judge.kind=reward_model env.should_use_nemo_gym=false (" \
        in warning  # fmt: skip
    fixed = run_cli("steps", "run", "rl/rlhf", "-c", "default", "-b", "slurm_rlhf", "judge.kind=reward_model",
                    "env.should_use_nemo_gym=false", "--dry-run")  # fmt: skip
    assert fixed.code == 0 and "warning: resource plan" not in fixed.out, fixed.err
    assert "judge (NeMo-Gym GenRM)" not in fixed.out
