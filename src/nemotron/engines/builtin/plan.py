"""The built-in engine's resource plan: one trainer process per device (DDP: every device holds the whole model,
its gradients and optimizer state; FSDP, `runtime.sharding=fsdp`: a 1/N shard of each), the reference policy, a critic and an in-process reward model beside it, rollouts
by our KV-cache sampler or a colocated vLLM that keeps its memory share the whole run; a served reward model on its
own node (Slurm) or beside the trainer (local). An engine without plan groups of its own is planned this way."""

from __future__ import annotations

from typing import Any, NamedTuple

from pydantic import BaseModel

from nemotron.config.offpolicy import AsyncGRPO, async_group
from nemotron.config.profiles import serves_beside_rank0, serves_on_a_node
from nemotron.config.stepconfig import ModelArch, TrainRuntime
from nemotron.config.workload import Rollouts, Serving, Training, Workload
from nemotron.plan.groups import (
    ASSUMED_PROMPT_TOKENS,
    SCALAR_HEAD_ROLES,
    TOKENIZER_VOCAB_CEILING,
    PlanContext,
    PlannedConfig,
    inference_mb,
    suggest,
)
from nemotron.plan.served import served_model, vllm_judge
from nemotron.plan.shapes import ModelShape, shape_from_arch
from nemotron.plan.terms import (
    Group,
    MiB,
    Sharding,
    activations_mb,
    compute_bytes,
    dtype_bytes,
    frozen_weights_mb,
    kv_cache_mb,
    train_state_mb,
)


def plan_groups(ctx: PlanContext, config: PlannedConfig, load: Workload) -> list[Group]:
    # the ranks the executor starts, as engines/builtin/engine.py counts them
    world = ctx.nodes * ctx.ranks_per_node
    devices = f"{world} {'GPUs' if ctx.gpu else 'processes'}" if world > 1 else "one process"
    shards = Shards.of(config, world, devices)
    ddp = shards.parallelism
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
        share = max(1, load.global_batch // world)
        records = min(load.micro_batch, share) if load.micro_batch else share
        rows = records * load.rows_per_record  # a preference pair: chosen and rejected in one pass
        seq = load.max_length
        terms = {
            **shards.train_state(shape, p),
            **activations_mb(shape, rows, seq, p, ctx.checkpointing),
        }
        if m.role in SCALAR_HEAD_ROLES:
            terms["logits"] = 0.0  # a scalar head, no vocabulary
        # a frozen copy scores the same rows (a preference step's reference), whole on every rank
        if m.reference:
            terms["reference weights"] = frozen_weights_mb(shape.parameters, p)
        ctx.add_heap_slack(terms, shape, rows, seq)
        name = f"{m.role.replace('_', ' ')} training"
        now = records if load.micro_batch else records * world  # the value batch_key holds
        sugg = suggest(ctx, load.batch_key, now, "runtime.precision=bf16", *shards.remedies())
        return [
            ctx.group(name, terms, [(shape, m.role)], ddp, notes=shards.notes(shape, p), suggestions=sugg)
        ]
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
    asynchronous = async_group(config) if isinstance(config, BaseModel) else None
    return _builtin_rl(
        ctx, load, world, shards, asynchronous if asynchronous and asynchronous.enabled else None
    )


class Shards(NamedTuple):
    """How the trained models' state is spread over the ranks (`runtime.sharding`): DDP keeps it whole on each,
    FSDP divides weights, gradients and AdamW state by the ranks and gathers a layer at a time (rl/sharding.py)."""

    fsdp: bool
    offload: bool
    world: int
    parallelism: str

    @classmethod
    def of(cls, config: PlannedConfig, world: int, devices: str) -> Shards:
        runtime = config.runtime
        fsdp = isinstance(runtime, TrainRuntime) and runtime.sharding == "fsdp"
        offload = fsdp and isinstance(runtime, TrainRuntime) and runtime.fsdp_cpu_offload
        if fsdp:
            parallelism = f"FSDP over {devices}" + (
                ", shards and AdamW state in host memory" if offload else ""
            )
        else:
            parallelism = f"DDP over {devices}" if world > 1 else "one process"
        return cls(fsdp, offload, world, parallelism)

    def train_state(self, shape: ModelShape, precision: str) -> dict[str, float]:
        """Weights, gradients and optimizer per device; under FSDP each a 1/world shard, and the layers it gathers
        (the one computing and the one prefetched, with the root's embeddings, in the compute dtype)."""
        if not self.fsdp:
            return train_state_mb(shape.parameters, precision)
        state = train_state_mb(shape.parameters, precision, Sharding("fsdp", self.world, self.world))
        if (
            self.offload
        ):  # FSDP2's CPUOffloadPolicy: shards, their gradients and AdamW state live in host memory
            state = {k: 0.0 for k in state}
        embeddings = shape.vocab * shape.hidden * (1 if shape.tied else 2)
        per_layer = (shape.parameters - embeddings) / max(shape.layers, 1)
        state["gathered layers (FSDP)"] = (2 * per_layer + embeddings) * compute_bytes(precision) / MiB
        return state

    def notes(self, shape: ModelShape, precision: str) -> list[str]:
        if not self.fsdp:
            return []
        whole = sum(train_state_mb(shape.parameters, precision).values())
        shard = sum(
            train_state_mb(shape.parameters, precision, Sharding("fsdp", self.world, self.world)).values()
        )
        where = "in host memory" if self.offload else "per device"
        return [f"FSDP divides weights, gradients and AdamW state by {self.world}: {shard / 1024:.1f} GiB {where} "
                f"instead of {whole / 1024:.1f} GiB under DDP"]  # fmt: skip

    def remedies(self) -> list[str]:
        if self.fsdp or self.world < 2:
            return []
        return [
            f"runtime.sharding=fsdp (shards weights, gradients and AdamW state over the {self.world} ranks)"
        ]


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
    of its own (nemotron.plan.served); on Lepton, and wherever else the step starts the server itself
    (reward/sibling.py: under local rank 0, on that rank's device), beside each node's local rank 0: on a GPU that
    rank's device, on the CPU a process of its own beside the trainer."""
    if serves_on_a_node(ctx.job.profile) and served_model(ctx.job) is not None:
        return "a node of its own"
    if serves_beside_rank0(ctx.job.profile) or ctx.gpu:
        return "beside local rank 0"
    return "a process of its own"


def _builtin_rl(
    ctx: PlanContext, r: Rollouts, world: int, shards: Shards, asynchronous: AsyncGRPO | None
) -> list[Group]:
    ddp = shards.parallelism
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
            **shards.train_state(policy, p),
            **activations_mb(policy, mb, seq, p, ctx.checkpointing),
        }
        if shards.fsdp:  # rollouts gather the whole policy on every rank (rl/sharding.full_weights)
            terms["policy gathered for generation"] = policy.parameters * compute_bytes(p) / MiB
        terms["reference policy"] = frozen_weights_mb(policy.parameters, p)
        ctx.add_heap_slack(terms, policy, mb, seq)
        models = [(policy, "policy"), (policy, "reference")]
        if critic is not None:
            state = shards.train_state(critic, p)
            acts = activations_mb(critic, mb, seq, p, ctx.checkpointing)
            terms.update({f"critic {k}": v for k, v in state.items()})
            terms["activations"] += acts["activations"]  # the critic's pass follows the actor's, not at once
            models.append((critic, "critic"))
        if scorer is not None and not served and rm is not None:
            terms["reward model"] = frozen_weights_mb(rm.parameters, p)
            models.append((rm, "reward_model"))
        notes = [prompt_note, *shards.notes(policy, p)]
        # the built-in engine refuses fsdp with a colocated vLLM (it loads the whole policy from the trainer's
        # weights) and with prompts that do not divide over the ranks (engines/builtin/engine.py)
        fsdp = shards.remedies() if r.vllm_share is None and r.prompts % world == 0 else []
        sugg = suggest(ctx, mb_key, mb, "runtime.precision=bf16", *fsdp, "backend=nemo_rl (FSDP shards "
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
        if asynchronous is not None:
            _async_generator(ctx, terms, notes, policy, asynchronous.max_trajectory_age_steps)
        groups.append(ctx.group("policy training", terms, models, ddp, notes=notes, suggestions=sugg))
    if server and rm is not None and not beside_rank0:
        where = f"node {ctx.nodes} (a node of its own)" if placed == "a node of its own" else ctx.where(0, 1)
        groups.append(ctx.group("reward model" if judge_role == "reward_model" else "judge", server,
                                [(rm, judge_role)], "one server", peak=sum(server.values()) + ctx.runtime_mb,
                                where=where))  # fmt: skip
    return groups


def _async_generator(
    ctx: PlanContext, terms: dict[str, float], notes: list[str], policy: ModelShape, age: int
) -> None:
    """Async rollouts (nemotron.rl.async_rollouts): each rank's generator process runs on the rank's device with a
    copy of the policy of its own (the trainer's dtype) and its own runtime; the generation terms above are then
    its. The weights reach it through age + 1 slots of the trainer's state dict in the host's shared memory: the
    device's memory on the CPU, the host's beside a GPU."""
    p = ctx.precision
    terms["async generator: policy copy"] = frozen_weights_mb(policy.parameters, p)
    terms["async generator: runtime"] = ctx.runtime_mb
    slots = (age + 1) * policy.parameters * dtype_bytes(p) / MiB
    if not ctx.gpu:
        terms["async weight slots (shared memory)"] = slots
    notes.append(f"async: a generator process per rank beside the trainer on its device, weights through {age + 1} "
                 f"shared-memory slot{'s' * (age > 0)} ({slots / 1024:.2f} GiB of the host's memory)")  # fmt: skip
