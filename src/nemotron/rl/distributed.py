"""Data parallelism for the built-in engine: torchrun + gloo on CPU (NCCL on GPUs), gradients averaged by hand.

The models stay plain Hugging Face modules (no DDP wrapper), so checkpoints are the same with 1 or N ranks.
Every rank owns whole prompt groups, so group baselines (RLOO, GRPO) never need another rank's rewards.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import torch
import torch.distributed as dist

from nemotron.runtime.devices import DevicePlan, placement, process_group_backend

if TYPE_CHECKING:
    from nemotron.config.stepconfig import Runtime

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_world(device: torch.device | None = None) -> World:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1); a single process otherwise.

    The backend follows where the tensors live (`devices.process_group_backend`): NCCL for CUDA tensors, gloo for
    CPU tensors, whatever the machine has.
    """
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return World()
    if not dist.is_initialized():
        device = device or torch.device("cpu")
        dist.init_process_group(
            backend=process_group_backend(device), device_id=device if device.type == "cuda" else None
        )
    return World(rank=dist.get_rank(), size=dist.get_world_size())


def shard(items: Sequence[T], world: World) -> list[T]:
    """This rank's contiguous slice of a global batch (sizes differ by at most one)."""
    per, extra = divmod(len(items), world.size)
    start = world.rank * per + min(world.rank, extra)
    return list(items[start : start + per + (1 if world.rank < extra else 0)])


def all_reduce_sum(t: torch.Tensor, world: World) -> torch.Tensor:
    """Sum over ranks (returns a new tensor; identity on one rank)."""
    out = t.detach().clone()
    if world.size > 1:
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def global_whiten(values: torch.Tensor, mask: torch.Tensor, world: World, eps: float = 1e-8) -> torch.Tensor:
    """``masks.whiten`` over the GLOBAL batch: the masked moments are summed across ranks first.

    Args:
        values: shape ``(B, T)``; mask: bool, the same shape.
        world: the data-parallel ranks; on one rank this equals ``masks.whiten(values, mask)``.
        eps: added to the (unbiased) variance before the square root.

    Returns:
        Same shape as ``values``, masked-out entries 0.
    """
    m = mask.float()
    s = all_reduce_sum(torch.stack([(values * m).sum(), (values.square() * m).sum(), m.sum()]), world)
    count = s[2]
    mean = s[0] / count.clamp(min=1)
    var = (s[1] / count.clamp(min=1) - mean.square()).clamp(min=0) * count / (count - 1).clamp(min=1)
    return torch.where(mask, (values - mean) * torch.rsqrt(var + eps), torch.zeros_like(values))


def sync_gradients(parameters: Iterable[torch.nn.Parameter], world: World) -> None:
    """Sum gradients over ranks. Losses are already divided by the GLOBAL normaliser, so a sum is the
    gradient of the global-batch loss, the same as one rank computing everything."""
    if world.size == 1:
        return
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset : offset + n].view_as(g))
        offset += n


def gather_on_main(item: T, world: World) -> list[T]:
    """Every rank's `item` on rank 0, in rank order (pickled; small things only); [] on the other ranks, [item]
    on one rank."""
    if world.size == 1:
        return [item]
    out: list[T | None] | None = [None] * world.size if world.is_main else None
    dist.gather_object(item, out, dst=0)
    return [x for x in out if x is not None] if out is not None else []


def barrier(world: World) -> None:
    if world.size > 1:
        dist.barrier()


def close(world: World) -> None:
    if world.size > 1 and dist.is_initialized():
        dist.destroy_process_group()


def start(runtime: Runtime) -> tuple[DevicePlan, World]:
    """A training step's first lines: the device (exit 2 for runtime.device=cuda without a GPU, before any work),
    the process group on it, CPU threads, and the seeds of torch and `random`."""
    plan = placement(runtime)
    world = init_world(plan.device)
    torch.set_num_threads(runtime.num_threads)
    torch.manual_seed(runtime.seed)
    random.seed(runtime.seed)
    return plan, world
