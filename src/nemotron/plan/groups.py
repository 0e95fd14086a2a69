"""Which process groups a job runs, on which devices, holding which models: the compiled Job (its step, config
and profile) and its placement turned into `plan.terms.Group`s, one engine at a time.

Which models a step runs comes from its manifest's [[models]] (compiled into `Job.models`), the work of one step
from its schema's `workload()` (nemotron.config.workload): the plan names no step.

- builtin: one trainer process per device (DDP: every device holds the whole model, its gradients and optimizer
  state), the reference policy, a critic and an in-process reward model beside it, rollouts by our KV-cache
  sampler or a colocated vLLM that keeps its memory share the whole run; a served reward model on its own node
  (Slurm) or beside the trainer (local).
- nemo_rl: DTensor (FSDP over every training GPU, TP, CP) or Megatron (TP x PP, distributed optimizer), with
  vLLM colocated: generation and training take turns (vLLM sleeps while the policy trains, the policy's optimizer
  leaves the GPU while vLLM generates), the reference policy and the critic are swapped in for their passes.
- nemo_aligner: the hetjob's actor, critic and reward-model servers, Megatron with NeMo-Aligner's TP = PP = 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from nemotron.config.profiles import runs_here, serves_beside_rank0
from nemotron.config.stepconfig import ModelArch, NemoRL, ResourcePlan, Runtime, ServeRuntime, TrainRuntime
from nemotron.config.workload import JobModel, Rollouts, Serving, Training, Workload
from nemotron.errors import UserError
from nemotron.plan.shapes import ModelShape, known_shape, shape_from_arch, shape_from_checkpoint
from nemotron.plan.terms import (
    CPU_RUNTIME_MB,
    GPU_RUNTIME_MB,
    Group,
    Plan,
    Sharding,
    activations_mb,
    device_memory,
    frozen_weights_mb,
    heap_slack_mb,
    kv_cache_mb,
    model_entry,
    train_state_mb,
    training_peak,
)

if TYPE_CHECKING:
    from nemotron.compile import Job


class PlannedConfig(Protocol):
    """A step Config the plan can size: its plan hints, its runtime and the work of one step."""

    @property
    def plan(self) -> ResourcePlan: ...
    @property
    def runtime(self) -> Runtime | ServeRuntime: ...
    def workload(self) -> Workload: ...


class NemoRLConfig(PlannedConfig, Protocol):
    """A step Config NeMo-RL runs: its `nemo_rl` group sizes the plan's groups."""

    @property
    def nemo_rl(self) -> NemoRL: ...


# A reward model's or critic's head is one number per sequence: no logits over a vocabulary.
SCALAR_HEAD_ROLES = ("reward_model", "critic")
TOKENIZER_VOCAB_CEILING = 4096  # a tokenizer trained on the data (no inputs.init_from) has at most this many
DEFAULT_PROMPT_TOKENS = (
    512  # the builtin engine's prompt budget for the plan (NeMo-RL: nemo_rl.max_prompt_tokens)
)


class Shapes:
    """Looks up each model's shape: a readable checkpoint, the shape table for an HF id, a `plan.models` hint."""

    def __init__(self, hints: dict[str, str]) -> None:
        self.unknown: list[str] = []
        self.hints = dict(hints)

    def of(self, role: str, ref: str | None) -> ModelShape | None:
        hint = self.hints.get(role)
        if ref:
            found = shape_from_checkpoint(Path(ref).expanduser()) or known_shape(ref)
            if found:
                return found
        if hint:
            found = known_shape(hint)
            if found is None:
                from nemotron.plan.shapes import KNOWN_MODELS

                raise UserError(
                    f"plan.models.{role}={hint!r}: not in the shape table; use one of: "
                    + ", ".join(sorted(k for k in KNOWN_MODELS if "Instruct" in k))
                )
            return found
        self.unknown.append(
            f"{role}: {ref or '(not set)'} is not a checkpoint readable here and not in the shape table; set "
            f"plan.models.{role}=<a Hugging Face id from docs/cluster.md's shape table>"
        )
        return None


def plan_job(job: Job, nodes: int, gpus_per_node: int) -> Plan:
    """The resource plan of a compiled job on `nodes` nodes of `gpus_per_node` GPUs (0: CPU): the models its
    manifest declares, sized by the work its schema's `workload()` gives."""
    if not job.models or not callable(getattr(job.validated, "workload", None)):
        plan = getattr(job.validated, "plan", None)  # a step of no declared models may have no plan group
        return Plan([], plan.on_no_fit if isinstance(plan, ResourcePlan) else "refuse")
    # the model refs come from Job.models (resolved paths); the rest of the config reads as validated
    config = cast("PlannedConfig", job.validated)
    shapes = Shapes(config.plan.models)
    name, memory, gpu = device_memory(job.profile, config.runtime.device)
    ctx = _Context(job, config, shapes, name, memory, gpu, nodes, max(gpus_per_node, 1))
    groups = _GROUPS.get(job.backend, _builtin)(ctx, config, config.workload())
    unused = set(shapes.hints) - ctx.roles
    if unused:
        raise UserError(
            f"plan.models names {', '.join(sorted(unused))}, which {job.step_id} does not run here; its models: "
            + ", ".join(sorted(ctx.roles))
        )
    return Plan(groups, config.plan.on_no_fit, shapes.unknown)


class _Context:
    def __init__(self, job: Job, config: PlannedConfig, shapes: Shapes, device: str, memory: float | None,
                 gpu: bool, nodes: int, per_node: int) -> None:  # fmt: skip
        self.job, self.shapes, self.device, self.memory, self.gpu = job, shapes, device, memory, gpu
        self.models = job.models
        self.nodes, self.per_node = nodes, per_node
        self.roles: set[str] = set()
        runtime = config.runtime
        self.precision: str = runtime.precision
        # a server (rm/serve's ServeRuntime) trains nothing, so it has no checkpointing to turn on
        self.checkpointing = isinstance(runtime, TrainRuntime) and runtime.gradient_checkpointing

    def trained(self) -> JobModel:
        """The model a training step trains (the policy of an RL step)."""
        found = next((m for m in self.models if m.reference), None) or next(
            (m for m in self.models if m.trained), None
        )
        if found is None:
            raise UserError(
                f"{self.job.step_id}: its schema's workload() trains a model, but its manifest's [[models]] "
                "declare none with trained = true"
            )
        return found

    def scorer(self) -> JobModel | None:
        """The frozen model that scores an RL step's responses (its reward model or judge)."""
        return next((m for m in self.models if not m.trained and m.role != "policy"), None)

    def rl_models(
        self,
    ) -> tuple[JobModel | None, str, ModelShape | None, ModelShape | None, ModelShape | None]:
        """An RL step's models as both engines size them: (the scorer, its role, the policy's shape, the scorer's
        shape, the critic's shape)."""
        trained, scorer = self.trained(), self.scorer()
        judge_role = scorer.role if scorer is not None else "reward_model"
        policy = self.shape(trained.role, trained.ref)
        rm = self.shape(judge_role, scorer.ref if scorer is not None else None)
        return scorer, judge_role, policy, rm, self.critic_shape(scorer, rm)

    def critic(self) -> JobModel | None:
        return next((m for m in self.models if m.role == "critic"), None)

    def critic_shape(self, scorer: JobModel | None, scorer_shape: ModelShape | None) -> ModelShape | None:
        """The critic's shape: the scorer's when it starts from the same input (a reward model's backbone)."""
        critic = self.critic()
        if critic is None:
            return None
        if scorer is not None and critic.input == scorer.input:
            return scorer_shape
        return self.shape(critic.role, critic.ref)

    def shape(self, role: str, ref: str | None) -> ModelShape | None:
        self.roles.add(role)
        return self.shapes.of(role, ref)

    def add_heap_slack(self, terms: dict[str, float], shape: ModelShape, rows: int, seq: int) -> None:
        """On the CPU, the heap pages a training step frees but the allocator keeps (terms.heap_slack_mb)."""
        if not self.gpu:
            full = activations_mb(shape, rows, seq, self.precision, False)["activations"]
            terms["heap slack"] = heap_slack_mb(terms, full)

    @property
    def runtime_mb(self) -> float:
        return GPU_RUNTIME_MB if self.gpu else CPU_RUNTIME_MB

    def where(self, first: int = 0, count: int | None = None) -> str:
        count = self.nodes if count is None else count
        if runs_here(self.job.profile):
            return "this machine"
        return f"node {first}" if count == 1 else f"nodes {first}-{first + count - 1}"

    def group(self, name: str, terms: dict[str, float], models: list[tuple[ModelShape, str]], parallelism: str,
              peak: float | None = None, where: str | None = None, **extra: Any) -> Group:  # fmt: skip
        terms = {"runtime": self.runtime_mb, **{k: v for k, v in terms.items()}}
        return Group(
            name, where or self.where(), self.device, self.memory, [model_entry(s, r) for s, r in models], terms,
            training_peak(terms, not self.gpu, self.checkpointing) if peak is None else peak, parallelism, **extra,
            enforced=self.gpu,
        )  # fmt: skip


def _suggest(ctx: _Context, mb_key: str, mb: int, *more: str) -> list[str]:
    out = [] if ctx.checkpointing else ["runtime.gradient_checkpointing=true"]
    if mb > 1:
        out.append(f"{mb_key}={max(1, mb // 2)} (now {mb})")
    return [*out, *more]


# ---- builtin ----------------------------------------------------------------------------------------------------


def _builtin(ctx: _Context, config: PlannedConfig, load: Workload) -> list[Group]:
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
        sugg = _suggest(ctx, load.batch_key, records * world, "runtime.precision=bf16")
        return [ctx.group(name, terms, [(shape, m.role)], ddp, suggestions=sugg)]
    if isinstance(load, Serving):
        m = ctx.models[0]
        shape = ctx.shape(m.role, m.ref)
        if shape is None:
            return []
        batch, seq = load.batch, load.max_length
        terms = {"weights": frozen_weights_mb(shape.parameters, p), **_inference_mb(shape, batch, seq, p)}
        sugg = [f"{load.batch_key}={max(1, batch // 2)} (now {batch})", "runtime.precision=bf16"]
        return [ctx.group(f"{m.role.replace('_', ' ')} (server)", terms, [(shape, m.role)], "one server per node",
                          peak=sum(terms.values()) + ctx.runtime_mb, suggestions=sugg)]  # fmt: skip
    return _builtin_rl(ctx, load, world, ddp)


def _arch(ctx: _Context, role: str, config: PlannedConfig, key: str) -> ModelShape | None:
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


def _inference_mb(shape: ModelShape, rows: int, seq: int, precision: str) -> dict[str, float]:
    """A forward without gradients holds about one layer's activations at a time (the hidden states in, the
    widest intermediate out) and no logits for a scalar head."""
    size = 2 if precision != "fp32" else 4
    return {"activations": rows * seq * (2 * shape.hidden + 2 * shape.intermediate) * size / 2**20}


def _seq(shape: ModelShape, max_new: int, prompt: int = DEFAULT_PROMPT_TOKENS) -> int:
    return min(shape.context, prompt + max_new) if shape.context else prompt + max_new


def _builtin_rl(ctx: _Context, r: Rollouts, world: int, ddp: str) -> list[Group]:
    p = ctx.precision
    mb_key, mb, max_new = r.micro_batch_key, r.micro_batch, r.max_new_tokens
    scorer, judge_role, policy, rm, critic = ctx.rl_models()
    groups: list[Group] = []
    served = scorer is not None and scorer.served
    server: dict[str, float] = {}
    if rm is not None and served:
        server = {
            "weights": frozen_weights_mb(rm.parameters, p),
            **_inference_mb(rm, 64, _seq(rm, max_new), p),
        }
    # On Lepton the server is a sibling of each node's local rank 0 (reward/sibling.py), on that rank's device
    beside_rank0 = bool(server) and serves_beside_rank0(ctx.job.profile)
    if policy is not None:
        seq = _seq(policy, max_new)
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
        notes, sugg = [], _suggest(ctx, mb_key, mb, "runtime.precision=bf16", "backend=nemo_rl (FSDP shards "
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
                         "server (one per node): the peak is that device's")  # fmt: skip
        groups.append(ctx.group("policy training", terms, models, ddp, notes=notes, suggestions=sugg))
    if server and rm is not None and not beside_rank0:
        local = runs_here(ctx.job.profile)
        where = "this machine" if local else f"node {ctx.nodes} (a node of its own)"
        groups.append(ctx.group("reward model" if judge_role == "reward_model" else "judge", server,
                                [(rm, judge_role)], "one server", peak=sum(server.values()) + ctx.runtime_mb,
                                where=where))  # fmt: skip
    return groups


# ---- nemo_rl ----------------------------------------------------------------------------------------------------


def _nemo_rl(ctx: _Context, planned: PlannedConfig, r: Workload) -> list[Group]:
    if not isinstance(r, Rollouts):
        return []  # NeMo-RL runs the RL steps here; the engine refuses any other
    nemo = cast("NemoRLConfig", planned).nemo_rl  # NeMo-RL's recipes' Configs have its group
    tp, pp, cp = nemo.tensor_parallel_size, nemo.pipeline_parallel_size, nemo.context_parallel_size
    megatron = nemo.policy_backend == "megatron"
    mb_key, mb, max_new = r.micro_batch_key, r.micro_batch, r.max_new_tokens
    _, judge_role, policy, rm, critic = ctx.rl_models()
    total = ctx.nodes * ctx.per_node
    rm_gpus = nemo.reward_model_gpus if rm is not None and judge_role == "reward_model" else 0
    own_node = ctx.nodes > 1 and rm_gpus > 0
    world = total - (ctx.per_node if own_node else rm_gpus)
    if megatron:
        sharding = Sharding("megatron", tp * pp, world, tp, cp, pp)
        par = f"Megatron TP {tp} x PP {pp} x CP {cp}, distributed optimizer over {world} GPUs"
    else:
        sharding = Sharding("fsdp", world, world, tp, cp)
        par = f"DTensor FSDP over {world} GPUs, TP {tp}, CP {cp}"
    p = "bf16-mixed" if ctx.precision != "fp32" else "fp32"
    seq = nemo.max_prompt_tokens + max_new
    train_nodes = ctx.nodes - 1 if own_node else ctx.nodes
    where = ctx.where(0, train_nodes)
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
        groups.append(ctx.group("policy training", terms, [(policy, "policy")], par, where=where,
                                suggestions=_suggest(ctx, mb_key, mb, *more)))  # fmt: skip
        ref = {
            "weights": state["weights"],
            "logits": activations_mb(policy, mb, seq, "bf16", False, sharding)["logits"],
        }
        groups.append(ctx.group("reference policy", ref, [(policy, "reference")], par + "; swapped in for its logprobs",
                                peak=sum(ref.values()) + ctx.runtime_mb, where=where))  # fmt: skip
        util, gen_tp = nemo.gpu_memory_utilization, nemo.generation_tensor_parallel_size
        if ctx.memory:
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
                                suggestions=_suggest(ctx, mb_key, mb, *more)))  # fmt: skip
    if rm is not None and judge_role == "judge":
        ctx.shapes.unknown.append(
            f"judge: {rm.name} runs in NeMo-Gym's own vLLM server, outside the policy's GPUs"
        )
    if rm is not None and judge_role == "reward_model":
        rm_sh = Sharding("fsdp", rm_gpus, rm_gpus)
        terms = {
            "weights": frozen_weights_mb(rm.parameters, "bf16", rm_sh),
            **_inference_mb(rm, mb, seq, "bf16"),
        }
        rm_where = ctx.where(ctx.nodes - 1, 1) if own_node else ctx.where(0, 1)
        groups.append(ctx.group("reward model", terms, [(rm, "reward_model")], f"FSDP over {rm_gpus} GPUs",
                                peak=sum(terms.values()) + ctx.runtime_mb, where=rm_where))  # fmt: skip
    return groups


def _gathered_layers_mb(shape: ModelShape) -> float:
    per_layer = (shape.parameters - shape.vocab * shape.hidden * (1 if shape.tied else 2)) / shape.layers
    return 2 * per_layer * 2 / 2**20  # the layer computing and the one prefetched, in bf16


# ---- nemo_aligner -----------------------------------------------------------------------------------------------


def _nemo_aligner(ctx: _Context, _config: PlannedConfig, r: Workload) -> list[Group]:
    groups: list[Group] = []
    if isinstance(r, Serving):
        m = ctx.models[0]
        shape = ctx.shape(m.role, m.ref)
        if shape:
            terms = {"weights": frozen_weights_mb(shape.parameters, "bf16", Sharding("megatron"))}
            groups.append(ctx.group(f"{m.role.replace('_', ' ')} (server)", terms, [(shape, m.role)],
                                    "Megatron TP 1 x PP 1", peak=sum(terms.values()) + ctx.runtime_mb))  # fmt: skip
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
    seq = DEFAULT_PROMPT_TOKENS + max_new
    par = f"Megatron TP 1 x PP 1 (the .nemo's), distributed optimizer over {world} GPUs"
    if policy is not None:
        terms = {**train_state_mb(policy.parameters, "bf16-mixed", sharding),
                 **activations_mb(policy, mb, seq, "bf16", ctx.checkpointing, sharding),
                 "reference policy": frozen_weights_mb(policy.parameters, "bf16", sharding)}  # fmt: skip
        groups.append(ctx.group("policy training (actor)", terms, [(policy, "policy"), (policy, "reference")], par,
                                suggestions=_suggest(ctx, mb_key, mb, "more nodes (the profile's nodes)")))  # fmt: skip
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


# engine -> its plan groups; an engine not here runs as the built-in one does (one process per device)
_GROUPS = {"nemo_rl": _nemo_rl, "nemo_aligner": _nemo_aligner}
