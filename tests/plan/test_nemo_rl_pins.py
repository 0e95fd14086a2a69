"""The plan at GPU scale, pinned against what NeMo-RL v0.7.0's own example configs say fits: each case is one of
its examples/configs/*.yaml expressed in our keys (file and line cited), planned on the H100-80GB its benchmarks
run on (docs/about/performance-summary.md:50, "System: DGX-H100"). An example NeMo-RL ships must fit; the same
model with settings that shard less must be refused, naming the term and the keys that would fit it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nemotron.catalog import Catalog
from nemotron.compile import compile_job
from nemotron.errors import UserError
from nemotron.launch import submit

# Each example's nodes plus one for rl/rlhf's judge, which NeMo-RL keeps out of the policy's cluster: a reward model
# (one node of its own on a multi-node job, grpo.py setup), so the policy plans on exactly the example's GPUs. NeMo-Gym's
# GenRM would need nodes of 4 GPUs (tests/plan/test_judge_plan.py).
PROFILES = """
[h100_1x1]
extends = "slurm_rlhf"
nodes = 2
gpus_per_node = 1
[h100_1x8]
extends = "slurm_rlhf"
nodes = 2
[h100_8x8]
extends = "slurm_rlhf"
nodes = 9
"""
JUDGE_APART = ("judge.kind=reward_model", "env.should_use_nemo_gym=false")


def plan(profile: str, *overrides: str, tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "env.toml").write_text(PROFILES)
    job = compile_job(Catalog(), "rl/rlhf", "default", overrides=[*JUDGE_APART, *overrides], profile_name=profile,
                      mode="batch", dry_run=True)  # fmt: skip
    groups = submit.dry_run_json(job)["resource_plan"]["groups"]
    assert groups[0]["nodes"] == ("node 0" if profile != "h100_8x8" else "nodes 0-7")  # the example's nodes
    return {g["name"]: g for g in groups}


def sequence(total: int) -> tuple[str, str]:
    """NeMo-RL's max_total_sequence_length in our keys: prompt budget + new tokens."""
    return "nemo_rl.max_prompt_tokens=512", f"policy.generation.max_new_tokens={total - 512}"


# grpo_math_1B.yaml: Qwen/Qwen2.5-1.5B (:102), train_micro_batch_size 4 (:108), max_total_sequence_length 512
# (:111), DTensor without cpu_offload (:119) or activation_checkpointing (:121), TP 1 (:122), vLLM TP 1 at
# gpu_memory_utilization 0.6 (:341, :344), on 1 node of 1 GPU (:438-440).
QWEN_1_5B = ("policy.model_name=Qwen/Qwen2.5-1.5B", "policy.train_micro_batch_size=4", "nemo_rl.max_prompt_tokens=256",
             "policy.generation.max_new_tokens=256", "nemo_rl.gpu_memory_utilization=0.6")  # fmt: skip
# grpo_math_8B.yaml: meta-llama/Llama-3.1-8B-Instruct (:12), train_micro_batch_size 1 (:16),
# max_total_sequence_length 4096 (:19), bfloat16 (:20), DTensor (:22-23; cpu_offload and activation
# checkpointing off from grpo_math_1B.yaml:119, :121), vLLM TP 1 at 0.6 (:55-56), 1 node of 8 GPUs (:61-62).
LLAMA_8B = ("policy.model_name=meta-llama/Llama-3.1-8B-Instruct", "policy.train_micro_batch_size=1", *sequence(4096),
            "nemo_rl.gpu_memory_utilization=0.6")  # fmt: skip
# grpo_math_70B_megatron.yaml: meta-llama/Llama-3.3-70B-Instruct (:9), train_micro_batch_size 1 (:14),
# max_total_sequence_length 4096 (:15), Megatron (:25-26) TP 4 (:28) PP 4 (:29) CP 1 (:30), vLLM TP 8 at 0.6
# (:60-61), 8 nodes of 8 GPUs (:65-66).
LLAMA_70B = ("policy.model_name=meta-llama/Llama-3.3-70B-Instruct", "policy.train_micro_batch_size=1",
             *sequence(4096), "nemo_rl.policy_backend=megatron", "nemo_rl.tensor_parallel_size=4",
             "nemo_rl.pipeline_parallel_size=4", "nemo_rl.generation_tensor_parallel_size=8",
             "nemo_rl.gpu_memory_utilization=0.6")  # fmt: skip


@pytest.mark.parametrize(
    ("profile", "overrides"),
    [("h100_1x1", QWEN_1_5B), ("h100_1x8", LLAMA_8B), ("h100_8x8", LLAMA_70B)],
    ids=["grpo_math_1B", "grpo_math_8B", "grpo_math_70B_megatron"],
)
def test_nemo_rls_own_examples_fit(
    profile: str, overrides: tuple[str, ...], home: Path, tmp_path: Path
) -> None:
    groups = plan(profile, *overrides, tmp_path=tmp_path)
    assert {"policy training", "reference policy", "vLLM generation"} <= set(groups)
    for name in ("policy training", "reference policy", "vLLM generation"):
        assert groups[name]["fits"], (name, groups[name]["peak_mb"], groups[name]["terms_mb"])
    # and not by a wide margin that would make the check useless: each example uses a good part of its GPUs
    assert groups["policy training"]["peak_mb"] > 0.15 * groups["policy training"]["available_mb"]


def test_the_8b_example_on_one_gpu_is_refused(home: Path, tmp_path: Path) -> None:
    """grpo_math_8B.yaml's settings on grpo_math_1B.yaml's single GPU: 8.03B x 16 bytes of fp32 weights,
    gradients and AdamW state is 120 GiB before any activation."""
    with pytest.raises(UserError) as refused:
        plan("h100_1x1", *LLAMA_8B, tmp_path=tmp_path)
    line = str(refused.value)
    assert "policy training" in line and "the largest term is optimizer (59.8 GiB)" in line
    # issue 43: TP 2 is refused on one GPU by the engine's own rule, and checkpointing leaves 128 GiB: each remedy
    # is re-planned before it is named, and only more GPUs is left
    assert "To fit: more GPUs (the profile's nodes, now 2) (or plan.on_no_fit=warn" in line, line


def test_the_70b_example_without_pipeline_parallelism_on_one_node_is_refused(
    home: Path, tmp_path: Path
) -> None:
    """grpo_math_70B_megatron.yaml's model with DTensor on 8 GPUs: 70.6B x 16 bytes / 8 = 132 GiB of weights,
    gradients and optimizer per GPU, and 80 layers of a 4,096-token sequence's activations, unsplit by TP."""
    with pytest.raises(UserError) as refused:
        plan("h100_1x8", "policy.model_name=meta-llama/Llama-3.3-70B-Instruct", "policy.train_micro_batch_size=1",
             *sequence(4096), "nemo_rl.generation_tensor_parallel_size=8", tmp_path=tmp_path)  # fmt: skip
    line = str(refused.value)
    assert "the largest term is activations" in line and "needs 2" in line  # over 200 GiB per GPU
    # checkpointing alone leaves 132 GiB of weights, gradients and optimizer per GPU: not named
    assert "To fit: more GPUs (the profile's nodes, now 2) (or" in line, line


def test_a_colocated_vllm_share_too_small_for_the_weights_is_refused(home: Path, tmp_path: Path) -> None:
    """Llama-3.1-8B's bf16 weights are 15 GiB: a 10% vLLM share (8 GiB of an H100) cannot hold them."""
    with pytest.raises(UserError) as refused:
        plan("h100_1x8", *LLAMA_8B, "nemo_rl.gpu_memory_utilization=0.1", tmp_path=tmp_path)
    assert "vLLM generation" in str(refused.value) and "nemo_rl.generation_tensor_parallel_size=2" in str(
        refused.value
    )
