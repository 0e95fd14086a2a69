"""What a step's config says about the work of one step, as the resource plan reads it: a step's schema gives it
through `Config.workload()`, so the plan sizes any step (a user's too) without knowing its config's layout."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from nemotron.config.configtree import get_dotted

if TYPE_CHECKING:
    from nemotron.catalog import Model


class Training(NamedTuple):
    """One trained model over batches of records (sft, rm/train)."""

    batch_key: str  # the config key of the global batch, named by the plan's suggestions
    global_batch: int  # records per optimizer step, over all ranks
    max_length: int  # tokens per row
    rows_per_record: int = (
        1  # rows one record becomes in a forward pass (2: a preference pair's two responses)
    )
    # records per forward/backward pass on one device, gradients accumulating over the rank's share (rl/dpo's
    # trainer.micro_batch_size; batch_key then names it); 0: the engine's own (the built-in engine: the rank's whole
    # share in one pass, as sft and rm/train do; NeMo-RL's and NeMo-Aligner's supervised bases: 1)
    micro_batch: int = 0


class Serving(NamedTuple):
    """A frozen model behind a server (rm/serve)."""

    batch_key: str  # the config key of the largest batch one forward pass scores
    batch: int
    max_length: int  # tokens per scored sequence


class Rollouts(NamedTuple):
    """An RL step: a policy generates responses, a scorer scores them, the policy trains on them."""

    micro_batch_key: str  # the config key a suggestion to lower the micro-batch names
    micro_batch: int  # responses per forward/backward pass
    prompts_key: str  # the config key of the prompts a step, which the ranks share
    prompts: int  # prompts per step, over all ranks
    responses: int  # responses per step, over all ranks
    max_new_tokens: int
    vllm_share: float | None  # generation on vLLM: its share of the device memory; None: our sampler
    # the config key and size of the batch each update trains on where the step sets one; None: a step's responses
    global_batch: tuple[str, int] | None = None


Workload = Training | Serving | Rollouts


class DeclaresWorkload(Protocol):
    """A step Config the resource plan can size."""

    def workload(self) -> Workload: ...


class JobModel(NamedTuple):
    """A model a compiled job runs, as its manifest's [[models]] entry declares it under the job's config."""

    role: str  # policy, reward_model, judge or critic
    input: str  # the [[consumes]] input it loads
    ref: str | None  # that input's resolved path or Hugging Face id; None: unset
    trained: bool
    reference: bool  # a frozen copy is kept as the reference policy
    served: bool  # by a server beside the trainer, not in the trainer's process
    built_from: str  # config key of the architecture it is built from when `ref` is unset


def holds(conditions: Mapping[str, Any], config: Mapping[str, Any]) -> bool:
    """Whether every `key = value` of a manifest's condition table holds in `config` (dotted keys)."""
    return all(get_dotted(config, key) == value for key, value in conditions.items())


def job_models(
    declared: Sequence[Model], input_keys: Mapping[str, str], config: Mapping[str, Any]
) -> tuple[JobModel, ...]:
    """The models a job runs: the declared ones whose `when` holds in its resolved `config` (inputs already
    paths), each with the reference its input's config key (`input_keys`: input name -> key) holds."""
    return tuple(
        JobModel(
            m.role,
            m.input,
            ref if isinstance(ref := get_dotted(config, input_keys[m.input]), str) and ref else None,
            m.trained,
            m.reference,
            m.served or (bool(m.served_when) and holds(m.served_when, config)),
            m.built_from,
        )
        for m in declared
        if holds(m.when, config)
    )
