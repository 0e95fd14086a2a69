"""NeMo-Aligner's resource plan: the hetjob's actor, critic and reward-model servers, Megatron with NeMo-Aligner's
TP = PP = 1."""

from __future__ import annotations

from nemotron.config.workload import Rollouts, Serving, Training, Workload
from nemotron.plan.groups import ASSUMED_PROMPT_TOKENS, SCALAR_HEAD_ROLES, PlanContext, PlannedConfig, suggest
from nemotron.plan.terms import (
    Group,
    Sharding,
    activations_mb,
    frozen_weights_mb,
    train_state_mb,
)


def plan_groups(ctx: PlanContext, _config: PlannedConfig, r: Workload) -> list[Group]:
    groups: list[Group] = []
    if isinstance(r, Serving):
        m = ctx.models[0]
        shape = ctx.shape(m.role, m.ref)
        if shape:
            terms = {"weights": frozen_weights_mb(shape.parameters, "bf16", Sharding("megatron"))}
            groups.append(ctx.group(f"{m.role.replace('_', ' ')} (server)", terms, [(shape, m.role)],
                                    "Megatron TP 1 x PP 1", peak=sum(terms.values()) + ctx.runtime_mb))  # fmt: skip
        return groups
    if isinstance(r, Training):  # train_gpt_sft.py / train_reward_model.py: one trainer over every GPU
        m = ctx.trained()
        shape = ctx.shape(m.role, m.ref)
        if shape is None:
            return groups
        world = ctx.nodes * ctx.per_node
        sharding = Sharding("megatron", 1, world)
        terms = {**train_state_mb(shape.parameters, "bf16-mixed", sharding),
                 **activations_mb(shape, r.rows_per_record * (r.micro_batch or 1), r.max_length, "bf16", ctx.checkpointing,
                                 sharding)}  # fmt: skip
        if m.role in SCALAR_HEAD_ROLES:
            terms["logits"] = 0.0  # a scalar head, no vocabulary
        par = f"Megatron TP 1 x PP 1 (the .nemo's), distributed optimizer over {world} GPUs"
        groups.append(ctx.group(f"{m.role.replace('_', ' ')} training", terms, [(shape, m.role)], par,
                                suggestions=["more nodes (the profile's nodes)"]))  # fmt: skip
        return groups
    if not isinstance(r, Rollouts):
        return (
            groups  # NeMo-Aligner runs the RL steps and the reward server here; the engine refuses any other
        )
    mb_key, mb, max_new = r.micro_batch_key, r.micro_batch, r.max_new_tokens
    trained, scorer = ctx.trained(), ctx.scorer()
    policy = ctx.shape(trained.role, trained.ref)
    rm = ctx.shape(scorer.role, scorer.ref) if scorer is not None else None
    critic = ctx.critic_shape(scorer, rm)
    world = ctx.nodes * ctx.per_node
    sharding = Sharding("megatron", 1, world)
    seq = ASSUMED_PROMPT_TOKENS + max_new
    par = f"Megatron TP 1 x PP 1 (the .nemo's), distributed optimizer over {world} GPUs"
    if policy is not None:
        terms = {**train_state_mb(policy.parameters, "bf16-mixed", sharding),
                 **activations_mb(policy, mb, seq, "bf16", ctx.checkpointing, sharding),
                 "reference policy": frozen_weights_mb(policy.parameters, "bf16", sharding)}  # fmt: skip
        groups.append(ctx.group("policy training (actor)", terms, [(policy, "policy"), (policy, "reference")], par,
                                suggestions=suggest(ctx, mb_key, mb, "more nodes (the profile's nodes)")))  # fmt: skip
    if critic is not None:
        terms = {**train_state_mb(critic.parameters, "bf16-mixed", Sharding("megatron", 1, ctx.per_node)),
                 **activations_mb(critic, mb, seq, "bf16", ctx.checkpointing)}  # fmt: skip
        terms["logits"] = 0.0
        groups.append(ctx.group("critic (server)", terms, [(critic, "critic")], "Megatron TP 1 x PP 1, one node",
                                where="a node of its own"))  # fmt: skip
    if rm is not None:
        terms = {"weights": frozen_weights_mb(rm.parameters, "bf16", Sharding("megatron"))}
        groups.append(ctx.group("reward model (server)", terms, [(rm, "reward_model")], "Megatron TP 1 x PP 1",
                                peak=sum(terms.values()) + ctx.runtime_mb, where="a node of its own"))  # fmt: skip
    return groups
