"""NeMo-RL's plan and its compile agree on the policy's share of the cluster (generation.policy_share): the GPUs set
aside for the scorer follow what the compile sets aside, whether or not the plan can read the scorer's shape, and a
split the plan refuses names the key the compile names."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.plan.test_async_generation_plan import ASYNC, LLAMA_8B, RM_JUDGE, groups_of, job_on, nemo_rls_split

from nemotron.catalog import Catalog
from nemotron.compile import compile_job
from nemotron.engines.nemo_rl.config import compile_run
from nemotron.errors import UserError
from nemotron.plan.groups import plan_job
from nemotron.plan.placement import Placement

JUDGE = "env.nemo_gym.genrm_model.responses_api_models.vllm_model.model"
# a scorer whose shape the plan cannot read: no checkpoint here, not in the shape table, no plan.models hint
UNREADABLE = f"{JUDGE}=/lustre/elsewhere/scorer"
SMALL = '[h100_1x2]\nextends = "slurm_rlhf"\nnodes = 1\ngpus_per_node = 2\n'


@pytest.mark.parametrize(("profile", "overrides", "gpus", "where"), [
    ("h100_1x8", RM_JUDGE, 7, "node 0"),  # the reward model's GPU of the one node
    ("h100_3x8", RM_JUDGE, 16, "nodes 0-1"),  # the reward model's node
    ("h100_3x8", (*RM_JUDGE, *ASYNC), 8, "node 0"),  # then vLLM's node 1 of the 2 left
    ("slurm_rlhf", (), 8, "node 0"),  # NeMo-Gym's GenRM on node 1
])  # fmt: skip
def test_the_policy_is_planned_on_the_gpus_the_compile_gives_it_though_the_scorers_shape_is_unknown(
    profile: str, overrides: tuple[str, ...], gpus: int, where: str, home: Path, tmp_path: Path
) -> None:
    job = job_on(profile, *overrides, *LLAMA_8B, UNREADABLE, tmp_path=tmp_path)
    train_nodes, train_gpus, _, _ = nemo_rls_split(job)
    assert train_nodes * train_gpus == gpus
    training = groups_of(job)["policy training"]
    assert f"over {gpus} GPUs" in training["parallelism"] and training["nodes"] == where, training
    # the scorer's shape sizes its own group only
    assert not {"reward model", "judge (NeMo-Gym GenRM)"} & set(groups_of(job))


@pytest.mark.parametrize(("step", "overrides", "key"), [
    ("rl/rlhf", (*RM_JUDGE, *ASYNC), "grpo.async_grpo.enabled"),
    ("rl/reinforce", ("backend=nemo_rl", "reinforce.async_grpo.enabled=true",
                      "reinforce.use_importance_sampling_correction=true"), "reinforce.async_grpo.enabled"),
    ("rl/rlhf", (*RM_JUDGE, *ASYNC, "nemo_rl.generation_gpus=1"), "nemo_rl.generation_gpus"),
])  # fmt: skip
def test_a_split_the_plan_refuses_names_the_key_the_compile_names(
    step: str, overrides: tuple[str, ...], key: str, home: Path, tmp_path: Path
) -> None:
    """The policy's one GPU beside the reward model's cannot be split: the compile refuses it first on the CLI, and
    a plan re-planned on it (a remedy, nemotron.plan.groups.remedies_that_fit) names the same key, async's own when
    nemo_rl.generation_gpus is unset."""
    (tmp_path / "env.toml").write_text(SMALL)
    job = compile_job(Catalog(), step, "default", overrides=list(overrides), profile_name="h100_1x2", mode="batch",
                      dry_run=True)  # fmt: skip
    where = Placement("/j", 1, 2)
    with pytest.raises(UserError) as compiled:
        compile_run(step, job.config, where)
    with pytest.raises(UserError) as planned:
        plan_job(job, where)
    assert [p.split("=")[0] for p in compiled.value.problems] == [key]
    assert str(planned.value).startswith(f"{key}: ")
