"""Which process groups a job runs, on which devices, holding which models: the compiled Job (its step, config
and profile) and its placement turned into `plan.terms.Group`s by the job's engine (`plan_groups` in its folder:
nemotron.engines.builtin.plan, nemotron.engines.nemo_rl.plan, nemotron.engines.nemo_aligner.plan), which reads the
job through a `PlanContext`.

Which models a step runs comes from its manifest's [[models]] (compiled into `Job.models`), the work of one step
from its schema's `workload()` (nemotron.config.workload): the plan names no step.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import yaml
from pydantic import ValidationError

from nemotron.config.backends import PLAN_GROUPS
from nemotron.config.stepconfig import ResourcePlan, Runtime, ServeRuntime, TrainRuntime
from nemotron.config.workload import JobModel, Workload
from nemotron.errors import UserError
from nemotron.models.prompt_lengths import PromptLength, longest_prompt
from nemotron.plan.placement import Placement
from nemotron.plan.shapes import ModelShape, known_shape, shape_from_checkpoint
from nemotron.plan.terms import (
    CPU_RUNTIME_MB,
    GPU_RUNTIME_MB,
    GPU_TYPES,
    Group,
    Plan,
    activations_mb,
    heap_slack_mb,
    model_entry,
    refusal,
    training_peak,
)

if TYPE_CHECKING:
    from nemotron.compile import Job


@runtime_checkable
class PlannedConfig(Protocol):
    """A step Config the plan can size: its plan hints, its runtime and the work of one step."""

    @property
    def plan(self) -> ResourcePlan: ...
    @property
    def runtime(self) -> Runtime | ServeRuntime: ...
    def workload(self) -> Workload: ...


# An engine's plan groups: (the job's context, its config, the work of one step) -> the process groups it runs
GroupsFn = Callable[["PlanContext", PlannedConfig, Workload], list[Group]]
# A reward model's or critic's head is one number per sequence: no logits over a vocabulary.
SCALAR_HEAD_ROLES = ("reward_model", "critic")
TOKENIZER_VOCAB_CEILING = 4096  # a tokenizer trained on the data (no inputs.init_from) has at most this many
# The built-in engine's prompt length when no prompt file is readable here (a path on the cluster); NeMo-RL's plan
# reads nemo_rl.max_prompt_tokens instead
ASSUMED_PROMPT_TOKENS = 512
PROMPT_TYPE = "prompt_jsonl"  # the artifact type (and its subtypes) of the prompts an RL step rolls out on


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
            # the hint stands in for a model the plan cannot read: the row says so, and for which input, so a
            # preset's hint left over a changed input (inputs.policy=/lustre/me/70b) shows
            return found._replace(source=f"plan.models.{role}, standing in for {ref}") if ref else found
        self.unknown.append(
            f"{role}: {ref or '(not set)'} is not a checkpoint readable here and not in the shape table; set "
            f"plan.models.{role}=<a Hugging Face id from docs/cluster.md's shape table>"
        )
        return None


def plan_job(job: Job, where: Placement) -> Plan:
    """The resource plan of a compiled job where its executor places it (nodes of gpus_per_node GPUs, 0: CPU): the
    models its manifest declares, sized by the work its schema's `workload()` gives."""
    config = job.config
    if not job.models or not isinstance(config, PlannedConfig):
        plan = getattr(config, "plan", None)  # a step of no declared models may have no plan group
        return Plan([], plan.on_no_fit if isinstance(plan, ResourcePlan) else "refuse")
    # the model refs come from Job.models (resolved paths); the rest of the config reads as validated
    shapes = Shapes(config.plan.models)
    name, memory, gpu = device_memory(job.profile, config.runtime.device, where.here)
    ctx = PlanContext(job, config, shapes, name, memory, gpu, where)
    groups = groups_of(job.backend)(ctx, config, config.workload())
    unused = set(shapes.hints) - ctx.roles
    if unused:
        raise UserError(
            f"plan.models names {', '.join(sorted(unused))}, which {job.step_id} does not run here; its models: "
            + ", ".join(sorted(ctx.roles))
        )
    return Plan(groups, config.plan.on_no_fit, shapes.unknown)


def fitting_plan(job: Job, where: Placement) -> Plan:
    """`plan_job`, refused here when it cannot fit (exit 2, naming the process group, the device, the memory and
    the keys that would make it fit) unless plan.on_no_fit=warn: dry run and submit plan through this."""
    planned = plan_job(job, where)
    refused = planned.refused()
    if refused:
        group = refused[0]
        fit = remedies_that_fit(job, where, group.suggestions) or [
            f"none of {', '.join(r.split(' (', 1)[0] for r in group.suggestions)} is enough on its own; a device "
            "with more memory (the profile's gpu_type or gpu_memory_gb) or a smaller model"
        ]
        raise UserError(refusal(replace(group, suggestions=fit)))
    return planned


def remedies_that_fit(job: Job, where: Placement, suggestions: list[str]) -> list[str]:
    """The engine's remedies for a plan that cannot fit, each `KEY=VALUE` one re-planned on its own (the job's
    config with that key set, its engine the one the config then names: that engine's own preflight, then the whole
    plan) and kept only if the job then passes both and leaves no other group without its devices (NeMo-RL's judge);
    one that is not a key (more GPUs, more nodes) is kept as said, after them. Asked only of a plan that cannot fit."""
    from nemotron.compile.preflight import engine_checks
    from nemotron.config.configtree import set_dotted
    from nemotron.config.stepconfig import engine_name

    manifest = job.catalog.get(job.step_id).manifest
    short = _short(plan_job(job, where))  # groups the job itself leaves without their devices

    keys, said = [], []
    for remedy in suggestions:
        key, eq, rest = remedy.partition("=")
        if not eq or " " in key:
            said.append(remedy)
            continue
        tree = copy.deepcopy(job.config_tree)  # the job's own stays as compiled
        set_dotted(tree, key, yaml.safe_load(rest.split(" (", 1)[0]))
        try:
            config = type(job.config).model_validate(tree)
            own = engine_checks(manifest, config, job.bindings, where.nodes, where.gpus_per_node)
            if own.problems or any(g.problem(job.profile.name) for g in own.groups):
                continue  # the engine refuses the job so changed (e.g. sizes that do not divide its GPUs)
            replanned = plan_job(replace(job, config=config, backend=engine_name(config)), where)
            if not replanned.refused() and _short(replanned) <= short:
                keys.append(
                    remedy
                )  # fits, and leaves no other group without its devices (a judge with no GPU)
        except (ValidationError, UserError):
            continue  # a value the schema refuses, or a plan that cannot be made: no remedy
    return [*keys, *said]


def _short(plan: Plan) -> set[str]:
    return {g.name for g in plan.groups if g.shortfall}


def device_memory(profile: Any, runtime_device: str, local: bool) -> tuple[str, float | None, bool]:
    """(the device's name, its memory in MiB or None when unknown, whether it is a GPU).

    A job on this machine (`local`) trains on a GPU when its `runtime.device` is `cuda`, or `auto` on a machine whose NVIDIA driver
    lists a GPU (/proc/driver/nvidia/gpus: read, not torch, which dry-run never imports)."""
    gpus = int(getattr(profile, "gpus_per_node", 0) or 0)
    gpu_type, gpu_gb = getattr(profile, "gpu_type", None), getattr(profile, "gpu_memory_gb", None)
    local_gpu = local and (runtime_device == "cuda" or (runtime_device == "auto" and _nvidia_gpu_here()))
    if gpus > 0 or gpu_type or gpu_gb or local_gpu:
        if gpu_gb:
            return f"GPU (gpu_memory_gb = {gpu_gb:g})", float(gpu_gb) * 1024, True
        if gpu_type:
            return f"{gpu_type} ({GPU_TYPES[gpu_type] / 1024:.0f} GiB)", float(GPU_TYPES[gpu_type]), True
        return "GPU (memory unknown: set the profile's gpu_type or gpu_memory_gb)", None, True
    if local:
        return "RAM", _ram_mb(), False
    return "RAM of a node (unknown)", None, False


def _nvidia_gpu_here() -> bool:
    try:
        return any(Path("/proc/driver/nvidia/gpus").iterdir())
    except OSError:
        return False


def _ram_mb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class PlanContext:
    """What an engine's plan groups read: the job, its models and their shapes, the device, the nodes (and whether
    they are this machine)."""

    def __init__(self, job: Job, config: PlannedConfig, shapes: Shapes, device: str, memory: float | None,
                 gpu: bool, where: Placement) -> None:  # fmt: skip
        self.job, self.shapes, self.device, self.memory, self.gpu = job, shapes, device, memory, gpu
        self.models = job.models
        self.nodes, self.per_node, self.here = where.nodes, max(where.gpus_per_node, 1), where.here
        # a torchrun step's ranks per node, as its executor starts them
        self.ranks_per_node = where.ranks_per_node
        self.roles: set[str] = set()
        runtime = config.runtime
        self.precision: str = runtime.precision
        # a server (rm/serve's ServeRuntime) trains nothing, so it has no checkpointing to turn on
        self.checkpointing = isinstance(runtime, TrainRuntime) and runtime.gradient_checkpointing
        self._prompts: PromptLength | None = None

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

    def prompt_length(self) -> PromptLength:
        """The longest prompt of the job's prompt inputs (every bound input whose type is a prompt_jsonl) that are
        files here, counted with the trained model's tokenizer where it is a checkpoint here."""
        if self._prompts is None:
            catalog = self.job.catalog
            files = [Path(b.path) for b in self.job.bindings
                     if b.path and catalog.is_a(b.expected_type, PROMPT_TYPE) and Path(b.path).is_file()]  # fmt: skip
            ref = self.trained().ref
            tokenizer = Path(ref).expanduser() if ref and Path(ref).expanduser().is_dir() else None
            self._prompts = longest_prompt(files, tokenizer) if files else PromptLength(None, "")
        return self._prompts

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
        if self.here:
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


def suggest(ctx: PlanContext, mb_key: str, mb: int, *more: str) -> list[str]:
    out = [] if ctx.checkpointing else ["runtime.gradient_checkpointing=true"]
    if mb > 1:
        out.append(f"{mb_key}={max(1, mb // 2)} (now {mb})")
    return [*out, *more]


def inference_mb(shape: ModelShape, rows: int, seq: int, precision: str) -> dict[str, float]:
    """A forward without gradients holds about one layer's activations at a time (the hidden states in, the
    widest intermediate out) and no logits for a scalar head."""
    size = 2 if precision != "fp32" else 4
    return {"activations": rows * seq * (2 * shape.hidden + 2 * shape.intermediate) * size / 2**20}


def groups_of(engine: str) -> GroupsFn:
    """The engine's own plan groups, found through its trait (nemotron.config.backends.PLAN_GROUPS); an engine without
    one is planned as the built-in engine (one process per device)."""
    module, _, name = PLAN_GROUPS.get(engine, PLAN_GROUPS["builtin"]).partition(":")
    groups: GroupsFn = getattr(importlib.import_module(module), name)
    return groups
