"""Where the built-in engine's tensors live and in which precision: `runtime.device` and `runtime.precision`.

`choose_device` is a pure function of what was asked and what the machine has, so the rules are unit-tested on a
CPU-only machine: `auto` is CUDA when present, each torchrun rank takes `cuda:LOCAL_RANK`, and `cuda` without a
GPU is a usage error (exit 2) before any work. Process groups use NCCL only with CUDA tensors, gloo otherwise.

Precision: `fp32`; `bf16` (weights, gradients and optimizer state in bfloat16); `bf16-mixed` (fp32 master weights
and optimizer, forwards under bfloat16 autocast). Logprobs for the loss and the KL are computed in fp32 in every
mode (`rl/logprobs.py` upcasts the logits).
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, TypeVar

import torch

from nemotron.errors import UserError

Precision = Literal["fp32", "bf16", "bf16-mixed"]
ModuleT = TypeVar("ModuleT", bound=torch.nn.Module)


def choose_device(requested: str, cuda_devices: int, local_rank: int = 0) -> str:
    """The device string for this process: "cpu" or "cuda:N".

    Args:
        requested: `runtime.device`: "auto", "cpu" or "cuda".
        cuda_devices: how many CUDA devices this process sees (`torch.cuda.device_count()`).
        local_rank: this process's rank on its node (torchrun's LOCAL_RANK; 0 when not distributed).
    """
    if requested not in ("auto", "cpu", "cuda"):
        raise UserError(f"runtime.device={requested!r}: expected auto, cpu or cuda")
    if requested == "cpu" or (requested == "auto" and cuda_devices == 0):
        return "cpu"
    if cuda_devices == 0:
        raise UserError(
            "runtime.device=cuda, but this machine has no CUDA device "
            f"(torch {torch.__version__} sees none): use runtime.device=auto or cpu, or run on a GPU node"
        )
    if local_rank >= cuda_devices:
        raise UserError(
            f"runtime.device={requested}: local rank {local_rank} has no GPU of its own ({cuda_devices} visible); "
            "start at most one process per GPU (the profile's ntasks_per_node or gpus_per_node)"
        )
    return f"cuda:{local_rank}"


def process_group_backend(device: torch.device) -> str:
    """NCCL for CUDA tensors, gloo for CPU tensors (NCCL cannot reduce CPU tensors)."""
    return "nccl" if device.type == "cuda" else "gloo"


def runtime_device(requested: str) -> torch.device:
    """`choose_device` for this process; on CUDA it also makes that GPU the current one."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    count = torch.cuda.device_count() if requested != "cpu" else 0
    device = torch.device(choose_device(requested, count, local_rank))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def model_dtype(precision: str) -> torch.dtype:
    """The dtype weights are stored in: bfloat16 for `bf16`, float32 otherwise (`bf16-mixed` keeps fp32 masters)."""
    if precision not in ("fp32", "bf16", "bf16-mixed"):
        raise UserError(f"runtime.precision={precision!r}: expected fp32, bf16 or bf16-mixed")
    return torch.bfloat16 if precision == "bf16" else torch.float32


@contextlib.contextmanager
def autocast(device: torch.device, precision: str) -> Iterator[None]:
    """bfloat16 autocast around forwards under `bf16-mixed`; nothing otherwise."""
    if precision == "bf16-mixed":
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            yield
    else:
        yield


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory so far, in MiB: CUDA max allocated on a GPU, the process's peak resident set size on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        # Linux's ru_maxrss carries the peak of the process that forked this one across exec (a step started by
        # a large parent would report the parent's memory); VmHWM is this program's own peak.
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**10  # kB (KiB)
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


@dataclass(frozen=True)
class DevicePlan:
    """Where and how a step's models run, from its `runtime` group."""

    device: torch.device
    precision: str = "fp32"
    gradient_checkpointing: bool = False
    sharding: str = "ddp"  # ddp: whole models on every rank; fsdp: trained models sharded (rl/sharding.py)
    fsdp_cpu_offload: bool = False

    @property
    def dtype(self) -> torch.dtype:
        return model_dtype(self.precision)

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        return autocast(self.device, self.precision)

    def generator(self, seed: int) -> torch.Generator:
        """A random stream on the device (the sampler draws its uniforms there)."""
        return torch.Generator(device=self.device).manual_seed(seed)

    def tensor(self, data: object, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.tensor(data, dtype=dtype, device=self.device)

    def prepare(self, model: ModuleT, *, trainable: bool = True) -> ModuleT:
        """Move `model` to the device and weight dtype; gradient checkpointing on trained transformers models, and
        under `sharding=fsdp` FSDP2 over the ranks (after the process group is up: `distributed.start`)."""
        model.to(device=self.device, dtype=self.dtype)
        if trainable and self.gradient_checkpointing:
            # transformers 5 renamed gradient_checkpointing_enable (deprecated) to activation_checkpointing_enable;
            # a wrapper (a reward model's SequenceRewards) holds its transformers model as `.model`.
            inner = (
                model if hasattr(model, "activation_checkpointing_enable") else getattr(model, "model", model)
            )
            enable = getattr(inner, "activation_checkpointing_enable", None)
            if enable is None:
                raise UserError(f"runtime.gradient_checkpointing: {type(model).__name__} does not support it")
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        if trainable and self.sharding == "fsdp":
            from nemotron.rl.sharding import shard_model  # torch.distributed.fsdp only where it acts

            shard_model(model, self.precision, self.fsdp_cpu_offload, self.device)
        return model


def placement(runtime: object) -> DevicePlan:
    """The DevicePlan of a step's `runtime` config group (device chosen now: exit 2 for cuda without a GPU)."""
    device = runtime_device(str(getattr(runtime, "device", "auto")))
    return DevicePlan(
        device=device,
        precision=str(getattr(runtime, "precision", "fp32")),
        gradient_checkpointing=bool(getattr(runtime, "gradient_checkpointing", False)),
        sharding=str(getattr(runtime, "sharding", "ddp")),
        fsdp_cpu_offload=bool(getattr(runtime, "fsdp_cpu_offload", False)),
    )
