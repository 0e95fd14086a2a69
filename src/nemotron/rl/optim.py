"""Optimizer, learning-rate schedule and the clipped optimizer step of the RL and SFT loops."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from nemotron.config.stepconfig import Optim
from nemotron.rl.distributed import World, sync_gradients
from nemotron.rl.sharding import grad_norm_value, is_sharded
from nemotron.runtime.faults import inject


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: Optim) -> torch.optim.AdamW:
    """AdamW, with PyTorch's fused kernel on CPU and CUDA (as transformers' Trainer defaults to).

    On the tiny policy (28 tensors, 0.13M parameters, one thread) a fused step takes 0.22 ms against 0.83 ms
    for the default per-tensor loop; the update is the same AdamW up to float rounding.
    """
    params = list(params)
    fused = all(p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point for p in params)
    return torch.optim.AdamW(
        params,
        lr=cfg.lr,
        betas=(cfg.adam_beta1, cfg.adam_beta2),
        weight_decay=cfg.weight_decay,
        fused=fused or None,
    )


def lr_at(step: int, cfg: Optim, total_steps: int = 0) -> float:
    """Linear warm-up over `warmup_steps` (step counts from 1), then a linear decay to `lr * min_lr_ratio` at
    `total_steps`. A pure function of the step, so resuming needs no scheduler state."""
    warm = min(1.0, step / cfg.warmup_steps) if cfg.warmup_steps > 0 else 1.0
    decay = 1.0
    if total_steps > 0 and cfg.min_lr_ratio < 1.0:
        decay = max(cfg.min_lr_ratio, 1.0 - (1.0 - cfg.min_lr_ratio) * step / total_steps)
    return cfg.lr * warm * decay


def optimizer_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    step: int,
    cfg: Optim,
    world: World,
    total_steps: int = 0,
) -> tuple[float, float]:
    """Sum gradients over ranks (DDP; FSDP did in the backward), clip the global norm, step. Returns
    (grad_norm before clipping, lr)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not is_sharded(model):  # FSDP reduce-scatters (sums) the gradients in the backward pass
        sync_gradients(params, world)
    grad_norm = grad_norm_value(torch.nn.utils.clip_grad_norm_(params, cfg.clip_grad))
    lr = lr_at(step, cfg, total_steps)
    inject("optimizer", step)
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, lr
