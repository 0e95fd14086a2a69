"""Async GRPO and non-colocated generation on NeMo-RL v0.7.0: the compiled configs against what the tag reads and
asserts, and the GPU split against the tag's own setup arithmetic (re-written below from grpo.py, not from ours)."""

from __future__ import annotations

import ast
import itertools
from typing import Any

import pytest
from tests.engines import nemo_rl_v070 as tag
from tests.engines.mirrors import git_show
from tests.engines.nemo_rl_rules import has
from tests.engines.test_nemo_rl_config import GYM, JOB, compiled, loaded, step_model

from nemotron.engines.nemo_rl.config import compile_run
from nemotron.errors import UserError
from nemotron.plan.placement import Placement

ASYNC = {
    "rl/rlhf": {"grpo.async_grpo.enabled": True, "loss_fn.use_importance_sampling_correction": True},
    "rl/reinforce": {
        "reinforce.async_grpo.enabled": True,
        "reinforce.use_importance_sampling_correction": True,
    },
}
CASES = [("rl/rlhf", "reward_model"), ("rl/rlhf", "nemo_gym"), ("rl/reinforce", "reward_model")]


def nemo_rl_setup(cfg: dict[str, Any]) -> tuple[int, int, int, int]:
    """NeMo-RL v0.7.0's cluster split, grpo.py setup :454-665, as the tag computes it: (train nodes, train GPUs per
    node, inference nodes, inference GPUs per node); AssertionError wherever the tag asserts."""
    cluster, gen = cfg["cluster"], cfg["policy"]["generation"]
    total, per_node = cluster["num_nodes"], cluster["gpus_per_node"]
    rm_enabled = cfg["data"]["default"]["env_name"] == "reward_model"  # extract_necessary_env_names
    rm = cfg["env"]["reward_model"]["resources"] if rm_enabled else {"num_nodes": 0, "gpus_per_node": 0}
    policy_nodes = total if total == 1 else total - rm["num_nodes"]
    assert policy_nodes > 0
    if gen["colocated"]["enabled"]:
        gpus = per_node - rm["gpus_per_node"] if total == 1 else per_node
        assert gpus > 0
        return policy_nodes, gpus, policy_nodes, gpus
    inf_gpus, inf_nodes = (
        gen["colocated"]["resources"]["gpus_per_node"],
        gen["colocated"]["resources"]["num_nodes"],
    )
    train_gpus, train_nodes = per_node, policy_nodes
    if policy_nodes == 1:
        assert inf_gpus is not None and inf_gpus > 0
        assert inf_nodes is None or inf_nodes == 1
        inf_nodes = 1
        train_gpus -= inf_gpus + (rm["gpus_per_node"] if total == 1 and rm_enabled else 0)
        assert train_gpus > 0
    else:
        assert inf_nodes > 0
        assert inf_gpus is not None and inf_gpus == per_node
        train_nodes -= inf_nodes
    assert train_nodes > 0 and inf_nodes > 0
    return train_nodes, train_gpus, inf_nodes, inf_gpus


def _async(step: str, env: str, nodes: int | None = None, **extra: Any) -> dict[str, Any]:
    return compiled(step, env, nodes=nodes, overrides={**ASYNC[step], **extra}).config


@pytest.mark.parametrize(("step", "env"), CASES)
def test_async_config_has_what_the_tag_reads_and_asserts(step: str, env: str) -> None:
    in_flight = {f"{_group(step)}.async_grpo.in_flight_weight_updates": True}
    # the reward model's workers on the one node (training keeps 4 of its GPUs), the GenRM on a node of its own
    nodes = 1 if env == "reward_model" else None
    cfg = loaded(compiled(step, env, nodes=nodes, overrides={**ASYNC[step], **in_flight}))
    missing = [(k, f"{f}:{n}") for k, f, n in tag.REQUIRED[f"grpo+{env}+async"] if not has(cfg, k)]
    assert missing == []
    grpo, gen = cfg["grpo"], cfg["policy"]["generation"]
    assert set(grpo["async_grpo"]) <= tag.TYPED_DICTS[("nemo_rl/algorithms/grpo.py", "AsyncGRPOConfig")]
    assert (
        set(gen["colocated"])
        <= tag.TYPED_DICTS[("nemo_rl/models/generation/interfaces.py", "ColocationConfig")]
    )
    resources = tag.TYPED_DICTS[("nemo_rl/models/generation/interfaces.py", "OptionalResourcesConfig")]
    assert set(gen["colocated"]["resources"]) <= resources
    # async_grpo_train's asserts (grpo.py:3364, 3371, 3421) and run_grpo.py's refusals (:159-186)
    assert gen["backend"] == "vllm" and gen["vllm_cfg"]["async_engine"] is True
    assert cfg["loss_fn"]["use_importance_sampling_correction"] is True
    assert gen["colocated"]["enabled"] is False
    assert grpo["async_grpo"] == {"enabled": True, "max_trajectory_age_steps": 1, "in_flight_weight_updates": True,
                                  "recompute_kv_cache_after_weight_updates": False}  # fmt: skip
    assert grpo["use_dynamic_sampling"] is False and cfg["data"]["use_multiple_dataloader"] is False
    assert not grpo["reward_scaling"]["enabled"] and not grpo["reward_shaping"]["enabled"]
    # half of what the policy has: 4 of a node's 8 beside the GenRM's node, 3 of the 7 the reward model leaves
    assert nemo_rl_setup(cfg) == ((1, 4, 1, 4) if env == "nemo_gym" else (1, 4, 1, 3))


def test_sync_stays_colocated_unless_asked_and_truncation_reaches_the_loss() -> None:
    sync = compiled("rl/rlhf").config
    assert sync["policy"]["generation"]["colocated"] == {
        "enabled": True,
        "resources": {"gpus_per_node": None, "num_nodes": None},
    }
    assert sync["grpo"]["async_grpo"]["enabled"] is False
    assert sync["policy"]["generation"]["vllm_cfg"]["async_engine"] is False
    # vLLM apart without async: the synchronous loop, non-colocated (grpo_train refits over NCCL, grpo.py:1136)
    # one node: 8 GPUs less the reward model's 1 and vLLM's 2 leave training 5 (40 x 8 responses: 4 x 5 x 16)
    apart = compiled(
        "rl/rlhf", nodes=1, overrides={"nemo_rl.generation_gpus": 2, "grpo.num_prompts_per_step": 40}
    ).config
    assert apart["policy"]["generation"]["colocated"] == {
        "enabled": False,
        "resources": {"gpus_per_node": 2, "num_nodes": 1},
    }
    assert apart["grpo"]["async_grpo"] == {"enabled": False}
    assert nemo_rl_setup(apart) == (1, 5, 1, 2)  # 8 GPUs less the reward model's 1, less vLLM's 2
    tis = {"reinforce.truncated_importance_sampling_type": "icepop",
           "reinforce.truncated_importance_sampling_ratio": 5.0,
           "reinforce.truncated_importance_sampling_ratio_min": 0.5}  # fmt: skip
    loss = _async("rl/reinforce", "reward_model", **tis)["loss_fn"]
    assert loss["disable_ppo_ratio"] is True  # the IS weights still multiply -A·log π (loss_functions.py:612)
    assert (loss["truncated_importance_sampling_type"], loss["truncated_importance_sampling_ratio"],
            loss["truncated_importance_sampling_ratio_min"]) == ("icepop", 5.0, 0.5)  # fmt: skip


# (profile nodes, GPUs per node, step/env, nemo_rl.generation_gpus)
GRID = list(itertools.product((1, 2, 3), (2, 8), CASES, (None, 1, 4, 8, 12)))


# 1,680 responses a step in micro-batches of one: whatever the split leaves training (1 to 8, 12, 14, 16 or 24
# GPUs), the step's batch divides evenly over it (nemotron.engines.nemo_rl.batches), so only the split is tested
ANY_SPLIT = {
    "rl/rlhf": {"grpo.num_prompts_per_step": 210, "policy.train_micro_batch_size": 1},
    "rl/reinforce": {"trainer.num_prompts_per_step": 420, "trainer.micro_batch_size": 1},
}


def on(step: str, env: str, nodes: int, gpus: int, **overrides: Any) -> dict[str, Any]:
    """The compiled config on `nodes` x `gpus` (NeMo-Gym's judge on nodes of its own, as the engine compiles it)."""
    extra = {**GYM, "nemo_rl.policy_backend": "dtensor"} if env == "nemo_gym" else {}
    extra |= ANY_SPLIT[step]
    cfg = step_model(step, **{k.replace(".", "__"): v for k, v in (extra | overrides).items()})
    return compile_run(step, cfg, Placement(JOB, nodes, gpus)).config


def asked_in_nemo_rls_words(base: dict[str, Any], env: str, asked: int | None) -> dict[str, int]:
    """colocated.resources for what was asked (None: half the policy's share) as NeMo-RL's docs word it: GPUs of a
    one-node share, or whole nodes of a larger one (docs/guides/async-grpo.md, grpo_math_1B.yaml:363-364)."""
    nodes, gpus = base["cluster"]["num_nodes"], base["cluster"]["gpus_per_node"]
    rm = env == "reward_model"
    share = nodes - 1 if rm and nodes > 1 else nodes
    if share == 1:
        return {"gpus_per_node": asked or (gpus - (1 if rm and nodes == 1 else 0)) // 2, "num_nodes": 1}
    want = asked or share // 2 * gpus
    return {"gpus_per_node": gpus if want % gpus == 0 else want, "num_nodes": want // gpus}


def test_every_split_we_compile_passes_the_tags_setup_and_every_refused_one_fails_it() -> None:
    passed = refused = 0
    for nodes, gpus, (step, env), asked in GRID:
        try:
            base = on(step, env, nodes, gpus)
        except UserError:
            continue  # the synchronous job does not fit this profile either (reward model, GenRM)
        extra = {} if asked is None else {"nemo_rl.generation_gpus": asked}
        try:
            cfg = on(step, env, nodes, gpus, **ASYNC[step], **extra)
        except UserError as err:
            problems = [p.split("=")[0] for p in err.problems]
            assert problems in (["nemo_rl.generation_gpus"], [f"{_group(step)}.async_grpo.enabled"]), problems
            base["policy"]["generation"]["colocated"] = {
                "enabled": False,
                "resources": asked_in_nemo_rls_words(base, env, asked),
            }
            with pytest.raises(AssertionError):
                nemo_rl_setup(base)
            refused += 1
            continue
        train_nodes, train_gpus, inf_nodes, inf_gpus = nemo_rl_setup(cfg)
        assert inf_nodes * inf_gpus == (asked or inf_nodes * inf_gpus) and train_nodes * train_gpus >= 1
        passed += 1
    assert passed >= 15 and refused >= 15, (passed, refused)


def _group(step: str) -> str:
    return "grpo" if step == "rl/rlhf" else "reinforce"


@pytest.mark.parametrize(
    ("step", "overrides", "key"),
    [
        (
            "rl/rlhf",
            {"grpo.async_grpo.max_trajectory_age_steps": 0},
            "grpo.async_grpo.max_trajectory_age_steps",
        ),
        ("rl/rlhf", {"nemo_rl.generation_gpus": 3}, "nemo_rl.generation_gpus"),
    ],
)  # fmt: skip  (an async key set with async off is the schema's refusal, on every engine: tests/bad_inputs)
def test_what_the_tag_refuses_is_refused_at_compile_time(
    step: str, overrides: dict[str, Any], key: str
) -> None:
    with pytest.raises(UserError) as err:
        compiled(step, nodes=3, overrides={**ASYNC[step], **overrides})
    assert [p.split("=")[0] for p in err.value.problems] == [key]


def test_the_typed_dicts_are_the_tags() -> None:
    if not tag.MIRROR.exists():
        pytest.skip("no NeMo-RL mirror on this machine; the data-encoded tests above still ran")
    for (path, name), fields in tag.TYPED_DICTS.items():
        (cls,) = [n for n in ast.walk(ast.parse(git_show(tag.MIRROR, tag.TAG, path)))
                  if isinstance(n, ast.ClassDef) and n.name == name]  # fmt: skip
        found = {
            s.target.id for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
        }
        assert found == fields, (name, found)
