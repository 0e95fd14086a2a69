"""The resource plan: memory per device for each process group of a job, from the model shapes and the job's
precision, batch, sequence length and parallelism, torch-free. Every term is a pure function of those numbers
(docs/cluster.md, "The resource plan", gives the formulas); `fit` says whether a group's peak fits its device.

A training process's peak is its weights and optimizer state, plus the larger of the activations kept for the
backward pass (at the end of the forward) and the gradients (at the end of the backward): gradients are freed
after each optimizer step (`zero_grad(set_to_none=True)`), so the two are not held at once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, NamedTuple

from nemotron.plan.shapes import ModelShape

MiB = 2**20
Precision = Literal["fp32", "bf16", "bf16-mixed"]

# memory.total as nvidia-smi reports it, in MiB: what `runtime.gpu_type` / a profile's `gpu_type` names.
GPU_TYPES: dict[str, int] = {
    "H100-80GB": 81559,
    "H200": 143771,
    "A100-40GB": 40960,
    "A100-80GB": 81920,
    "L40S": 46068,
}
# The CUDA context, NCCL buffers and the caching allocator's slack are not in any model term; NeMo-RL and
# Megatron users budget about a GiB per GPU for them.
GPU_RUNTIME_MB = 1024.0
# A CPU step process's resident set before its models: Python, torch, transformers, tokenizers and the data,
# measured as the peak_memory_mb of a tiny (0.13M-parameter) sft run (bench/memory_plan.py).
CPU_RUNTIME_MB = 430.0


def dtype_bytes(precision: str) -> int:
    """Bytes per weight: bfloat16 under `bf16`, fp32 master weights otherwise (`bf16-mixed` keeps fp32)."""
    return 2 if precision == "bf16" else 4


def compute_bytes(precision: str) -> int:
    """Bytes per activation element: bfloat16 under `bf16` and `bf16-mixed` (autocast), fp32 otherwise."""
    return 4 if precision == "fp32" else 2


class Sharding(NamedTuple):
    """How one model's weights, gradients and optimizer state are split over the devices of its group.

    weights: devices one copy of the weights is split over (FSDP: the data-parallel world; Megatron: TP x PP);
    optimizer: devices the optimizer state (and the fp32 master weights) is split over (FSDP: as the weights;
    Megatron's distributed optimizer: TP x PP x DP); tp and cp divide the activations of one sequence.
    """

    kind: Literal["ddp", "fsdp", "megatron", "single"] = "single"
    weights: int = 1
    optimizer: int = 1
    tp: int = 1
    cp: int = 1
    pp: int = 1


ONE_DEVICE = Sharding()  # a model whole on each device: nothing split


def train_state_mb(parameters: int, precision: str, sharding: Sharding = ONE_DEVICE) -> dict[str, float]:
    """Weights, gradients and AdamW's two moments per device, in MiB.

    The built-in engine and FSDP keep weights, gradients and both moments in the weight dtype (fp32, or bf16
    under `bf16`): 4 + 4 + 8 bytes per parameter in fp32, 2 + 2 + 4 in bf16; `bf16-mixed` adds the bf16 copies
    autocast caches for the forward (2 bytes; FSDP instead gathers and casts a layer or two at a time, a term of
    its own). Megatron (bf16 weights, fp32 gradients, distributed optimizer
    with fp32 master weights and moments): 2 + 4 bytes per parameter on each TP x PP shard, plus 12 split over
    the data-parallel ranks too.
    """
    if sharding.kind == "megatron":
        shard = parameters / sharding.weights
        return {
            "weights": shard * 2 / MiB,
            "gradients": shard * 4 / MiB,
            "optimizer": parameters * 12 / sharding.optimizer / MiB,
        }
    size = dtype_bytes(precision)
    shard = parameters / sharding.weights
    terms = {
        "weights": shard * size / MiB,
        "gradients": shard * size / MiB,
        "optimizer": shard * 2 * size / MiB,
    }
    if precision == "bf16-mixed" and sharding.kind != "fsdp":  # FSDP casts a gathered layer at a time
        terms["bf16 weight copies"] = shard * 2 / MiB
    return terms


def frozen_weights_mb(parameters: int, precision: str, sharding: Sharding = ONE_DEVICE) -> float:
    """A model that only runs forwards (reference policy, reward model, judge): its weights per device."""
    size = 2 if sharding.kind == "megatron" else dtype_bytes(precision)
    return parameters / sharding.weights * size / MiB


def layer_bytes(shape: ModelShape, size: int) -> int:
    """Bytes one decoder layer keeps per token for its backward pass (no checkpointing), `size` the compute dtype's.

    Counted from the modules, then checked against the memory one forward adds on the CPU (bench/memory_plan.py):
    Llama and Mistral layers keep 15 hidden-wide tensors (the residual stream, both RMSNorms' input, upcast and
    output; q, k and v before and after the rotary embedding as attention saves them; the attention output and
    o_proj's contiguous input) and 4 MLP-wide ones (gate, up, SiLU, product); Qwen2's attention keeps 6 fewer
    hidden-wide ones (measured: 9). Under a 16-bit dtype 7 of the hidden-wide ones stay fp32 (RMSNorm computes in
    fp32). GPT-2 layers keep 11 hidden-wide tensors (both LayerNorms' input and output, q, k, v, the attention
    output, c_proj's input, the residual) and 5 MLP-wide ones (c_fc's output and the four its tanh GELU keeps).
    """
    h, inter = shape.hidden, shape.intermediate
    if shape.gated_mlp:
        wide = 9 if shape.family == "qwen2" else 15
        return (wide * h + 4 * inter) * size + 7 * h * (4 - size)
    return (11 * h + 5 * inter) * size


def activations_mb(
    shape: ModelShape,
    micro_batch: int,
    seq_len: int,
    precision: str,
    checkpointing: bool,
    sharding: Sharding = ONE_DEVICE,
) -> dict[str, float]:
    """Activations kept for the backward pass of one micro-batch, per device, in MiB.

    Without checkpointing every layer keeps `layer_bytes` per token; with it each layer keeps only its input
    (h per token) and one layer's full activations exist at a time, while it is recomputed. The output head's
    logits cost tokens x vocabulary x (the compute dtype + fp32 upcast + fp32 log-softmax). Tensor and context
    parallelism divide the tokens' width and the sequence; a pipeline stage holds layers / PP layers, for as
    many as PP micro-batches at once (1F1B's first stage).
    """
    tokens = micro_batch * seq_len / sharding.cp
    size = compute_bytes(precision)
    layers = shape.layers / sharding.pp
    per_layer = tokens * layer_bytes(shape, size) / sharding.tp
    if checkpointing:
        layer_term = layers * tokens * shape.hidden * size + per_layer
    else:
        layer_term = layers * per_layer
    # Megatron's 1F1B schedule keeps PP micro-batches in flight on the first stage.
    layer_term *= sharding.pp
    logits = tokens * shape.vocab / sharding.tp * (size + 4 + 4)
    return {"activations": layer_term / MiB, "logits": logits / MiB}


def kv_cache_mb(shape: ModelShape, sequences: int, seq_len: int, precision: str, tp: int = 1) -> float:
    """Keys and values of `sequences` sequences of `seq_len` tokens: 2 x layers x KV width per token."""
    return sequences * seq_len * shape.layers * 2 * shape.kv_width / tp * compute_bytes(precision) / MiB


@dataclass
class Group:
    """One process group's memory per device: its terms and what happens to them."""

    name: str  # "policy training", "reference policy", "vLLM generation", "reward model", ...
    nodes: str  # where it runs: "node 0", "nodes 0-1", "this machine"
    device: str  # "H100-80GB (80 GiB)", "RAM"
    available_mb: float | None  # None: the device's memory is unknown, nothing to check
    models: list[dict[str, Any]]  # name, parameters, source of each model it holds
    terms_mb: dict[str, float]
    peak_mb: float
    parallelism: str  # "DDP over 16 GPUs", "FSDP over 8 GPUs, TP 1", ...
    notes: list[str] = field(default_factory=list)
    suggestions: list[str] = field(default_factory=list)  # keys that would make it fit
    # a GPU's memory is the profile's word; a machine's RAM is shared with everything else on it and backed by
    # swap, so overflowing it is a warning, never a refusal
    enforced: bool = True
    # why the group cannot run whatever its memory (no device is left for it); "" when it has its devices
    shortfall: str = ""

    @property
    def fits(self) -> bool:
        return not self.shortfall and (self.available_mb is None or self.peak_mb <= self.available_mb)

    @property
    def largest_term(self) -> str:
        return max(self.terms_mb, key=lambda k: self.terms_mb[k])


# On the CPU the resident set also keeps heap pages a step freed but glibc could not return (the dynamic mmap
# threshold puts tensors up to 32 MiB on the heap): measured 15 to 40% of the bytes a step allocates and frees
# (its gradients and every layer's activations, recomputed or not); the plan adds a quarter (bench/memory_plan.py).
CPU_HEAP_SLACK = 0.25


def training_peak(terms: dict[str, float], cpu: bool = False, checkpointing: bool = False) -> float:
    """The peak of a training step from its terms.

    On a GPU without activation checkpointing: everything held (runtime, weights, optimizer state, frozen models,
    caches) plus the larger of activations + logits (end of the forward) and gradients (end of the backward), as
    gradients are freed after each optimizer step and the caching allocator reuses their memory. With
    checkpointing every term adds up: the backward fills the gradients while the checkpointed layer inputs, the
    layer being recomputed and the logits' buffers are still alive (measured on an H100, torch 2.11: 12 small
    models, docs/benchmarks.md). On the CPU, where the peak is the resident set, every term adds up too (a step's
    freed gradient pages stay resident while the next forward fills its activations), with the `heap slack` term.
    """
    if cpu or checkpointing:
        return sum(terms.values())
    held = sum(v for k, v in terms.items() if k not in ("activations", "logits", "gradients"))
    return held + max(terms.get("activations", 0.0) + terms.get("logits", 0.0), terms.get("gradients", 0.0))


def heap_slack_mb(terms: dict[str, float], full_activations: float) -> float:
    """CPU only: CPU_HEAP_SLACK x (gradients + logits + the activations of every layer without checkpointing)."""
    return CPU_HEAP_SLACK * (terms.get("gradients", 0.0) + terms.get("logits", 0.0) + full_activations)


def model_entry(shape: ModelShape, role: str) -> dict[str, Any]:
    return {"role": role, "name": shape.name, "family": shape.family, "parameters": shape.parameters,
            "source": shape.source}  # fmt: skip


@dataclass
class Plan:
    """Every group of a job; `plan.json` is `as_json()`."""

    groups: list[Group]
    on_no_fit: str = "refuse"
    unknown: list[str] = field(default_factory=list)  # models the plan could not size, and why

    def as_json(self) -> dict[str, Any]:
        return {
            "groups": [
                {**asdict(g), "fits": g.fits, "largest_term": g.largest_term if g.terms_mb else None}
                for g in self.groups
            ],
            "on_no_fit": self.on_no_fit,
            "unknown": self.unknown,
        }

    def overflows(self) -> list[Group]:
        return [g for g in self.groups if not g.fits]

    def refused(self) -> list[Group]:
        """The groups that stop the job: over an enforced device, with on_no_fit refuse."""
        return [g for g in self.overflows() if g.enforced] if self.on_no_fit == "refuse" else []


def refusal(group: Group) -> str:
    """The one line a plan that cannot fit is refused with."""
    if group.shortfall:
        return (f"resource plan: {group.name} ({group.nodes}): {group.shortfall}. To fit: "
                f"{'; '.join(group.suggestions)}")  # fmt: skip
    term = group.largest_term
    return (
        f"resource plan: {group.name} ({group.nodes}) needs {group.peak_mb / 1024:.1f} GiB per device "
        f"({group.device}), "
        f"which has {(group.available_mb or 0) / 1024:.1f} GiB; the largest term is {term} "
        f"({group.terms_mb[term] / 1024:.1f} GiB). To fit: {'; '.join(group.suggestions)} "
        "(or plan.on_no_fit=warn to submit anyway)"
    )


def render(plan: Plan) -> str:
    """The table `--dry-run` prints: one row per group, GiB per device, the terms largest first."""
    if not plan.groups:
        return "\n".join(["(no model to plan for)", *(f"# not planned: {u}" for u in plan.unknown)])
    rows = [("group", "where", "per device", "peak", "available", "fits", "largest terms")]
    for g in plan.groups:
        terms = sorted(g.terms_mb.items(), key=lambda kv: -kv[1])
        shown = ", ".join(f"{k} {_gib(v)}" for k, v in terms[:4] if v >= 0.005 * 1024)
        avail = _gib(g.available_mb) if g.available_mb is not None else "unknown"
        fits = "yes" if g.available_mb is not None and g.fits else ("NO" if not g.fits else "-")
        rows.append((g.name, g.nodes, g.device, _gib(g.peak_mb), avail, fits, shown))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1] for r in rows]
    lines = [line.rstrip() for line in lines]
    for g in plan.groups:
        models = "; ".join(
            f"{m['role']} {m['name']} ({_count(m['parameters'])}, {m['source']})" for m in g.models
        )
        lines.append(f"# {g.name}: {g.parallelism}; {models}")
        lines.extend(f"#   {note}" for note in g.notes)
    lines.extend(f"# not planned: {u}" for u in plan.unknown)
    return "\n".join(lines)


def _gib(mb: float) -> str:
    return f"{mb / 1024:.2f} GiB" if mb < 10 * 1024 else f"{mb / 1024:.1f} GiB"


def _count(n: int) -> str:
    for size, unit in ((10**9, "B"), (10**6, "M"), (10**3, "K")):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)
