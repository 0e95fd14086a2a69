"""The resource plan as users meet it: the table in --dry-run (and its JSON), the refusal of a plan that cannot fit
(exit 2, one line, nothing written), plan.on_no_fit=warn, plan.models hints, and plan.json in every job dir."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SMALL_GPUS = """
[small_gpus]
extends = "slurm_rlhf"
gpu_memory_gb = 24
"""


def test_the_dry_run_shows_the_plan_per_gpu(home: Path, run_cli_imports: Any) -> None:
    r, imported = run_cli_imports("steps", "run", "rl/ppo", "-c", "default", "-b", "slurm_rlhf", "--dry-run")
    assert r.code == 0, r.err
    assert "nemotron.plan.terms" in imported  # planned on the dry-run's path, still without torch or NeMo-Run
    assert not {"torch", "nemo_run", "transformers", "safetensors"} & imported
    plan = r.out.split("## resource plan")[1].split("## launch")[0]
    rows = {line.split("  ")[0]: line for line in plan.splitlines()[1:] if line and not line.startswith("#")}
    assert set(rows) == {"group", "policy training", "reward model"}
    assert "H100-80GB (80 GiB)" in rows["policy training"] and "79.6 GiB" in rows["policy training"]
    assert " yes " in rows["policy training"]
    assert "DDP over 16 GPUs" in plan  # 2 nodes x 8 GPUs of the profile, the built-in engine's parallelism
    # the preset's plan.models hint, named as such beside the cluster path it sizes
    assert (
        "meta-llama/Llama-3.2-1B-Instruct (1.24B, plan.models.policy, standing in for /models/sft_policy)"
        in plan
    )
    assert not home.exists()


def test_a_plan_that_cannot_fit_is_exit_2_in_one_line_and_writes_nothing(
    home: Path, tmp_path: Path, run_cli: Any
) -> None:
    (tmp_path / "env.toml").write_text(SMALL_GPUS)
    for mode in (["--dry-run"], []):  # refused the same in dry-run and submit, before anything is written
        r = run_cli("steps", "run", "rl/ppo", "-c", "default", "-b", "small_gpus", *mode)
        assert r.code == 2, r.err
        (line,) = r.err.strip().splitlines()
        for words in ("policy training", "GPU (gpu_memory_gb = 24)", "which has 24.0 GiB", "largest term is",
                      "To fit: backend=nemo_rl (FSDP shards", "plan.on_no_fit=warn"):  # fmt: skip
            assert words in line, line
        assert "Traceback" not in r.err
        assert not home.exists()


def test_each_remedy_named_makes_the_plan_fit_and_the_dropped_ones_do_not(
    home: Path, tmp_path: Path, run_cli: Any
) -> None:
    """Issue 43: a refusal named remedies that did not fit. Each one is now re-planned before it is named: the named
    one, applied, passes the dry run; each the engine suggested and the refusal dropped is still refused."""
    (tmp_path / "env.toml").write_text(SMALL_GPUS)
    base = ("steps", "run", "rl/ppo", "-c", "default", "-b", "small_gpus", "--dry-run")
    line = run_cli(*base).err
    assert (
        "To fit: backend=nemo_rl (FSDP shards weights, gradients and optimizer over the GPUs) (or" in line
    ), line
    assert run_cli(*base, "backend=nemo_rl").code == 0
    for dropped in (
        "runtime.gradient_checkpointing=true",
        "trainer.micro_batch_size=1",
        "runtime.precision=bf16",
    ):
        r = run_cli(*base, dropped)
        assert r.code == 2 and "resource plan: policy training" in r.err, (dropped, r.err)


def test_on_no_fit_warn_turns_the_refusal_into_a_warning(home: Path, tmp_path: Path, run_cli: Any) -> None:
    (tmp_path / "env.toml").write_text(SMALL_GPUS)
    r = run_cli(
        "steps", "run", "rl/ppo", "-c", "default", "-b", "small_gpus", "plan.on_no_fit=warn", "--dry-run"
    )
    assert r.code == 0, r.err
    assert "warning: resource plan: policy training" in r.out
    assert " NO " in r.out.split("## resource plan")[1]


def test_the_dry_run_json_holds_the_plan(home: Path, run_cli: Any) -> None:
    r = run_cli("steps", "run", "rl/rlhf", "-c", "default", "-b", "slurm_rlhf", "--dry-run", "--json")
    assert r.code == 0, r.err
    plan = json.loads(r.out)["resource_plan"]
    names = [g["name"] for g in plan["groups"]]
    assert names == ["policy training", "reference policy", "vLLM generation", "judge (NeMo-Gym GenRM)"]
    training = plan["groups"][0]
    assert training["fits"] and training["available_mb"] == 81559
    # the policy's cluster is node 0's 8 GPUs: node 1 is NeMo-Gym's judge's (tests/plan/test_judge_plan.py)
    assert training["parallelism"] == "DTensor FSDP over 8 GPUs, TP 1, CP 1" and training["nodes"] == "node 0"
    judge = plan["groups"][3]
    assert judge["fits"] and judge["enforced"] and not judge["shortfall"] and judge["nodes"] == "node 1"
    assert plan["unknown"] == []
    assert run_cli("steps", "run", "sft", "-c", "tiny", "--json").code == 2  # --json only with --dry-run


def test_plan_models_hints_are_checked(home: Path, run_cli: Any) -> None:
    base = ("steps", "run", "rl/ppo", "-c", "default", "-b", "slurm_rlhf", "--dry-run")
    r = run_cli(*base, "plan.models.policy=Qwen/Qwen2.5-0.5B")
    assert r.code == 0, r.err
    assert "policy Qwen/Qwen2.5-0.5B (494M, plan.models.policy, standing in for /models/sft_policy)" in r.out
    # an input the table knows is planned as itself, whatever the hint says
    table = run_cli(
        *base, "inputs.policy=Qwen/Qwen2.5-0.5B", "plan.models.policy=meta-llama/Llama-3.1-8B-Instruct"
    )
    assert table.code == 0 and "policy Qwen/Qwen2.5-0.5B (494M, shape table)" in table.out, table.err
    # an 8B policy on the built-in engine's DDP: every GPU would hold all of its optimizer state
    big = run_cli(*base, "plan.models.policy=meta-llama/Llama-3.1-8B-Instruct")
    assert big.code == 2 and "the largest term is optimizer (59.8 GiB)" in big.err
    bad = run_cli(*base, "plan.models.policy=acme/unknown-7b")
    assert bad.code == 2 and "not in the shape table" in bad.err
    unused = run_cli(*base, "plan.models.judge=meta-llama/Llama-3.1-8B-Instruct")
    assert unused.code == 2 and "plan.models names judge" in unused.err


def test_a_local_job_dir_holds_plan_json(home: Path, run_cli: Any) -> None:
    r = run_cli("steps", "run", "sft", "-c", "tiny", "trainer.max_steps=2", timeout=300)
    assert r.code == 0, r.err[-2000:]
    (job_dir,) = (home / "jobs").iterdir()
    plan = json.loads((job_dir / "plan.json").read_text())
    (group,) = plan["groups"]
    assert (
        group["name"] == "policy training" and group["device"] == "RAM" and group["nodes"] == "this machine"
    )
    assert group["models"][0]["source"] == "model.*" and group["peak_mb"] > 0
    metrics = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    measured = max(m["peak_memory_mb"] for m in metrics if "peak_memory_mb" in m)
    # model.*'s vocabulary is the trained tokenizer's ceiling (4,096; the tiny data gives 476): an upper bound
    assert group["peak_mb"] >= 0.9 * measured, (group["peak_mb"], measured)


@pytest.mark.slurm(group="single")
def test_a_slurm_job_dir_holds_plan_json(home: Path, slurm_cluster: Any) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "nemotron", "steps", "run", "sft", "-c", "tiny", "trainer.max_steps=1", "-b",
         "local_slurm"], capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    job_id = done.stdout.strip().splitlines()[-1]
    try:
        plan = json.loads((home / "jobs" / job_id / "plan.json").read_text())
        assert [g["name"] for g in plan["groups"]] == ["policy training"]
        assert plan["groups"][0]["nodes"] == "node 0"
    finally:
        subprocess.run(
            [sys.executable, "-m", "nemotron", "jobs", "cancel", job_id], capture_output=True, timeout=60
        )


def test_a_local_plan_over_this_machines_ram_warns_and_runs_the_dry_run(home: Path, run_cli: Any) -> None:
    """RAM is shared and backed by swap: a local plan over it is a warning (a GPU's memory is a refusal)."""
    r = run_cli("steps", "run", "rl/ppo", "-c", "default", "plan.models.policy=meta-llama/Llama-3.3-70B-Instruct",
                "--dry-run")  # fmt: skip
    assert r.code == 0, r.err
    assert "warning: resource plan: policy training (this machine)" in r.out and "per device (RAM)" in r.out


def test_on_lepton_each_nodes_reward_server_shares_local_rank_0s_gpu(home: Path, run_cli: Any) -> None:
    """Lepton runs no heterogeneous job: the reward server is a sibling of each node's local rank 0
    (reward/sibling.py) on that rank's GPU, so its memory is on the policy group's device, not on a node of its
    own. rl/ppo's default preset (actor, critic and the server on GPU 0) then does not fit; with activation
    checkpointing it does."""
    r = run_cli("steps", "run", "rl/ppo", "-c", "default", "-b", "lepton_rl", "--dry-run")
    assert r.code == 2, r.err
    (line,) = r.err.strip().splitlines()
    assert "policy training (node 0)" in line and "which has 79.6 GiB" in line, line
    r = run_cli("steps", "run", "rl/reinforce", "-c", "default", "-b", "lepton_rl", "--dry-run")
    assert r.code == 0, r.err
    plan = r.out.split("## resource plan")[1].split("## launch")[0]
    rows = [line for line in plan.splitlines()[2:] if line and not line.startswith("#")]  # below the header
    assert [row.split("  ")[0] for row in rows] == ["policy training"]  # no node of its own for the server
    assert "reward model server" in rows[0] and "a node of its own" not in plan
    assert "shares its device with the node's reward model server" in plan
    assert not home.exists()
