"""`runtime.sharding=fsdp`: FSDP2 (`torch.distributed.fsdp.fully_shard`) for the built-in engine's trained models.

Each decoder layer (the classes a transformers model names in `_no_split_modules`) is one shard group, then the
root, so a rank holds 1/N of the weights, gradients and AdamW state and gathers one layer at a time. Gradients are
SUMMED over ranks (divide factor 1), as `distributed.sync_gradients` does under DDP: the losses are already
divided by the global normaliser, so the update is the one of DDP, up to the order of float additions.

Forward passes outside training (rollouts, evaluation on the main rank) run inside `full_weights`: every rank
gathers the whole model once, so ranks may then make different numbers of forward passes without a collective
waiting on a rank that stopped early. The final checkpoint is gathered (`full_state_dict`, rank 0), the resume state
is sharded (`torch.distributed.checkpoint`, every rank writes its own shard).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from nemotron.errors import UserError

log = logging.getLogger("nemotron")

SHARDED_STATE = "sharded"  # the torch.distributed.checkpoint folder inside a training checkpoint


def fsdp_modules(model: torch.nn.Module) -> list[FSDPModule]:
    """The FSDP units of `model` (its layers and its root), empty for a model that is not sharded."""
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_sharded(model: torch.nn.Module) -> bool:
    return bool(fsdp_modules(model))


def mixed_precision(precision: str) -> MixedPrecisionPolicy:
    """`runtime.precision` as FSDP's policy: bf16-mixed gathers bfloat16 copies of the fp32 shards for the
    forward and backward and reduces gradients in fp32; fp32 and bf16 compute in the dtype the weights have."""
    if precision == "bf16-mixed":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def shard_model(model: torch.nn.Module, precision: str, cpu_offload: bool, device: torch.device) -> None:
    """FSDP2 over the default process group: every decoder layer, then the root (in place).

    Joins a one-rank process group when the step runs as one process, so `sharding=fsdp` runs the same code on
    one rank as on many. CPU offload keeps the shards and AdamW state in host memory between uses (pinned, for fast
    copies to the GPU); compile refuses it where the job has no GPU, but on the CPU it still runs, as the same
    computation (tests/rl/test_sharding.py checks it there on two gloo ranks).
    """
    if not dist.is_initialized():
        store = dist.HashStore()  # type: ignore[attr-defined]  # exported only where distributed is built in
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    # transformers names its decoder layer classes in _no_split_modules (a wrapper's inner model does)
    named = (getattr(m, "_no_split_modules", None) for m in model.modules())
    layer_classes = set(next((n for n in named if n), ()))
    if not layer_classes:
        raise UserError(
            f"runtime.sharding=fsdp: {type(model).__name__} names no decoder layer class (_no_split_modules) "
            "to shard by; use runtime.sharding=ddp"
        )
    options: dict[str, Any] = {"mp_policy": mixed_precision(precision)}
    if cpu_offload:  # pinned host memory needs an accelerator
        options["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")
    layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
    for layer in layers:
        fully_shard(layer, **options)
    fully_shard(model, **options)
    log.info(
        "FSDP2 over %d rank(s): %d %s layers and the root sharded, compute in %s%s",
        dist.get_world_size(),
        len(layers),
        "/".join(sorted(layer_classes)),
        "bf16" if precision != "fp32" else "fp32",
        ", shards and optimizer state offloaded to host memory" if cpu_offload else "",
    )
    for unit in fsdp_modules(model):
        unit.set_gradient_divide_factor(1.0)  # a sum over ranks, as under DDP
        unit.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM


def grad_norm_value(norm: torch.Tensor) -> float:
    """`clip_grad_norm_`'s total norm as a number (a DTensor under FSDP: its full value)."""
    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)


@contextlib.contextmanager
def full_weights(model: torch.nn.Module) -> Iterator[None]:
    """Every rank holds the whole of a sharded `model` inside (one all-gather per layer on entry), so forward passes
    need no collective: ranks may then run different numbers of them (sampling that stops early, evaluation on the
    main rank). Every rank must enter. Nothing happens for a model that is not sharded."""
    units = fsdp_modules(model)
    if not units:
        yield
        return
    for unit in units:
        unit.set_reshard_after_forward(False)
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(True)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """A sharded model's whole weights on the CPU, on rank 0 (a collective: every rank calls it); None on the other
    ranks, and for a model that is not sharded (its own state dict is whole: save it as it is)."""
    if not is_sharded(model):
        return None
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() != 0:
        return None
    # A tied weight (GPT-2's lm_head is its token embedding) comes back as two copies; transformers drops the tie
    # only when both names share storage, so keep the first name, as an unsharded model's checkpoint does.
    first: dict[int, str] = {}
    tied = [n for n, p in model.named_parameters(remove_duplicate=False) if first.setdefault(id(p), n) != n]
    return {k: cast(torch.Tensor, v) for k, v in state.items() if k not in tied}


def save_sharded(
    path: Path, modules: dict[str, torch.nn.Module], optimizers: dict[str, torch.optim.Optimizer]
) -> None:
    """Every sharded module and its optimizer into `path` (torch.distributed.checkpoint: each rank its shard,
    rank 0 the metadata). A collective."""
    dcp_save(_state(modules, optimizers), checkpoint_id=str(path))


def load_sharded(
    path: Path, modules: dict[str, torch.nn.Module], optimizers: dict[str, torch.optim.Optimizer]
) -> None:
    """Restore what `save_sharded` wrote into the same modules and optimizers (same ranks). A collective."""
    if not (path / ".metadata").is_file():
        raise UserError(
            f"{path.parent} holds no sharded state ({SHARDED_STATE}/): it was written under runtime.sharding=ddp; "
            "resume it with the sharding it was written with"
        )
    state = _state(modules, optimizers)
    dcp_load(state, checkpoint_id=str(path))
    for name, module in modules.items():
        set_state_dict(
            module,
            [optimizers[name]] if name in optimizers else [],
            model_state_dict=state[f"model.{name}"],
            optim_state_dict=state.get(f"optim.{name}", {}),
        )


def _state(
    modules: dict[str, torch.nn.Module], optimizers: dict[str, torch.optim.Optimizer]
) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for name, module in modules.items():
        opts = [optimizers[name]] if name in optimizers else []
        weights, optim = get_state_dict(module, opts)
        state[f"model.{name}"] = weights
        if opts:
            state[f"optim.{name}"] = optim
    return state
