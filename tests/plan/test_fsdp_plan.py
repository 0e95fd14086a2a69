"""The built-in engine's plan under runtime.sharding: FSDP divides weights, gradients and AdamW state by the ranks
(and says so); a DDP plan that cannot fit names runtime.sharding=fsdp only where that fits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ONE_NODE = """
[one_node]
extends = "slurm_rlhf"
nodes = 1
"""
# 1 node x 8 x H100-80GB; a fine-tune of a pretrained model, 8 sequences a step, under DDP unless a test says fsdp
SFT = ("steps", "run", "sft", "-c", "default", "-b", "one_node", "trainer.global_batch_size=8",
       "runtime.gradient_checkpointing=true", "runtime.precision=bf16-mixed", "runtime.sharding=ddp",
       "--dry-run")  # fmt: skip
LLAMA_8B = ("inputs.init_from=/models/llama-8b", "plan.models.policy=meta-llama/Llama-3.1-8B-Instruct")
LLAMA_70B = ("inputs.init_from=/models/llama-70b", "plan.models.policy=meta-llama/Llama-3.3-70B-Instruct")


def _training(out: str) -> dict[str, Any]:
    (group,) = [g for g in json.loads(out)["resource_plan"]["groups"] if g["name"] == "policy training"]
    return group  # type: ignore[no-any-return]


def test_an_8b_sft_on_8_gpus_is_refused_with_ddp_naming_fsdp_and_fits_with_it(
    home: Path, tmp_path: Path, run_cli: Any
) -> None:
    (tmp_path / "env.toml").write_text(ONE_NODE)
    ddp = run_cli(*SFT, *LLAMA_8B)
    assert ddp.code == 2, ddp.out[-2000:]
    (line,) = ddp.err.strip().splitlines()
    assert (
        "the largest term is optimizer (59.8 GiB)" in line and "runtime.sharding=fsdp (shards weights" in line
    )

    fsdp = run_cli(*SFT, *LLAMA_8B, "runtime.sharding=fsdp", "--json")
    assert fsdp.code == 0, fsdp.err[-2000:]
    group, whole = (
        _training(fsdp.out),
        _training(run_cli(*SFT, *LLAMA_8B, "plan.on_no_fit=warn", "--json").out),
    )
    assert group["fits"] and not whole["fits"]
    assert group["parallelism"] == "FSDP over 8 GPUs" and whole["parallelism"] == "DDP over 8 GPUs"
    for term in ("weights", "gradients", "optimizer"):  # each an eighth of DDP's
        assert abs(group["terms_mb"][term] * 8 - whole["terms_mb"][term]) < 1, term
    assert "bf16 weight copies" in whole["terms_mb"] and "bf16 weight copies" not in group["terms_mb"]
    assert group["terms_mb"]["gathered layers (FSDP)"] > 0
    shown = run_cli(*SFT, *LLAMA_8B, "runtime.sharding=fsdp").out
    assert (
        "FSDP divides weights, gradients and AdamW state by 8: 15.0 GiB per device instead of 134.6 GiB"
        in shown
    )


def test_a_70b_sft_is_refused_with_ddp_and_fsdp_is_not_named_where_it_does_not_fit(
    home: Path, tmp_path: Path, run_cli: Any
) -> None:
    (tmp_path / "env.toml").write_text(ONE_NODE)
    ddp = run_cli(*SFT, *LLAMA_70B)
    assert ddp.code == 2 and "none of" in ddp.err and "runtime.sharding=fsdp is enough" in ddp.err, ddp.err
    # 70B over 8 ranks is still ~142 GiB a GPU: fsdp is not named as a remedy on its own
    fsdp = run_cli(*SFT, *LLAMA_70B, "runtime.sharding=fsdp")
    assert fsdp.code == 2 and "runtime.sharding=fsdp" not in fsdp.err.split("To fit:")[1], fsdp.err


# rl/dpo's default preset (bf16-mixed: fp32 weights) on 8 GPUs; its pairs need no file to plan
DPO = ("steps", "run", "rl/dpo", "-c", "default", "-b", "one_node", "inputs.policy=/models/llama-8b",
       "plan.models.policy=meta-llama/Llama-3.1-8B-Instruct", "runtime.sharding=fsdp",
       "runtime.gradient_checkpointing=true", "--dry-run", "--json")  # fmt: skip


def test_a_dpo_plan_holds_the_whole_frozen_reference_and_one_micro_batch(
    home: Path, tmp_path: Path, run_cli: Any
) -> None:
    (tmp_path / "env.toml").write_text(ONE_NODE)
    one, two = (_training(run_cli(*DPO, f"trainer.micro_batch_size={m}").out) for m in (1, 2))
    fp32_weights_mb = one["models"][0]["parameters"] * 4 / 2**20
    # the reference policy is every weight on every rank, while FSDP gives each rank an eighth of the trained one
    assert abs(one["terms_mb"]["reference weights"] - fp32_weights_mb) < 1
    assert abs(one["terms_mb"]["weights"] * 8 - fp32_weights_mb) < 1
    # activations follow the micro-batch's pairs (two rows each), not the 128 pairs of a step
    assert abs(two["terms_mb"]["activations"] - 2 * one["terms_mb"]["activations"]) < 1
    assert "trainer.micro_batch_size=1 (now 2)" in two["suggestions"]


def test_the_plan_and_the_fsdp_checks_count_the_ranks_the_executor_starts(
    home: Path, tmp_path: Path, run_cli: Any
) -> None:
    """Slurm without GPUs starts ntasks_per_node ranks on each node (slurm.plan_slurm): 2 nodes x 2 tasks is 4 ranks,
    for the plan's division of the state and for the prompts FSDP needs to divide evenly."""
    (tmp_path / "env.toml").write_text(
        '[cpu_tasks]\nextends = "local_slurm"\nnodes = 2\nntasks_per_node = 2\n'
    )
    sft = ("steps", "run", "sft", "-c", "tiny", "-b", "cpu_tasks", "--dry-run", "--json")
    assert _training(run_cli(*sft).out)["parallelism"] == "DDP over 4 processes"
    assert _training(run_cli(*sft, "runtime.sharding=fsdp").out)["parallelism"] == "FSDP over 4 processes"
    rlhf = ("steps", "run", "rl/rlhf", "-c", "tiny", "-b", "cpu_tasks", "runtime.sharding=fsdp", "--dry-run")
    refused = run_cli(*rlhf, "grpo.num_prompts_per_step=6")
    assert refused.code == 2 and "6 prompts a step do not divide over the job's 4 ranks" in refused.err, (
        refused.err
    )
    assert run_cli(*rlhf, "grpo.num_prompts_per_step=8").code == 0
