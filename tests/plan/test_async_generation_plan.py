"""The plan of asynchronous generation: NeMo-RL's non-colocated vLLM on GPUs apart from training's, each part sized
on its own GPUs, pinned against NeMo-RL v0.7.0's own async recipe and against its setup's split of the cluster; the
built-in engine's generator process beside each trainer, counted on the trainer's device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.engines.test_nemo_rl_async import nemo_rl_setup

from nemotron.catalog import Catalog
from nemotron.compile import Job, compile_job
from nemotron.engines.nemo_rl.config import compile_run
from nemotron.errors import UserError
from nemotron.launch import submit
from nemotron.plan.placement import Placement
from nemotron.plan.terms import CPU_RUNTIME_MB, MiB

PROFILES = """
[h100_1x8]
extends = "slurm_rlhf"
nodes = 1
[h100_3x8]
extends = "slurm_rlhf"
nodes = 3
"""
ASYNC = ("grpo.async_grpo.enabled=true", "loss_fn.use_importance_sampling_correction=true")
# with 28 prompts a step, whose 8 responses each split evenly over the policy's 7 ranks beside the reward model's GPU
# on one node, and over the 4 that async leaves it (nemotron.engines.nemo_rl.batches)
RM_JUDGE = ("judge.kind=reward_model", "env.should_use_nemo_gym=false", "grpo.num_prompts_per_step=28")
# NeMo-RL's grpo-llama3.1-8b-instruct-2n8g-async-1off.yaml (examples/configs/recipes/llm/performance/) over its
# defaults grpo-llama3.1-8b-instruct-2n8g.yaml, in our keys: meta-llama/Llama-3.1-8B-Instruct (:12 of the
# defaults), train_micro_batch_size 1 (:16), max_total_sequence_length 4096 (:19), Megatron (:21-24) with
# activation_checkpointing (:26), pipeline_model_parallel_size 1 (async :15); async with in-flight weight updates
# (async :2-6); vLLM non-colocated on 1 node of 8 (async :17-21), async engine at gpu_memory_utilization 0.8
# (async :22-24); cluster 2 nodes of 8 (:50-52). Our third node holds the reward model judge, which NeMo-RL keeps
# out of the policy's share (grpo.py:532-539), so the policy plans on exactly the recipe's two nodes.
LLAMA_8B_ASYNC_1OFF = (
    *ASYNC, "grpo.async_grpo.in_flight_weight_updates=true", "policy.model_name=meta-llama/Llama-3.1-8B-Instruct",
    "policy.train_micro_batch_size=1", "nemo_rl.max_prompt_tokens=512", "policy.generation.max_new_tokens=3584",
    "nemo_rl.policy_backend=megatron", "runtime.gradient_checkpointing=true", "nemo_rl.generation_gpus=8",
    "nemo_rl.gpu_memory_utilization=0.8",
)  # fmt: skip
LLAMA_8B = LLAMA_8B_ASYNC_1OFF[3:7]


def job_on(profile: str, *overrides: str, tmp_path: Path) -> Job:
    (tmp_path / "env.toml").write_text(PROFILES)
    return compile_job(Catalog(), "rl/rlhf", "default", overrides=list(overrides), profile_name=profile,
                       mode="batch", dry_run=True)  # fmt: skip


def groups_of(job: Job) -> dict[str, Any]:
    return {g["name"]: g for g in submit.dry_run_json(job)["resource_plan"]["groups"]}


def nemo_rls_split(job: Job) -> tuple[int, int, int, int]:
    """What NeMo-RL's setup makes of the config the job compiles to (tests/engines/test_nemo_rl_async.py)."""
    profile = job.profile
    run = compile_run(job.step_id, job.config, Placement("/j", profile.nodes, profile.gpus_per_node))
    return nemo_rl_setup(run.config)


def test_nemo_rls_own_async_recipe_fits_on_its_two_nodes(home: Path, tmp_path: Path) -> None:
    job = job_on("h100_3x8", *RM_JUDGE, *LLAMA_8B_ASYNC_1OFF, tmp_path=tmp_path)
    groups = groups_of(job)
    assert nemo_rls_split(job) == (
        1,
        8,
        1,
        8,
    )  # training node 0, vLLM node 1, as the recipe's colocated.resources
    train, vllm = groups["policy training"], groups["vLLM generation"]
    assert train["fits"] and vllm["fits"] and groups["reference policy"]["fits"]
    assert (train["nodes"], vllm["nodes"], groups["reward model"]["nodes"]) == ("node 0", "node 1", "node 2")
    assert "distributed optimizer over 8 GPUs" in train["parallelism"]
    assert (
        vllm["parallelism"] == "vLLM TP 1, non-colocated"
        and "policy weights (resident)" not in vllm["terms_mb"]
    )
    # bf16 weights whole on each vLLM GPU (TP 1); the rest of its 80% share holds the KV cache
    weights = 8.03e9 * 2 / 2**20
    assert vllm["terms_mb"]["vLLM weights (bf16)"] == pytest.approx(weights, rel=0.01)
    assert vllm["peak_mb"] == pytest.approx(0.8 * 81559 + 1024)


def test_each_part_is_sized_on_the_gpus_nemo_rl_gives_it(home: Path, tmp_path: Path) -> None:
    """On one node of 8 with a reward model (1 GPU): async takes 3 of the 7 left for vLLM, 4 train; FSDP's shard of
    the training state per GPU is then 7/4 of the colocated run's, which shards it over all 7."""
    sync = job_on("h100_1x8", *RM_JUDGE, *LLAMA_8B, tmp_path=tmp_path)
    apart = job_on("h100_1x8", *RM_JUDGE, *LLAMA_8B, *ASYNC, tmp_path=tmp_path)
    train_nodes, train_gpus, inf_nodes, inf_gpus = nemo_rls_split(apart)
    assert (train_nodes * train_gpus, inf_nodes * inf_gpus) == (4, 3)
    colocated, separate = groups_of(sync)["policy training"], groups_of(apart)["policy training"]
    assert "over 7 GPUs" in colocated["parallelism"] and "over 4 GPUs" in separate["parallelism"]
    assert (
        separate["nodes"] == "node 0, 4 GPUs"
        and groups_of(apart)["vLLM generation"]["nodes"] == "node 0, 3 GPUs"
    )
    for term in ("weights", "gradients", "optimizer"):
        assert separate["terms_mb"][term] == pytest.approx(colocated["terms_mb"][term] * 7 / 4)


@pytest.mark.parametrize(
    ("extra", "refused", "remedy"),
    [
        # training on 1 GPU cannot hold an 8B model's FSDP state; 3 for vLLM leaves it 4, which can
        (("nemo_rl.generation_gpus=6",), "policy training (node 0, 1 GPU)", "To fit: nemo_rl.generation_gpus=3 (now 6)"),
        # 15% of a GPU cannot hold vLLM's 15 GiB of weights; alone on its GPUs it may take 90%
        (("nemo_rl.gpu_memory_utilization=0.15",), "vLLM generation (node 0, 3 GPUs)",
         "To fit: nemo_rl.gpu_memory_utilization=0.9 (now 0.15)"),
    ],
    ids=["training", "generation"],
)  # fmt: skip
def test_a_part_that_does_not_fit_is_refused_with_a_remedy_that_fits(
    extra: tuple[str, ...], refused: str, remedy: str, home: Path, tmp_path: Path
) -> None:
    job = job_on("h100_1x8", *RM_JUDGE, *LLAMA_8B, *ASYNC, *extra, tmp_path=tmp_path)
    with pytest.raises(UserError) as err:
        submit.dry_run_json(job)
    assert str(err.value).startswith(f"resource plan: {refused} needs ") and remedy in str(err.value)


def test_the_builtin_generator_process_is_counted_on_the_trainers_device(home: Path, tmp_path: Path) -> None:
    """On the CPU (the tiny preset, this machine's RAM) each rank's generator process holds a copy of the policy in the
    trainer's dtype and a process's runtime, and the weights pass through age + 1 shared-memory copies of it."""

    def training(*extra: str) -> tuple[Job, dict[str, Any]]:
        job = compile_job(
            Catalog(), "rl/reinforce", "tiny", overrides=list(extra), mode="batch", dry_run=True
        )
        return job, groups_of(job)["policy training"]

    job, sync = training()
    _, apart = training("reinforce.async_grpo.enabled=true", "reinforce.use_importance_sampling_correction=true",
                        "reinforce.async_grpo.max_trajectory_age_steps=2")  # fmt: skip
    copy = apart["models"][0]["parameters"] * (2 if job.config.runtime.precision == "bf16" else 4) / MiB
    added = {k: v for k, v in apart["terms_mb"].items() if k not in sync["terms_mb"]}
    assert added == pytest.approx({"async generator: policy copy": copy, "async generator: runtime": CPU_RUNTIME_MB,
                                   "async weight slots (shared memory)": 3 * copy})  # fmt: skip
    assert apart["peak_mb"] == pytest.approx(
        sync["peak_mb"] + sum(added.values())
    )  # the CPU's peak sums every term
