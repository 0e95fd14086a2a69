"""The statistics an RL step logs: dataclasses whose field names are the metric names, and their means over
the global batch (sums all-reduced over data-parallel ranks, then divided by the global count)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

import torch

from nemotron.rl.distributed import World, all_reduce_sum
from nemotron.rl.experience import Experience
from nemotron.rl.kl import sequence_kl
from nemotron.runtime.devices import peak_memory_mb


@dataclass
class DeviceSums:
    """Running sums kept on the device, so an update loop never waits for them: a subclass's tensor fields name
    the sums."""

    @classmethod
    def zeros(cls, device: torch.device) -> Self:
        return cls(*(torch.zeros((), device=device) for _ in dataclasses.fields(cls)))


def global_means(world: World, count: torch.Tensor | int, **sums: torch.Tensor) -> dict[str, float]:
    """Each named local sum over the global batch, divided by the global ``count``, in one all-reduce.

    Args:
        world: the data-parallel ranks.
        count: this rank's share of the denominator (samples, or valid tokens), 0-dim or an int.
        sums: this rank's 0-dim sums, all of one dtype.

    Returns:
        ``{name: global sum / global count}``.
    """
    values = list(sums.values())
    local = torch.as_tensor(count, dtype=values[0].dtype, device=values[0].device)
    total = all_reduce_sum(torch.stack([*values, local.reshape(())]), world)
    denominator = float(total[-1])
    return {name: float(total[i] / denominator) for i, name in enumerate(sums)}


def global_sums(world: World, per: int | float = 1, **sums: torch.Tensor) -> dict[str, float]:
    """Each named local sum summed over ranks (one all-reduce), divided by ``per`` (e.g. the number of
    epochs).

    For quantities every rank already normalised by the global count, such as losses.
    """
    total = all_reduce_sum(torch.stack(list(sums.values())), world) / per
    return {name: float(total[i]) for i, name in enumerate(sums)}


@dataclass
class RolloutStats:
    """Means over the step's responses (every RL step logs them)."""

    rewards: float
    init_policy_kl: float
    response_lengths: float
    fraction_of_samples_properly_ended: float

    @classmethod
    def of(cls, exp: Experience, scores: torch.Tensor, kl: torch.Tensor, world: World) -> RolloutStats:
        """``scores`` (B,) the rewards the step trains on; ``kl`` (B, N) the per-token KL to the reference."""
        return cls(
            **global_means(
                world,
                len(scores),
                rewards=scores.sum(),
                init_policy_kl=sequence_kl(kl, exp.mask).sum(),
                response_lengths=exp.response_lengths.float().sum(),
                fraction_of_samples_properly_ended=exp.is_end.float().sum(),
            )
        )


@dataclass
class Timings:
    """Seconds per phase of one step, and the peak accelerator memory."""

    generate: float
    reward: float
    logprobs: float
    train: float
    step_time: float
    peak_memory_mb: float

    @classmethod
    def of(cls, exp: Experience, train_time: float, step_start: float, device: torch.device) -> Timings:
        """``step_start`` is the ``time.perf_counter()`` the step began at."""
        t = exp.timers
        return cls(
            generate=t["generate"],
            reward=t["reward"],
            logprobs=t["logprobs"],
            train=train_time,
            step_time=time.perf_counter() - step_start,
            peak_memory_mb=peak_memory_mb(device),
        )


def as_metrics(*parts: Any) -> dict[str, float]:
    """One flat ``{metric name: value}`` of statistics dataclasses and plain mappings, in the order given; a
    None value (a statistic this step did not measure, e.g. a validation score between log intervals) is left
    out."""
    out: dict[str, float] = {}
    for part in parts:
        items: Mapping[str, Any] = part if isinstance(part, Mapping) else dataclasses.asdict(part)
        out.update({name: float(value) for name, value in items.items() if value is not None})
    return out
