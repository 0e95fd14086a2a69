"""The batch rule of NeMo-RL v0.7.0 at compile (nemotron.engines.nemo_rl.batches) for the RL recipes: a step's
responses split evenly over the policy's data-parallel ranks in whole micro-batches, the ranks counted as NeMo-RL
splits the cluster (the reward model's GPUs or node, NeMo-Gym's judge's node, vLLM's own GPUs). Each case's ranks
are worked out by hand in its comment. sft, rm/train: tests/engines/test_nemo_rl_supervised.py."""

from __future__ import annotations

from typing import Any

import pytest
from tests.engines import nemo_rl_v070 as tag
from tests.engines.mirrors import git_show
from tests.engines.test_nemo_rl_config import GYM, JOB, step_model

from nemotron.config.workload import Rollouts
from nemotron.engines.nemo_rl.batches import even_batches
from nemotron.engines.nemo_rl.config import compile_run
from nemotron.errors import UserError
from nemotron.plan.placement import Placement


def _compile(step: str, nodes: int, gpus: int, **overrides: Any) -> dict[str, Any]:
    return compile_run(step, step_model(step, **overrides), Placement(JOB, nodes, gpus)).config


def _refused(step: str, nodes: int, gpus: int, **overrides: Any) -> str:
    with pytest.raises(UserError) as err:
        _compile(step, nodes, gpus, **overrides)
    (problem,) = err.value.problems
    return str(problem)


@pytest.mark.parametrize(
    ("step", "nodes", "overrides", "key", "multiple", "passes"),
    [
        # 1 node of 8, the reward model takes 1: 7 ranks; 32 x 8 = 256 responses, micro-batches of 16 -> 112
        ("rl/rlhf", 1, {}, "grpo.num_prompts_per_step", "7 x policy.train_micro_batch_size 16 = 112",
         {"grpo__num_prompts_per_step": 14}),
        # 2 nodes, the reward model on the second: 8 ranks; micro-batches of 1 -> 8; 7 x 3 = 21 responses, 8 x 3 = 24
        ("rl/rlhf", 2, {"grpo__num_prompts_per_step": 7, "grpo__num_generations_per_prompt": 3,
                        "policy__train_micro_batch_size": 1},
         "grpo.num_prompts_per_step", "a multiple of 8", {"grpo__num_prompts_per_step": 8}),
        # a global batch that does not divide a step's 256 responses
        ("rl/rlhf", 2, {"policy__train_global_batch_size": 100}, "policy.train_global_batch_size",
         "a divisor of 256", {"policy__train_global_batch_size": 128}),
        # 8 ranks x micro-batches of 16 = 128, but an update of 64: each rank gets 8 rows, not one micro-batch
        ("rl/rlhf", 2, {"policy__train_global_batch_size": 64}, "policy.train_global_batch_size",
         "8 x policy.train_micro_batch_size 16 = 128", {"policy__train_micro_batch_size": 8}),
        # Megatron at TP 2 x PP 2 over one node's 8 GPUs: 2 ranks; 5 x 8 = 40 responses in micro-batches of 16
        ("rl/rlhf", 2, {"nemo_rl__policy_backend": "megatron", "nemo_rl__tensor_parallel_size": 2,
                        "nemo_rl__pipeline_parallel_size": 2, "grpo__num_prompts_per_step": 5},
         "grpo.num_prompts_per_step", "2 x policy.train_micro_batch_size 16 = 32", {"grpo__num_prompts_per_step": 4}),
        # async on one node: vLLM takes 3 of the 7 the reward model leaves, training 4; 12 x 8 = 96 is not 4 x 16 x k
        ("rl/rlhf", 1, {"grpo__async_grpo__enabled": True, "loss_fn__use_importance_sampling_correction": True,
                        "grpo__num_prompts_per_step": 12},
         "grpo.num_prompts_per_step", "4 x policy.train_micro_batch_size 16 = 64", {"grpo__num_prompts_per_step": 8}),
        # rl/reinforce: 16 x 4 = 64 responses over 8 ranks in micro-batches of 16 (128)
        ("rl/reinforce", 2, {"trainer__micro_batch_size": 16}, "trainer.num_prompts_per_step",
         "8 x trainer.micro_batch_size 16 = 128", {"trainer__micro_batch_size": 8}),
        # rl/ppo: 16 x 1 responses; one node beside the reward model: 7 ranks
        ("rl/ppo", 1, {"trainer__micro_batch_size": 1}, "trainer.num_prompts_per_step", "a multiple of 7",
         {"trainer__num_prompts_per_step": 14}),
    ],
)  # fmt: skip
def test_a_step_the_ranks_cannot_split_is_refused_and_the_named_multiple_passes(
    step: str, nodes: int, overrides: dict[str, Any], key: str, multiple: str, passes: dict[str, Any]
) -> None:
    problem = _refused(step, nodes, 8, **overrides)
    assert problem.startswith(f"{key}=") and multiple in problem, problem
    assert "shard_by_batch_size asserts it" in problem
    _compile(step, nodes, 8, **{**overrides, **passes})


@pytest.mark.parametrize(("ranks", "prompts", "micro", "batch", "named"), [
    (8, 32, 16, None, []),  # 256 responses over 8 ranks of 16 already split
    (7, 32, 16, None, ["grpo.num_prompts_per_step=28"]),  # prompts of 14s (112 / gcd(8, 112)): 28 is nearest
    (7, 32, 1, None, ["grpo.num_prompts_per_step=35"]),  # prompts of 7s: 35 is nearer than 28
    (8, 5, 16, None, ["grpo.num_prompts_per_step=16"]),  # none below one multiple (16s) of 128 / 8
    # 224 responses in updates that are multiples of 112 and divide them: 112, the nearest to 64
    (7, 32, 16, 64, ["grpo.num_prompts_per_step=28", "policy.train_global_batch_size=112"]),
    (8, 32, 16, 128, []),  # 256 responses in 2 updates of 8 x 16
])  # fmt: skip
def test_the_overrides_that_split_a_step_evenly_are_the_nearest(
    ranks: int, prompts: int, micro: int, batch: int | None, named: list[str]
) -> None:
    update = None if batch is None else ("policy.train_global_batch_size", batch)
    rollouts = Rollouts("policy.train_micro_batch_size", micro, "grpo.num_prompts_per_step", prompts, prompts * 8,
                        16, 0.6, update)  # fmt: skip
    assert even_batches(ranks, rollouts) == named


def test_the_judges_node_is_not_the_policys() -> None:
    """3 nodes with NeMo-Gym's GenRM on one: the policy trains on 2 x 8 = 16 ranks (32 x 8 = 256 responses in
    micro-batches of 16 pass); on 4 nodes it has 24, which 256 responses do not fill evenly."""
    gym = {k.replace(".", "__"): v for k, v in GYM.items()}
    assert _compile("rl/rlhf", 3, 8, **gym)["cluster"] == {"num_nodes": 2, "gpus_per_node": 8}
    assert "a multiple of 24 x policy.train_micro_batch_size 16 = 384" in _refused("rl/rlhf", 4, 8, **gym)


def test_a_profile_without_gpus_has_no_ranks_to_count() -> None:
    # a CPU Ray cluster: NeMo-RL's workers are CPU actors, nothing is sharded over GPUs
    assert _compile("rl/rlhf", 2, 0, grpo__num_prompts_per_step=7)["grpo"]["num_prompts_per_step"] == 7


def test_the_rule_is_the_tags() -> None:
    """Where v0.7.0 asserts it: train shards with the global batch (its default, train_global_batch_size) and
    shard_by_batch_size asserts an even split with no uneven shards; both training backends iterate whole
    micro-batches (`data.size // mbs`); the one-node reward model's GPUs come out of the policy's."""
    if not tag.MIRROR.exists():
        pytest.skip("the NeMo-RL mirror is not on this machine; the compile cases above ran")
    policy = git_show(tag.MIRROR, tag.TAG, "nemo_rl/models/policy/lm_policy.py")
    assert 'batch_size = gbs or self.cfg["train_global_batch_size"]' in policy
    assert "sharded_data = self._shard_for_train(data, batch_size)" in policy
    shard = git_show(tag.MIRROR, tag.TAG, "nemo_rl/distributed/batched_data_dict.py")
    assert "assert total_batch_size % batch_size == 0" in shard
    assert "if not allow_uneven_shards:\n            assert batch_size % shards == 0" in shard
    assert "iterator_len = data.size // mbs" in git_show(
        tag.MIRROR, tag.TAG, "nemo_rl/models/automodel/data.py"
    )
    assert "data_iterator_len = data.size // mbs" in git_show(
        tag.MIRROR, tag.TAG, "nemo_rl/models/megatron/data.py"
    )
    grpo = git_show(tag.MIRROR, tag.TAG, "nemo_rl/algorithms/grpo.py")
    assert 'policy_gpus_per_node = cluster_config["gpus_per_node"] - rm_gpus_per_node' in grpo
