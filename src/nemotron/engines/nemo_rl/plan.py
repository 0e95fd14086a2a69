"""NeMo-RL's resource plan: DTensor (FSDP over every training GPU, TP, CP) or Megatron (TP x PP, distributed
optimizer), with vLLM colocated: generation and training take turns (vLLM sleeps while the policy trains, the
policy's optimizer leaves the GPU while vLLM generates), the reference policy and the critic are swapped in for their
passes. Non-colocated (async GRPO, nemo_rl.generation_gpus) vLLM has GPUs of its own, and each part is sized on its
own GPUs: training's state sharded over fewer, vLLM's weights and KV cache with nothing of the trainer's."""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol, runtime_checkable

from pydantic import BaseModel

from nemotron.config.offpolicy import async_group
from nemotron.config.stepconfig import NemoRL, NemoRLTraining
from nemotron.config.workload import Rollouts, Training, Workload
from nemotron.engines.nemo_rl import generation as gen
from nemotron.engines.nemo_rl import sections as sec
from nemotron.errors import UserError
from nemotron.plan.groups import SCALAR_HEAD_ROLES, PlanContext, PlannedConfig, inference_mb, suggest
from nemotron.plan.shapes import ModelShape
from nemotron.plan.terms import (
    Group,
    Sharding,
    activations_mb,
    frozen_weights_mb,
    kv_cache_mb,
    train_state_mb,
)

# vLLM's share of a GPU it has to itself (NeMo-RL's async recipes run 0.8, NeMo-Gym's GenRM 0.9)
HIGH_SHARE = 0.9


@runtime_checkable
class NemoRLConfig(PlannedConfig, Protocol):
    """A step Config NeMo-RL runs: its `nemo_rl` group sizes the plan's groups."""

    @property
    def nemo_rl(self) -> NemoRL | NemoRLTraining: ...


def plan_groups(ctx: PlanContext, planned: PlannedConfig, r: Workload) -> list[Group]:
    if not isinstance(planned, NemoRLConfig):
        return []  # NeMo-RL runs steps whose Configs have its group; the engine refuses any other
    nemo = planned.nemo_rl
    if isinstance(r, Training):
        return _training(ctx, nemo, r)
    if not isinstance(r, Rollouts) or not isinstance(nemo, NemoRL):
        return []
    tp, pp, cp = nemo.tensor_parallel_size, nemo.pipeline_parallel_size, nemo.context_parallel_size
    megatron = nemo.policy_backend == "megatron"
    mb_key, mb, max_new = r.micro_batch_key, r.micro_batch, r.max_new_tokens
    _, _, policy, rm, critic = ctx.rl_models()
    total = ctx.nodes * ctx.per_node
    # what the compile sets aside for the scorer, known or not its shape (which only its own group needs)
    gym, rm_gpus = sec.nemo_gym(planned), sec.reward_model_gpus(planned, nemo, ctx.nodes, ctx.per_node)
    cluster_nodes = ctx.nodes
    # NeMo-Gym's GenRM on nodes of its own (sections.genrm_split), as the compiled cluster leaves them where the
    # profile has GPUs (the compile sets none aside on a CPU Ray cluster)
    gpus_per_node = int(getattr(ctx.job.profile, "gpus_per_node", 0) or 0)
    genrm = gym and gpus_per_node >= 1
    apart = isinstance(planned, BaseModel) and gen.separate(planned)
    if genrm:
        split = sec.genrm_split(ctx.nodes, ctx.per_node)
        if split is None:
            raise UserError(sec.genrm_shortfall(ctx.nodes, ctx.per_node, nemo, apart, r))
        cluster_nodes = split[0]
    # the compile's split of the cluster, refused as the compile refuses it
    trigger = gen.trigger(planned) if isinstance(planned, BaseModel) else gen.GPUS_KEY
    share = gen.policy_share(nemo, apart, trigger, cluster_nodes=cluster_nodes, gpus_per_node=ctx.per_node,
                             reward_model_gpus=rm_gpus)  # fmt: skip
    # the engine's compile refuses these first; a remedy re-planned on it (groups.py) lands here
    if share.gpus < 1:
        raise UserError(f"NeMo-RL's policy has no GPU left: the reward model takes {rm_gpus} of {total}")
    if isinstance(share.generation, gen.Shortfall):
        raise UserError(f"{share.generation.key}: {share.generation.why}")
    world, where, separate = share.train_gpus, ctx.where(0, share.nodes), share.generation
    if separate is not None:  # vLLM on GPUs of its own: training keeps the rest (generation.split_generation)
        where = _where_split(ctx, 0, separate.train_nodes, separate.train_gpus, separate.same_node)
    sharding, par = _sharding(megatron, world, tp, pp, cp)
    p = "bf16-mixed" if ctx.precision != "fp32" else "fp32"
    seq = nemo.max_prompt_tokens + max_new
    groups: list[Group] = []
    more = [
        f"more GPUs (the profile's nodes, now {ctx.nodes})",
        f"nemo_rl.tensor_parallel_size={tp * 2} (now {tp})",
    ]
    if megatron:
        more.append(f"nemo_rl.pipeline_parallel_size={pp * 2} (now {pp})")
    if policy is not None:
        state = train_state_mb(policy.parameters, p, sharding)
        if not megatron:
            state["bf16 weight copies"] = _gathered_layers_mb(
                policy
            )  # FSDP all-gathers a layer or two at a time
        terms = {**state, **activations_mb(policy, mb, seq, "bf16", ctx.checkpointing, sharding)}
        fewer = _fewer(separate, ctx.per_node) if separate is not None else None
        if separate is not None and fewer is not None:  # more of the share to training
            more.insert(1, f"{gen.GPUS_KEY}={fewer} (now {separate.gpus})")
        groups.append(ctx.group("policy training", terms, [(policy, "policy")], par, where=where,
                                suggestions=suggest(ctx, mb_key, mb, *more)))  # fmt: skip
        ref = {
            "weights": state["weights"],
            "logits": activations_mb(policy, mb, seq, "bf16", False, sharding)["logits"],
        }
        groups.append(ctx.group("reference policy", ref, [(policy, "reference")], par + "; swapped in for its logprobs",
                                peak=sum(ref.values()) + ctx.runtime_mb, where=where))  # fmt: skip
        util, gen_tp = nemo.gpu_memory_utilization, nemo.generation_tensor_parallel_size
        if separate is not None:
            groups.append(_separate_vllm(ctx, planned, nemo, policy, seq, separate))
        elif ctx.memory:
            vllm = {
                "vLLM share (weights + KV cache)": util * ctx.memory,
                "policy weights (resident)": state["weights"],
            }
            weights = policy.parameters * 2 / gen_tp / 2**20
            kv_one = kv_cache_mb(policy, 1, seq, "bf16", gen_tp)
            notes = [f"vLLM at {util:.0%}: bf16 weights {weights / 1024:.1f} GiB per GPU (TP {gen_tp}), "
                     f"{(util * ctx.memory - weights) / 1024:.1f} GiB left for KV cache, "
                     f"{kv_one / 1024:.2f} GiB per {seq}-token sequence; colocated: vLLM sleeps while the policy "
                     "trains, the policy's optimizer leaves the GPU while vLLM generates"]  # fmt: skip
            peak = sum(vllm.values()) + ctx.runtime_mb
            if weights + kv_one > util * ctx.memory:
                peak = max(
                    peak, (ctx.memory or 0) + weights + kv_one
                )  # vLLM cannot start: no room for one sequence
                notes.append("vLLM's share cannot hold its weights and one sequence's KV cache")
            groups.append(ctx.group("vLLM generation", vllm, [(policy, "generation")], f"vLLM TP {gen_tp}, colocated",
                                    peak=peak, where=where, notes=notes,
                                    suggestions=[f"nemo_rl.gpu_memory_utilization (now {util:g})",
                                                 f"nemo_rl.generation_tensor_parallel_size={gen_tp * 2} (now {gen_tp})"]))  # fmt: skip
    if critic is not None:
        state = train_state_mb(critic.parameters, p, sharding)
        if not megatron:
            state["bf16 weight copies"] = _gathered_layers_mb(critic)
        terms = {**state, **activations_mb(critic, mb, seq, "bf16", ctx.checkpointing, sharding)}
        terms["logits"] = 0.0  # a value head
        groups.append(ctx.group("critic", terms, [(critic, "critic")], par + "; swapped in for its passes", where=where,
                                suggestions=suggest(ctx, mb_key, mb, *more)))  # fmt: skip
    if rm is not None and gym:
        groups.append(_genrm(ctx, rm, share.nodes) if genrm else _genrm_without_gpu(ctx, rm))
    if rm is not None and rm_gpus is not None:
        rm_sh = Sharding("fsdp", rm_gpus, rm_gpus)
        terms = {
            "weights": frozen_weights_mb(rm.parameters, "bf16", rm_sh),
            **inference_mb(rm, mb, seq, "bf16"),
        }
        rm_where = ctx.where(ctx.nodes - 1, 1) if share.reward_model_node else ctx.where(0, 1)
        groups.append(ctx.group("reward model", terms, [(rm, "reward_model")], f"FSDP over {rm_gpus} GPUs",
                                peak=sum(terms.values()) + ctx.runtime_mb, where=rm_where))  # fmt: skip
    return groups


def _training(ctx: PlanContext, nemo: NemoRL | NemoRLTraining, t: Training) -> list[Group]:
    """run_sft.py / run_rm.py / run_dpo.py: one model trained on every GPU of the job (DTensor FSDP, or Megatron
    with its distributed optimizer), `t.micro_batch` records per micro-batch (the sft/rm bases'
    train_micro_batch_size 1; a preference pair is its two rows). DPO's reference waits in host memory and is
    swapped in for its log-probabilities, whose logits are the training pass's."""
    m = ctx.trained()
    shape = ctx.shape(m.role, m.ref)
    if shape is None:
        return []
    tp, pp, cp = nemo.tensor_parallel_size, nemo.pipeline_parallel_size, nemo.context_parallel_size
    megatron = nemo.policy_backend == "megatron"
    world = ctx.nodes * ctx.per_node
    sharding, par = _sharding(megatron, world, tp, pp, cp)
    p = "bf16-mixed" if ctx.precision != "fp32" else "fp32"
    state = train_state_mb(shape.parameters, p, sharding)
    if not megatron:
        state["bf16 weight copies"] = _gathered_layers_mb(shape)
    terms = {
        **state,
        **activations_mb(
            shape, t.rows_per_record * (t.micro_batch or 1), t.max_length, "bf16", ctx.checkpointing, sharding
        ),
    }
    if m.role in SCALAR_HEAD_ROLES:
        terms["logits"] = 0.0  # a scalar head, no vocabulary
    more = [
        f"more GPUs (the profile's nodes, now {ctx.nodes})",
        f"nemo_rl.tensor_parallel_size={tp * 2} (now {tp})",
    ]
    if megatron:
        more.append(f"nemo_rl.pipeline_parallel_size={pp * 2} (now {pp})")
    name = f"{m.role.replace('_', ' ')} training"
    return [ctx.group(name, terms, [(shape, m.role)], par, where=ctx.where(0, ctx.nodes),
                      suggestions=suggest(ctx, t.batch_key, 1, *more))]  # fmt: skip


def _genrm(ctx: PlanContext, judge: ModelShape, first: int) -> Group:
    """The generative judge where NeMo-RL runs it: NeMo-Gym's own vLLM (sections.GENRM_*) on the nodes from `first`
    on, which the compiled config keeps out of NeMo-RL's cluster (env.nemo_gym.num_gpu_nodes). Each GPU holds its
    vLLM share; bf16 weights larger than the share leave no room to start."""
    tp = sec.GENRM_TP * sec.GENRM_PP
    weights = judge.parameters * 2 / tp / 2**20
    memory = ctx.memory or 0.0
    terms = (
        {"vLLM share (weights + KV cache)": sec.GENRM_SHARE * memory} if ctx.memory else {"weights": weights}
    )
    peak = sum(terms.values()) + ctx.runtime_mb
    notes = [f"bf16 weights {weights / 1024:.2f} GiB per GPU; NeMo-Gym places {sec.GENRM_DP} x {tp} GPUs "
             "(genrm_compare.yaml at the Gym commit NeMo-RL v0.7.0 pins) on nodes outside NeMo-RL's cluster"]  # fmt: skip
    if ctx.memory and weights > sec.GENRM_SHARE * memory:
        terms[f"judge weights (bf16 over TP {tp})"] = weights  # more than vLLM's share: it cannot load them
        peak = max(peak, memory + weights)
        notes.append("vLLM's share cannot hold the judge's weights")
    nodes = ctx.nodes - first
    return ctx.group(
        "judge (NeMo-Gym GenRM)", terms, [(judge, "judge")],
        f"vLLM DP {sec.GENRM_DP} x TP {sec.GENRM_TP} x PP {sec.GENRM_PP} at {sec.GENRM_SHARE:.0%}, "
        f"{nodes} node{'s' * (nodes != 1)} of its own",
        peak=peak, where=ctx.where(first, nodes), notes=notes,
        suggestions=["a smaller judge model (NeMo-Gym's GenRM shards it over TP 4 only)"],
    )  # fmt: skip


def _genrm_without_gpu(ctx: PlanContext, judge: ModelShape) -> Group:
    """The GenRM on a profile without GPUs (a CPU Ray cluster): NeMo-Gym's vLLM has none to start on, a warning."""
    gpus = sec.GENRM_DP * sec.GENRM_TP * sec.GENRM_PP
    weights = judge.parameters * 2 / (sec.GENRM_TP * sec.GENRM_PP) / 2**20
    group = ctx.group(
        "judge (NeMo-Gym GenRM)", {"weights": weights}, [(judge, "judge")],
        f"vLLM DP {sec.GENRM_DP} x TP {sec.GENRM_TP} x PP {sec.GENRM_PP}", peak=weights + ctx.runtime_mb,
        where="no GPU", suggestions=["backend=builtin env.should_use_nemo_gym=false (the judge is served beside "
                                     "the trainer)"],
        shortfall=f"NeMo-Gym's GenRM vLLM needs {gpus} GPUs and the profile gives none (gpus_per_node = 0)",
    )  # fmt: skip
    return replace(group, enforced=False)


def _where_split(ctx: PlanContext, first: int, nodes: int, gpus: int, same_node: bool) -> str:
    """Where one part of a split share runs: its nodes, or its GPUs of the one node both parts share."""
    return f"{ctx.where(first, 1)}, {gpus} GPU{'s' * (gpus != 1)}" if same_node else ctx.where(first, nodes)


def _fewer(split: gen.SeparateGeneration, per_node: int) -> int | None:
    """A generation_gpus that leaves training more of the share: half vLLM's GPUs on one node, a node less on
    several; None when vLLM has no fewer to give."""
    if split.same_node:
        return split.gpus // 2 or None
    return (split.nodes - 1) * per_node or None


def _separate_vllm(
    ctx: PlanContext, planned: PlannedConfig, nemo: NemoRL, policy: ModelShape, seq: int,
    split: gen.SeparateGeneration,
) -> Group:  # fmt: skip
    """vLLM on GPUs of its own: its bf16 weights over TP and, in the rest of its share, the KV cache; nothing of
    the trainer's. It cannot start when the share holds less than its weights and one sequence's KV cache."""
    util, tp = nemo.gpu_memory_utilization, nemo.generation_tensor_parallel_size
    where = _where_split(ctx, split.train_nodes if not split.same_node else 0, split.nodes, split.gpus,
                         split.same_node)  # fmt: skip
    weights = policy.parameters * 2 / tp / 2**20
    kv_one = kv_cache_mb(policy, 1, seq, "bf16", tp)
    asynchronous = async_group(planned) if isinstance(planned, BaseModel) else None
    lag = (f"; async GRPO: trained samples at most {asynchronous.max_trajectory_age_steps} update(s) old"
           if asynchronous is not None and asynchronous.enabled else "")  # fmt: skip
    notes = [f"non-colocated: {split.gpus} GPU{'s' * (split.gpus != 1)} of its own "
             f"(policy.generation.colocated.resources: {split.nodes} node(s) x {split.gpus_per_node}), the policy's "
             f"weights over NCCL after every update{lag}"]  # fmt: skip
    terms: dict[str, float] = {"vLLM weights (bf16)": weights}
    peak = weights + kv_one + ctx.runtime_mb
    if ctx.memory:
        share = util * ctx.memory
        terms["KV cache (the rest of vLLM's share)"] = max(share - weights, 0.0)
        peak = share + ctx.runtime_mb
        notes.append(f"vLLM at {util:.0%}: bf16 weights {weights / 1024:.1f} GiB per GPU (TP {tp}), "
                     f"{max(share - weights, 0.0) / 1024:.1f} GiB left for KV cache, {kv_one / 1024:.2f} GiB per "
                     f"{seq}-token sequence")  # fmt: skip
        if weights + kv_one > share:
            peak = max(peak, ctx.memory + weights + kv_one)  # vLLM cannot start: no room for one sequence
            notes.append("vLLM's share cannot hold its weights and one sequence's KV cache")
    suggestions = [f"nemo_rl.generation_tensor_parallel_size={tp * 2} (now {tp})"]
    if util < HIGH_SHARE:  # vLLM is alone on its GPUs: it may take most of them
        suggestions.insert(0, f"nemo_rl.gpu_memory_utilization={HIGH_SHARE:g} (now {util:g})")
    return ctx.group("vLLM generation", terms, [(policy, "generation")], f"vLLM TP {tp}, non-colocated",
                     peak=peak, where=where, notes=notes, suggestions=suggestions)  # fmt: skip


def _gathered_layers_mb(shape: ModelShape) -> float:
    per_layer = (shape.parameters - shape.vocab * shape.hidden * (1 if shape.tied else 2)) / shape.layers
    return 2 * per_layer * 2 / 2**20  # the layer computing and the one prefetched, in bf16


def _sharding(megatron: bool, world: int, tp: int, pp: int, cp: int) -> tuple[Sharding, str]:
    """How NeMo-RL's policy backend splits the training state over `world` GPUs, and the plan's words for it."""
    if megatron:
        return (
            Sharding("megatron", tp * pp, world, tp, cp, pp),
            f"Megatron TP {tp} x PP {pp} x CP {cp}, distributed optimizer over {world} GPUs",
        )
    return Sharding("fsdp", world, world, tp, cp), f"DTensor FSDP over {world} GPUs, TP {tp}, CP {cp}"
