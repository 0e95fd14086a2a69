"""The built-in engine's resource plan: one trainer process per device (DDP: every device holds the whole model,
its gradients and optimizer state), the reference policy, a critic and an in-process reward model beside it, rollouts
by our KV-cache sampler or a colocated vLLM that keeps its memory share the whole run; a served reward model on its
own node (Slurm) or beside the trainer (local). An engine without plan groups of its own is planned this way."""

from __future__ import annotations

from typing import Any

from nemotron.config.profiles import serves_beside_rank0
from nemotron.config.stepconfig import ModelArch
from nemotron.config.workload import Rollouts, Serving, Training, Workload
from nemotron.launch.served import served_model, vllm_judge
from nemotron.plan.groups import (
    ASSUMED_PROMPT_TOKENS,
    SCALAR_HEAD_ROLES,
    TOKENIZER_VOCAB_CEILING,
    PlanContext,
    PlannedConfig,
    inference_mb,
    suggest,
)
from nemotron.plan.shapes import ModelShape, shape_from_arch
from nemotron.plan.terms import (
    Group,
    activations_mb,
    frozen_weights_mb,
    kv_cache_mb,
    train_state_mb,
)


def plan_groups(ctx: PlanContext, config: PlannedConfig, load: Workload) -> list[Group]:
    world = ctx.nodes * (ctx.per_node if ctx.gpu else int(getattr(ctx.job.profile, "nproc_per_node", 1) or 1))
    ddp = f"DDP over {world} {'GPUs' if ctx.gpu else 'processes'}" if world > 1 else "one process"
    p = ctx.precision
    if isinstance(load, Training):
        m = ctx.trained()
        shape = (
            ctx.shape(m.role, m.ref)
            if m.ref or not m.built_from
            else _arch(ctx, m.role, config, m.built_from)
        )
        if shape is None:
            return []
        records = max(1, load.global_batch // world)
        rows = records * load.rows_per_record  # a preference pair: chosen and rejected in one pass
        seq = load.max_length
        terms = {
            **train_state_mb(shape.parameters, p),
            **activations_mb(shape, rows, seq, p, ctx.checkpointing),
        }
        if m.role in SCALAR_HEAD_ROLES:
            terms["logits"] = 0.0  # a scalar head, no vocabulary
        ctx.add_heap_slack(terms, shape, rows, seq)
        name = f"{m.role.replace('_', ' ')} training"
        sugg = suggest(ctx, load.batch_key, records * world, "runtime.precision=bf16")
        return [ctx.group(name, terms, [(shape, m.role)], ddp, suggestions=sugg)]
    if isinstance(load, Serving):
        m = ctx.models[0]
        shape = ctx.shape(m.role, m.ref)
        if shape is None:
            return []
        batch, seq = load.batch, load.max_length
        terms = {"weights": frozen_weights_mb(shape.parameters, p), **inference_mb(shape, batch, seq, p)}
        sugg = [f"{load.batch_key}={max(1, batch // 2)} (now {batch})", "runtime.precision=bf16"]
        return [ctx.group(f"{m.role.replace('_', ' ')} (server)", terms, [(shape, m.role)], "one server per node",
                          peak=sum(terms.values()) + ctx.runtime_mb, suggestions=sugg)]  # fmt: skip
    return _builtin_rl(ctx, load, world, ddp)


def _arch(ctx: PlanContext, role: str, config: PlannedConfig, key: str) -> ModelShape | None:
    """The shape of a model built from the config's architecture at `key` (a random init)."""
    ctx.roles.add(role)
    model: Any = config
    for part in key.split("."):
        model = getattr(model, part)
    if not isinstance(model, ModelArch):
        raise TypeError(
            f"built_from = {key!r} names no model architecture (nemotron.config.stepconfig.ModelArch)"
        )
    return shape_from_arch(model, TOKENIZER_VOCAB_CEILING)


def _seq(shape: ModelShape, max_new: int, prompt: int) -> int:
    """The longest sequence a rollout makes: the longest prompt and max_new tokens, within the model's positions
    (the step cuts a longer prompt to its last positions - max_new tokens: nemotron.models.prompts.fit_prompts)."""
    return min(shape.context, prompt + max_new) if shape.context else prompt + max_new


def _prompt_tokens(ctx: PlanContext, policy: ModelShape, max_new: int) -> tuple[int, str]:
    """The prompt length the plan sizes the rollouts by, and the note that says where it comes from."""
    found = ctx.prompt_length()
    tokens = found.tokens if found.tokens is not None else ASSUMED_PROMPT_TOKENS
    how = found.how or ("assumed: no prompt file readable here; the step cuts a longer prompt to the model's "
                        "positions less max_new_tokens")  # fmt: skip
    seq = _seq(policy, max_new, tokens)
    cut = f", cut to the model's {policy.context:,} positions" if seq < tokens + max_new else ""
    return (
        tokens,
        f"prompts: {tokens:,} tokens ({how}) + {max_new:,} new tokens{cut}: {seq:,}-token sequences",
    )


def _server_placement(ctx: PlanContext) -> str:
    """Where a served reward model or judge runs: a Slurm job serves it in group 0 of a heterogeneous job, on a node
    of its own (nemotron.launch.served); on Lepton, and wherever else the step starts the server itself
    (reward/sibling.py: under local rank 0, on that rank's device), beside each node's local rank 0: on a GPU that
    rank's device, on the CPU a process of its own beside the trainer."""
    if getattr(ctx.job.profile, "executor", "local") == "slurm" and served_model(ctx.job) is not None:
        return "a node of its own"
    if serves_beside_rank0(ctx.job.profile) or ctx.gpu:
        return "beside local rank 0"
    return "a process of its own"


def _builtin_rl(ctx: PlanContext, r: Rollouts, world: int, ddp: str) -> list[Group]:
    p = ctx.precision
    mb_key, mb, max_new = r.micro_batch_key, r.micro_batch, r.max_new_tokens
    scorer, judge_role, policy, rm, critic = ctx.rl_models()
    groups: list[Group] = []
    served = scorer is not None and scorer.served
    prompt, prompt_note = (
        _prompt_tokens(ctx, policy, max_new) if policy is not None else (ASSUMED_PROMPT_TOKENS, "")
    )
    server: dict[str, float] = {}
    placed = _server_placement(ctx)
    if rm is not None and served:
        vllm = vllm_judge(ctx.job)
        if (
            vllm is not None and vllm.memory and ctx.gpu and ctx.memory
        ):  # `vllm serve` takes its share at start
            server = {"vLLM share (weights + KV cache)": vllm.memory * ctx.memory}
        else:
            server = {
                "weights": frozen_weights_mb(rm.parameters, p),
                **inference_mb(rm, 64, _seq(rm, max_new, prompt), p),
            }
    beside_rank0 = bool(server) and placed == "beside local rank 0"
    if policy is not None:
        seq = _seq(policy, max_new, prompt)
        terms = {
            **train_state_mb(policy.parameters, p),
            **activations_mb(policy, mb, seq, p, ctx.checkpointing),
        }
        terms["reference policy"] = frozen_weights_mb(policy.parameters, p)
        ctx.add_heap_slack(terms, policy, mb, seq)
        models = [(policy, "policy"), (policy, "reference")]
        if critic is not None:
            state = train_state_mb(critic.parameters, p)
            acts = activations_mb(critic, mb, seq, p, ctx.checkpointing)
            terms.update({f"critic {k}": v for k, v in state.items()})
            terms["activations"] += acts["activations"]  # the critic's pass follows the actor's, not at once
            models.append((critic, "critic"))
        if scorer is not None and not served and rm is not None:
            terms["reward model"] = frozen_weights_mb(rm.parameters, p)
            models.append((rm, "reward_model"))
        notes, sugg = [prompt_note], suggest(ctx, mb_key, mb, "runtime.precision=bf16", "backend=nemo_rl (FSDP shards "
                                    "weights, gradients and optimizer over the GPUs)")  # fmt: skip
        util = r.vllm_share
        if util is not None and ctx.memory:
            terms["vLLM (colocated)"] = util * ctx.memory
            notes.append(f"vLLM keeps {util:.0%} of the device for weights and KV cache the whole run; the "
                         f"trainer has the other {1 - util:.0%}")  # fmt: skip
            sugg.append(f"generation.vllm_gpu_memory_utilization={util / 2:g} (now {util:g})")
        else:
            per_rank = max(1, r.responses // world)
            terms["generation KV cache"] = kv_cache_mb(policy, per_rank, seq, p)
        if beside_rank0 and rm is not None:
            terms[f"{judge_role.replace('_', ' ')} server"] = sum(server.values()) + ctx.runtime_mb
            models.append((rm, judge_role))
            notes.append(f"each node's local rank 0 shares its device with the node's {judge_role.replace('_', ' ')} "
                         "server (one per node, started beside it): the peak is that device's")  # fmt: skip
        groups.append(ctx.group("policy training", terms, models, ddp, notes=notes, suggestions=sugg))
    if server and rm is not None and not beside_rank0:
        where = f"node {ctx.nodes} (a node of its own)" if placed == "a node of its own" else ctx.where(0, 1)
        groups.append(ctx.group("reward model" if judge_role == "reward_model" else "judge", server,
                                [(rm, judge_role)], "one server", peak=sum(server.values()) + ctx.runtime_mb,
                                where=where))  # fmt: skip
    return groups
