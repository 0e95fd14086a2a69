"""The batch rule NeMo-RL v0.7.0 asserts when a policy trains, checked at compile for every recipe that trains one.

Each training batch is sharded over the policy's data-parallel ranks (models/policy/lm_policy.py _shard_for_train ->
distributed/batched_data_dict.py shard_by_batch_size, which asserts `batch_size % shards == 0`, and that the batch
divides what it is given), then each rank trains on whole micro-batches and leaves out the rest (the workers'
`data.size // mbs` micro-batches: a rank given fewer rows than one micro-batch trains on none). A job that breaks it
queues, brings Ray up and fails at its first step, or trains on less than its batch says: here it is refused,
naming the key and the multiple."""

from __future__ import annotations

from math import gcd

from nemotron.config.stepconfig import NemoRL, NemoRLTraining
from nemotron.config.workload import Rollouts
from nemotron.engines.refusals import Refusals


def model_parallel_size(nemo: NemoRL | NemoRLTraining) -> int:
    """The GPUs one replica of the policy spans in NeMo-RL: TP x CP (x PP on Megatron; DTensor takes no PP)."""
    pp = nemo.pipeline_parallel_size if nemo.policy_backend == "megatron" else 1
    return nemo.tensor_parallel_size * nemo.context_parallel_size * pp


def data_parallel_ranks(nemo: NemoRL | NemoRLTraining, training_gpus: int) -> int:
    """The policy's data-parallel ranks in NeMo-RL: the GPUs it trains on over `model_parallel_size`; 0 on a
    profile without GPUs (a CPU Ray cluster), which has none to count."""
    return training_gpus // model_parallel_size(nemo)


def refuse_uneven_batches(
    refuse: Refusals, ranks: int, batch: tuple[str, int], micro: tuple[str, int], what: str, where: str
) -> None:
    """Refuse a global batch (`batch`: the key that sets it, its size) of `what` that is not a multiple of `ranks` x
    the micro-batch (`micro`: its key, or "" for a base's own, and its size); `where` says who asserts it."""
    (key, size), (micro_key, micro_size) = batch, micro
    whole = ranks * micro_size
    if ranks >= 1 and size % whole:
        per_rank = f"{ranks} x {micro_key} {micro_size} = {whole}" if micro_size > 1 else f"{ranks}"
        refuse(
            key,
            f"NeMo-RL splits each batch of {what} evenly over its {ranks} data-parallel ranks, whole micro-batches "
            f"on each ({where}): a multiple of {per_rank}",
        )


def whole_batches(
    refuse: Refusals, nemo: NemoRL, training_gpus: int, rollouts: tuple[str, int, str, int],
    batch: tuple[str, int] | None, micro: tuple[str, int],
) -> None:  # fmt: skip
    """A step's responses (`rollouts`: the prompts' key and count, the group's key and size) trained in whole global
    batches (`batch`: its key and size; None: all of a step's, one update), each split evenly over the policy's
    data-parallel ranks in whole micro-batches."""
    prompts_key, prompts, group_key, group = rollouts
    responses = prompts * group
    what = f"responses ({prompts_key} {prompts} x {group_key} {group} = {responses})"
    if batch is not None and responses % batch[1]:
        refuse(batch[0], f"NeMo-RL trains the {what} of a step in whole global batches (shard_by_batch_size "
                         f"asserts it): a divisor of {responses}")  # fmt: skip
        return
    ranks = data_parallel_ranks(nemo, training_gpus)
    refuse_uneven_batches(
        refuse, ranks, batch or (prompts_key, responses), micro, what, "shard_by_batch_size asserts it"
    )


def even_batches(ranks: int, rollouts: Rollouts) -> list[str]:
    """The `KEY=VALUE` overrides that let a step's responses pass `whole_batches` over `ranks` data-parallel ranks:
    the prompts a step nearest the job's whose responses fill whole micro-batches on every rank, then, where the job
    sets a global batch that does not split them so, the nearest one that does; none when the job's already pass."""
    if ranks < 1 or rollouts.prompts < 1:
        return []
    group, whole = rollouts.responses // rollouts.prompts, ranks * rollouts.micro_batch
    step = whole // gcd(group, whole)  # the prompts whose responses are a multiple of `whole`
    below = rollouts.prompts // step * step
    prompts = below if below and rollouts.prompts - below <= step // 2 else below + step
    overrides = [] if prompts == rollouts.prompts else [f"{rollouts.prompts_key}={prompts}"]
    if rollouts.global_batch is not None:
        key, size = rollouts.global_batch
        responses = prompts * group
        if responses % size or size % whole:  # the multiples of `whole` that divide a step's responses
            fits = [k * whole for k in range(1, responses // whole + 1) if responses % (k * whole) == 0]
            overrides.append(f"{key}={min(fits, key=lambda b: (abs(b - size), b))}")
    return overrides
