"""Where NeMo-RL v0.7.0's vLLM generates, and asynchronous GRPO, which needs it on GPUs of its own.

Colocated (NeMo-RL's default) vLLM and the policy's training take turns on the same GPUs. Non-colocated
(`policy.generation.colocated.enabled: false`) vLLM keeps GPUs of its own and gets the weights over NCCL after each
update; async GRPO requires it (grpo.py:3421, async_grpo_train). NeMo-RL's setup (grpo.py:600-665) carves those GPUs
out of the policy's share of the cluster: on a one-node share `colocated.resources.gpus_per_node` of that node's GPUs
(`num_nodes` 1), on several nodes whole nodes (`num_nodes`, with `gpus_per_node` equal to cluster.gpus_per_node),
and it asserts both parts keep at least one. `nemo_rl.generation_gpus` says how many; unset, half."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from nemotron.config.offpolicy import AsyncGRPO, ImportanceSampling, async_group, located_async_group
from nemotron.config.stepconfig import NemoRL

if TYPE_CHECKING:
    from nemotron.engines.refusals import Refusals

GPUS_KEY = "nemo_rl.generation_gpus"


def colocated() -> dict[str, Any]:
    """policy.generation.colocated of vLLM sharing the training GPUs (NeMo-RL's default)."""
    return {"enabled": True, "resources": {"gpus_per_node": None, "num_nodes": None}}


@dataclass(frozen=True)
class SeparateGeneration:
    """The policy's share of the cluster split as NeMo-RL splits it: training first, then vLLM's own GPUs."""

    train_nodes: int
    train_gpus_per_node: int
    nodes: int  # policy.generation.colocated.resources.num_nodes
    gpus_per_node: int  # policy.generation.colocated.resources.gpus_per_node
    same_node: bool  # a one-node share: training and vLLM on GPUs of the same node

    @property
    def train_gpus(self) -> int:
        return self.train_nodes * self.train_gpus_per_node

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def colocated(self) -> dict[str, Any]:
        """policy.generation.colocated as NeMo-RL reads it for dedicated generation resources."""
        return {"enabled": False, "resources": {"gpus_per_node": self.gpus_per_node, "num_nodes": self.nodes}}


@dataclass(frozen=True)
class Shortfall:
    """Why the policy's share cannot be split: the key to change and the one line saying so."""

    key: str
    why: str


def split_generation(
    policy_nodes: int, gpus_per_node: int, taken: int, requested: int | None, trigger: str
) -> SeparateGeneration | Shortfall:
    """Training and vLLM's own GPUs in the policy's share: `policy_nodes` nodes of `gpus_per_node` GPUs (NeMo-RL's
    policy_nodes: cluster.num_nodes less the reward model's node), of which a one-node cluster's reward model
    takes `taken`. `requested` is nemo_rl.generation_gpus (None: half the share, rounded down; `trigger` is the
    key that asked for separate generation, named when even that cannot be split)."""
    if gpus_per_node < 1:
        return Shortfall(trigger, "NeMo-RL's non-colocated generation needs GPUs of its own, and the profile has "
                                  "none (gpus_per_node = 0)")  # fmt: skip
    key = GPUS_KEY if requested is not None else trigger
    if policy_nodes == 1:  # grpo.py:613-643: resources.gpus_per_node of the one node, num_nodes 1
        share = gpus_per_node - taken
        gen = share // 2 if requested is None else requested
        rm = f" (the reward model takes {taken} of its {gpus_per_node})" if taken else ""
        if share < 2:
            return Shortfall(key, f"NeMo-RL splits the policy's GPUs on one node{rm} between training and vLLM, "
                                  f"which needs 2 at least and the policy has {share}: use a profile with more "
                                  "GPUs")  # fmt: skip
        if gen >= share:
            return Shortfall(key, f"NeMo-RL splits the policy's {share} GPUs on one node{rm} between training "
                                  f"and vLLM, and {gen} for vLLM leaves training none: set {GPUS_KEY} to at most "
                                  f"{share - 1}")  # fmt: skip
        return SeparateGeneration(1, share - gen, 1, gen, same_node=True)
    # grpo.py:644-665: whole nodes of cluster.gpus_per_node GPUs each
    nodes = policy_nodes // 2 if requested is None else requested // gpus_per_node
    if requested is not None and requested % gpus_per_node:
        return Shortfall(key, f"on a policy share of {policy_nodes} nodes NeMo-RL gives vLLM whole nodes "
                              f"(resources.gpus_per_node = cluster.gpus_per_node, grpo.py:655): a multiple of "
                              f"{gpus_per_node}")  # fmt: skip
    if nodes < 1 or nodes >= policy_nodes:
        return Shortfall(key, f"{nodes} of the policy's {policy_nodes} nodes for vLLM leaves training "
                              f"{'all' if nodes < 1 else 'none'}: set {GPUS_KEY} to a multiple of {gpus_per_node} "
                              f"up to {(policy_nodes - 1) * gpus_per_node}")  # fmt: skip
    return SeparateGeneration(policy_nodes - nodes, gpus_per_node, nodes, gpus_per_node, same_node=False)


def policy_nodes(cluster_nodes: int, reward_model: bool) -> int:
    """NeMo-RL's policy_nodes (grpo.py:532-539): a several-node cluster less the reward model's node."""
    return cluster_nodes - 1 if reward_model and cluster_nodes > 1 else cluster_nodes


def separate(config: BaseModel) -> bool:
    """Whether NeMo-RL generates on GPUs of its own: asked for (nemo_rl.generation_gpus), or needed (async)."""
    nemo, asynchronous = getattr(config, "nemo_rl", None), async_group(config)
    asked = isinstance(nemo, NemoRL) and nemo.generation_gpus is not None
    return asked or (asynchronous is not None and asynchronous.enabled)


def trigger(config: BaseModel) -> str:
    """The key a refused split names when nemo_rl.generation_gpus is unset (`split_generation`): what asked for
    vLLM's own GPUs, the `enabled` of the step's async group; the compile, the plan and the preflight name it."""
    found = located_async_group(config)
    return GPUS_KEY if found is None else f"{found[0]}.enabled"


def async_grpo(group: AsyncGRPO, prefix: str, refuse: Refusals) -> dict[str, Any]:
    """grpo.async_grpo: ours key by key (`prefix` is our group's dotted path). Off, it is `enabled: false` alone and
    our other keys, which would do nothing, are refused; on, v0.7.0's replay buffer holds num_prompts_per_step x max_trajectory_age_steps x 2 groups and
    refuses a size of 0 (async_utils/replay_buffer.py:33), so an age of 0 is refused too."""
    if not group.enabled:  # the base's other keys stay, unread (grpo_math_1B.yaml:48-53)
        refuse.all_unless_default(
            (f"{prefix}.max_trajectory_age_steps", f"acts only with {prefix}.enabled=true"),
            (f"{prefix}.in_flight_weight_updates", f"acts only with {prefix}.enabled=true"),
        )
        return {"enabled": False}
    if group.max_trajectory_age_steps == 0:
        refuse(f"{prefix}.max_trajectory_age_steps", "NeMo-RL's async replay buffer is sized num_prompts_per_step "
                                                     "x this x 2 and refuses 0: use 1 or more, or "
                                                     f"{prefix}.enabled=false for the synchronous run")  # fmt: skip
    return {
        "enabled": group.enabled,
        "max_trajectory_age_steps": group.max_trajectory_age_steps,
        "in_flight_weight_updates": group.in_flight_weight_updates,
        "recompute_kv_cache_after_weight_updates": False,  # the Megatron generation backend's; we generate on vLLM
    }


def importance_sampling(correction: ImportanceSampling) -> dict[str, Any]:
    """loss_fn's off-policy correction keys, NeMo-RL's names and meaning (ClippedPGLossConfig); the schema
    already refuses what ClippedPGLossFn.__init__ asserts (loss_functions.py:276-307)."""
    return {
        "use_importance_sampling_correction": correction.use_importance_sampling_correction,
        "truncated_importance_sampling_type": correction.truncated_importance_sampling_type,
        "truncated_importance_sampling_ratio": correction.truncated_importance_sampling_ratio,
        "truncated_importance_sampling_ratio_min": correction.truncated_importance_sampling_ratio_min,
    }


@dataclass(frozen=True)
class PolicyShare:
    """NeMo-RL's policy share of its cluster (grpo.py:520-665): the cluster less the reward model's workers (a node of
    its own on several nodes, `taken` GPUs of a single one), and vLLM's own GPUs out of it when it generates apart."""

    nodes: int  # NeMo-RL's policy_nodes
    gpus_per_node: int
    taken: int  # the reward model's GPUs of a one-node cluster
    reward_model_node: bool  # the reward model on a node of its own, the cluster's last
    generation: SeparateGeneration | Shortfall | None  # None: colocated

    @property
    def gpus(self) -> int:
        """Training's and vLLM's GPUs together."""
        return self.nodes * self.gpus_per_node - self.taken

    @property
    def train_gpus(self) -> int:
        """The GPUs the policy trains on; 0 when the split is refused."""
        if self.generation is None:
            return self.gpus
        return self.generation.train_gpus if isinstance(self.generation, SeparateGeneration) else 0


def policy_share(
    nemo: NemoRL, apart: bool, trigger: str, *, cluster_nodes: int, gpus_per_node: int,
    reward_model_gpus: int | None,
) -> PolicyShare:  # fmt: skip
    """The share of `cluster_nodes` (NeMo-RL's cluster.num_nodes) x `gpus_per_node` the policy has once the reward
    model's workers (`reward_model_gpus`, None without them) are set aside as NeMo-RL sets them aside; `apart`:
    vLLM generates on GPUs of its own (`separate`), split off as `split_generation` says (`trigger` as there)."""
    reward_model = reward_model_gpus is not None
    taken = (reward_model_gpus or 0) if cluster_nodes == 1 else 0
    nodes = policy_nodes(cluster_nodes, reward_model)
    generation = (
        split_generation(nodes, gpus_per_node, taken, nemo.generation_gpus, trigger) if apart else None
    )
    return PolicyShare(nodes, gpus_per_node, taken, reward_model and cluster_nodes > 1, generation)


def placement(share: PolicyShare, refuse: Refusals) -> dict[str, Any]:
    """policy.generation.colocated: shared GPUs unless vLLM generates apart; then the share's split, refused where
    NeMo-RL would assert on it."""
    split = share.generation
    if isinstance(split, Shortfall):
        refuse(split.key, split.why)
        return colocated()
    return colocated() if split is None else split.colocated()
