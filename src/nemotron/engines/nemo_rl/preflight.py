"""NeMo-RL's preflight (nemotron.config.backends.PREFLIGHT_RULES): the GPU groups a job runs on, whose
model-parallel sizes the centre (nemotron.compile.preflight) divides into each group's GPUs, and the eval's own rule
on its prompts (nemotron.engines.nemo_rl.evaluation.preflight_problems)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from pydantic import BaseModel

from nemotron.compile.preflight import EngineChecks, Group, shape
from nemotron.config.stepconfig import NemoRL, NemoRLTraining
from nemotron.engines.nemo_rl.evaluation import RECIPE as EVAL
from nemotron.engines.nemo_rl.evaluation import preflight_problems
from nemotron.engines.nemo_rl.generation import GPUS_KEY, SeparateGeneration, policy_share, separate, trigger
from nemotron.engines.nemo_rl.sections import genrm_shortfall, genrm_split, nemo_gym, reward_model_gpus
from nemotron.engines.nemo_rl.steps import RECIPES
from nemotron.plan.groups import PlannedConfig

if TYPE_CHECKING:
    from nemotron.artifacts.binding import Binding
    from nemotron.catalog import Manifest

ENGINE = "nemo_rl"  # the manifest's `engines` key naming this engine's recipe for a step


class _EvalSizes(Protocol):
    """What the eval's group reads of a step's `nemo_rl` group (eval/policy's own, smaller than the RL steps')."""

    generation_tensor_parallel_size: int


@runtime_checkable
class _RunsEval(Protocol):
    @property
    def nemo_rl(self) -> _EvalSizes: ...


def preflight(
    manifest: Manifest, config: BaseModel, bindings: Sequence[Binding], nodes: int, gpus: int
) -> EngineChecks:
    """The eval's prompt rule, and the job's GPU groups on `nodes` x `gpus` (none on a profile without GPUs)."""
    groups = _groups(manifest, config, nodes, gpus) if gpus >= 1 else []
    problems = preflight_problems(manifest, config, bindings)
    nemo = getattr(config, "nemo_rl", None)
    if gpus >= 1 and nemo_gym(config) and isinstance(nemo, NemoRL) and genrm_split(nodes, gpus) is None:
        work = config.workload() if isinstance(config, PlannedConfig) else None
        problems.append(genrm_shortfall(nodes, gpus, nemo, separate(config), work))
    return EngineChecks(problems, groups)


def _groups(manifest: Manifest, config: BaseModel, nodes: int, gpus: int) -> list[Group]:
    """NeMo-RL v0.7.0's rule: the policy's (and the PPO value model's) Ray cluster must have a world size that is a
    multiple of PP * CP * TP (nemo_rl/models/policy/lm_policy.py:174-212 at v0.7.0; DTensor has no PP, :162), and
    vLLM's TP * PP must divide the same, colocated, cluster (nemo_rl/models/generation/vllm/vllm_generation.py:110).
    The policy cluster is what the reward model's workers leave: a one-node job gives them reward_model_gpus of
    its GPUs, a larger one a node of its own (nemo_rl/algorithms/grpo.py:520-590, ppo.py:380-415; our mapping:
    nemotron.engines.nemo_rl.sections.reward_model_resources); with NeMo-Gym's judge, what the judge's nodes leave
    (sections.genrm_split), and a profile too small for both is refused. Non-colocated (async GRPO,
    nemo_rl.generation_gpus), vLLM's own GPUs come out of the policy's (grpo.py:600-665, generation.split_generation)
    and each part's sizes divide its own. The reward model itself runs DTensor at TP 1 CP 1
    (nemo_rl.sections.reward_model_env)."""
    recipe = manifest.step.engines.get(ENGINE, "")
    if recipe == EVAL:  # NeMo-RL's eval: one vLLM engine per TP group over every GPU (eval.py setup)
        if not isinstance(config, _RunsEval):
            return []  # the engine refuses the step itself
        tp = config.nemo_rl.generation_tensor_parallel_size
        keys = "nemo_rl.generation_tensor_parallel_size"
        return [Group("generation (vLLM)", keys, tp, 1, 1, nodes * gpus, shape(nodes, gpus))]
    nemo = getattr(config, "nemo_rl", None)
    if recipe in RECIPES and isinstance(
        nemo, NemoRLTraining
    ):  # run_sft.py / run_rm.py: one model on every GPU
        megatron = nemo.policy_backend == "megatron"
        pp = nemo.pipeline_parallel_size if megatron else 1
        pp_key = "nemo_rl.pipeline_parallel_size, " if megatron else ""
        sizes = f"nemo_rl.tensor_parallel_size, {pp_key}nemo_rl.context_parallel_size"
        trained = next((m.role.replace("_", " ") for m in manifest.models if m.trained), "policy")
        tp, cp = nemo.tensor_parallel_size, nemo.context_parallel_size
        return [Group(trained, sizes, tp, pp, cp, nodes * gpus, shape(nodes, gpus))]
    # an RL recipe's Config has the RL steps' NemoRL group
    if recipe not in RECIPES or not isinstance(nemo, NemoRL):
        return []  # the engine refuses the step itself
    megatron = nemo.policy_backend == "megatron"
    tp, cp = nemo.tensor_parallel_size, nemo.context_parallel_size
    # DTensor takes no PP (lm_policy.py:162); dtensor with pipeline_parallel_size > 1 is refused by the engine
    pp = nemo.pipeline_parallel_size if megatron else 1
    groups: list[Group] = []
    cluster_nodes, rm_gpus, where = nodes, reward_model_gpus(config, nemo, nodes, gpus), shape(nodes, gpus)
    # the GenRM's nodes are outside the policy's cluster; none left when it does not fit (refused above)
    if rm_gpus is None:
        split = genrm_split(nodes, gpus)
        cluster_nodes = split[0] if split else 0
        where = f"{where} less the judge's {split[1] if split else nodes} node(s)"
    else:
        where = f"{where} less the reward model's {rm_gpus if nodes == 1 else 'node'}"
        rm_where = f"nemo_rl.reward_model_gpus of {shape(nodes, gpus)}"
        groups.append(Group("reward model", "DTensor, fixed", 1, 1, 1, rm_gpus, rm_where))
    share = policy_share(nemo, separate(config), trigger(config), cluster_nodes=cluster_nodes, gpus_per_node=gpus,
                         reward_model_gpus=rm_gpus)  # fmt: skip
    who = "policy and critic" if any(m.role == "critic" for m in manifest.models) else "policy"
    pp_key = "nemo_rl.pipeline_parallel_size, " if megatron else ""
    sizes = f"nemo_rl.tensor_parallel_size, {pp_key}nemo_rl.context_parallel_size"
    gen_tp = nemo.generation_tensor_parallel_size
    policy_gpus, gen_gpus, gen_where = share.gpus, share.gpus, where
    apart = share.generation  # a Shortfall the engine's compile refuses
    if policy_gpus >= 1 and isinstance(apart, SeparateGeneration):
        policy_gpus, gen_gpus = apart.train_gpus, apart.gpus
        gen_where = f"{GPUS_KEY} of {where}"
        where = f"{where} less vLLM's {apart.gpus}"
    return [
        Group(who, sizes, tp, pp, cp, policy_gpus, where),
        Group(
            "generation (vLLM)", "nemo_rl.generation_tensor_parallel_size", gen_tp, 1, 1, gen_gpus, gen_where
        ),
        *groups,
    ]
