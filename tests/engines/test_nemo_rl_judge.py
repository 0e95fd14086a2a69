"""rl/rlhf's generative judge on NeMo-RL (issue 43, "the judge planned where it runs"): NeMo-Gym's GenRM is its own
vLLM, placed by Ray on what NeMo-RL's cluster leaves. The compiled config keeps the judge's nodes out of the cluster
(env.nemo_gym.num_gpu_nodes, as NeMo-RL's own recipes do), and a profile too small for both is refused. Checked
against the tag's recipes and the Gym commit it pins (tests/engines/nemo_rl_v070.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from pydantic import BaseModel
from tests.engines import nemo_rl_v070 as tag
from tests.engines.mirrors import git_show
from tests.engines.test_nemo_rl_config import GYM, JOB, step_model

from nemotron.catalog import Catalog
from nemotron.config.configtree import flatten
from nemotron.engines.nemo_rl import sections
from nemotron.engines.nemo_rl.config import NemoRLRun, compile_run
from nemotron.engines.nemo_rl.preflight import preflight
from nemotron.errors import UserError
from nemotron.plan.placement import Placement

# a step every split below can train: 48 x 8 responses over 4, 8, 12, 16 or 24 data-parallel ranks in micro-batches
# of 8 (nemotron.engines.nemo_rl.batches)
EVEN = {"grpo.num_prompts_per_step": 48, "policy.train_micro_batch_size": 8}


def _gym_run(nodes: int, gpus: int) -> NemoRLRun:
    model = step_model("rl/rlhf", **{k.replace(".", "__"): v for k, v in (GYM | EVEN).items()})
    return compile_run("rl/rlhf", model, Placement(JOB, nodes, gpus))


# (profile nodes, GPUs per node) -> (cluster.num_nodes, env.nemo_gym.num_gpu_nodes), worked by hand: the judge's
# 2 ranks of 4 GPUs take one 8-GPU node, or one 4-GPU node each
SPLITS = {(2, 8): (1, 1), (4, 8): (3, 1), (3, 4): (1, 2), (5, 4): (3, 2), (2, 16): (1, 1)}


@pytest.mark.parametrize(("nodes", "gpus"), list(SPLITS))
def test_the_judges_nodes_are_kept_out_of_nemo_rls_cluster(nodes: int, gpus: int) -> None:
    cfg = _gym_run(nodes, gpus).config
    policy, judge = SPLITS[(nodes, gpus)]
    assert cfg["cluster"] == {"num_nodes": policy, "gpus_per_node": gpus}
    assert cfg["env"]["nemo_gym"]["num_gpu_nodes"] == judge
    # NeMo-RL's rule for a job's nodes: cluster.num_nodes + env.nemo_gym.num_gpu_nodes (test_recipes_... below)
    assert policy + judge == nodes


@pytest.mark.parametrize(("nodes", "gpus", "says"), [
    (1, 8, "use a profile of at least 2 nodes x 8 GPUs, or judge.kind=reward_model env.should_use_nemo_gym=false"),
    (2, 2, "use a profile whose nodes have at least 4 GPUs (e.g. 3 nodes x 4 GPUs"),
    (1, 1, "(e.g. 3 nodes x 4 GPUs: 2 for the judge, 1 for the policy), or backend=builtin"),
])  # fmt: skip
def test_a_profile_too_small_for_judge_and_policy_is_refused(nodes: int, gpus: int, says: str) -> None:
    with pytest.raises(UserError) as refused:
        _gym_run(nodes, gpus)
    (problem,) = refused.value.problems
    assert problem.startswith("env.should_use_nemo_gym=True: NeMo-Gym's GenRM judge (vLLM DP 2 x TP 4") and (
        says in problem
    ), problem
    # one GPU leaves a reward model none either: only the built-in engine is named
    assert ("judge.kind=reward_model" in problem) == (nodes * gpus > 1)


@pytest.mark.parametrize("batch", [{"policy.train_global_batch_size": 64}, {"grpo.num_prompts_per_step": 3}])
def test_a_profile_too_small_for_the_judge_is_not_also_refused_for_batches_over_a_split_it_cannot_make(
    batch: dict[str, int],
) -> None:
    """With no node left for the judge there is no policy share: the batch rule would check the step's batches
    over all 8 GPUs, which NeMo-RL never gives the policy, and add a refusal the job does not have. Refusals that do
    not depend on the split are still reported with it."""
    overrides = GYM | batch | {"grpo.std_floor": 0.1}
    model = step_model("rl/rlhf", **{k.replace(".", "__"): v for k, v in overrides.items()})
    with pytest.raises(UserError) as refused:
        compile_run("rl/rlhf", model, Placement(JOB, 1, 8))
    assert [p.split("=")[0] for p in refused.value.problems] == ["grpo.std_floor", "env.should_use_nemo_gym"]


# jobs whose GenRM does not fit, and what the reward model judge needs there besides, worked by hand (the async one
# needs nothing more)
FOLLOWED = [
    # the reward model's GPU leaves the policy 7 ranks: 32 x 8 responses in micro-batches of 16 need prompts of 14s
    (1, 8, {}),
    # 7 GPUs are no multiple of TP 2: 2 for the reward model leave 3 ranks
    (1, 8, {"nemo_rl.tensor_parallel_size": 2}),
    # 28 x 8 = 224 responses over 7 ranks do not split into updates of 64: 112 does
    (1, 8, {"policy.train_global_batch_size": 64}),
    # async: vLLM takes 3 of the 7 GPUs, training 4 ranks that 32 x 8 responses fill evenly
    (1, 8, {"grpo.async_grpo.enabled": True, "loss_fn.use_importance_sampling_correction": True}),
    # the reward model on a node of its own: 4 ranks of micro-batches of 16, 5 x 8 responses are not 64 x k
    (2, 4, {"grpo.num_prompts_per_step": 5}),
]


@pytest.mark.parametrize(("nodes", "gpus", "job"), FOLLOWED)
def test_the_reward_model_judge_the_shortfall_names_passes_as_named(
    nodes: int, gpus: int, job: dict[str, Any]
) -> None:
    """The refusal's `judge.kind=reward_model ...` remedy, followed to the letter: the engine compiles the job and
    its preflight (GPU groups, sizes) finds nothing."""
    with pytest.raises(UserError) as refused:
        compile_run("rl/rlhf", _model(GYM | job), Placement(JOB, nodes, gpus))
    found = re.search(r"judge\.kind=reward_model [^,]*", str(refused.value.problems[0]))
    assert found is not None, refused.value.problems
    remedy = {key: yaml.safe_load(value) for key, _, value in (o.partition("=") for o in found[0].split())}
    followed = _model(GYM | job | remedy)
    compile_run("rl/rlhf", followed, Placement(JOB, nodes, gpus))
    checks = preflight(Catalog().get("rl/rlhf").manifest, followed, [], nodes, gpus)
    assert checks.problems == [] and [p for g in checks.groups if (p := g.problem("followed"))] == []


def _model(overrides: dict[str, Any]) -> BaseModel:
    return step_model("rl/rlhf", **{k.replace(".", "__"): v for k, v in overrides.items()})


def test_a_profile_without_gpus_sets_nothing_aside() -> None:
    """A CPU Ray cluster (the local Slurm's fake driver): no GPU to reserve, the cluster is the profile's."""
    cfg = _gym_run(2, 0).config
    assert cfg["cluster"] == {"num_nodes": 2, "gpus_per_node": 0}
    assert "num_gpu_nodes" not in cfg["env"]["nemo_gym"]


def test_nemo_rls_recipes_add_the_gym_nodes_to_the_cluster() -> None:
    """The tag's recipes with a NeMo-Gym judge on nodes of its own: the nodes their names give are
    cluster.num_nodes + env.nemo_gym.num_gpu_nodes, and grpo.py reads num_gpu_nodes (nemo_rl_v070._GYM)."""
    if not tag.MIRROR.exists():
        pytest.skip("no NeMo-RL mirror on this machine")
    for recipe, nodes in tag.GYM_RECIPES.items():
        cfg = yaml.safe_load(git_show(tag.MIRROR, tag.TAG, recipe))
        assert cfg["cluster"]["num_nodes"] + cfg["env"]["nemo_gym"]["num_gpu_nodes"] == nodes, recipe
        assert f"-{nodes}n8g-" in recipe
    grpo = git_show(tag.MIRROR, tag.TAG, "nemo_rl/algorithms/grpo.py")
    # the policy's nodes are the cluster's less a reward model's: nothing subtracts the Gym's nodes
    assert (
        'total_nodes = cluster_config["num_nodes"]' in grpo
        and "policy_nodes = total_nodes - rm_nodes" in grpo
    )


def test_the_genrm_sizes_are_the_pinned_gyms() -> None:
    """sections.GENRM_* are genrm_compare.yaml's at the Gym commit the tag pins, whose first rank is placed as
    TP x PP GPUs packed on one node."""
    if not tag.MIRROR.exists():
        pytest.skip("no NeMo-RL mirror on this machine")
    import subprocess

    pinned = subprocess.run(["git", "-C", str(tag.MIRROR), "ls-tree", tag.TAG, tag.GYM_SUBMODULE],
                            capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    assert pinned[1:3] == ["commit", tag.GYM_COMMIT]
    ours = {
        "vllm_serve_kwargs.data_parallel_size": sections.GENRM_DP,
        "vllm_serve_kwargs.tensor_parallel_size": sections.GENRM_TP,
        "vllm_serve_kwargs.pipeline_parallel_size": sections.GENRM_PP,
        "vllm_serve_kwargs.gpu_memory_utilization": sections.GENRM_SHARE,
        "vllm_serve_env_vars.VLLM_RAY_DP_PACK_STRATEGY": "strict",
    }
    assert ours == tag.GENRM_SERVE
    if not tag.GYM_MIRROR.exists():
        pytest.skip("no NeMo-Gym mirror on this machine")
    genrm = yaml.safe_load(git_show(tag.GYM_MIRROR, tag.GYM_COMMIT, tag.GENRM_YAML))
    served = dict(flatten(genrm["genrm_model"]["responses_api_models"]["genrm_model"]))
    assert {k: served.get(k) for k in tag.GENRM_SERVE} == tag.GENRM_SERVE
    path, lines = tag.GENRM_PLACEMENT
    app = git_show(tag.GYM_MIRROR, tag.GYM_COMMIT, path)
    assert all(line in app for line in lines)
