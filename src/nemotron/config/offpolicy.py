"""Config groups of asynchronous RL: the overlap of generation and training (NeMo-RL v0.7.0's
`grpo.async_grpo`) and the importance-sampling correction of the lag it brings (its `loss_fn` keys). Plain
pydantic, no torch: schemas load on the CLI's start-up path."""

from typing import Literal, Self

from pydantic import BaseModel, Field, model_validator

from nemotron.config.stepconfig import Strict

TruncatedIS = Literal["tis", "icepop", "seq-mask-tis"]


class AsyncGRPO(Strict):
    """Asynchronous RL: the generator runs in its own process and samples the next steps' rollouts while the
    trainer trains (NeMo-RL: grpo.async_grpo.*; docs/rl-engine.md, "Asynchronous RL")."""

    enabled: bool = False
    """generate the rollouts of step k+1 in a separate process while the trainer trains on step k; weights go
    to the generator after every update (needs the importance-sampling correction on, as NeMo-RL requires)"""
    max_trajectory_age_steps: int = Field(1, ge=0)
    """how many policy updates a trained sample may lag behind: step k trains on rollouts of the policy after
    update k-1-this (0: the synchronous run, bit for bit)"""
    in_flight_weight_updates: bool = False
    """swap the generator's weights in the middle of a batch of generations (NeMo-RL, vLLM async engine); the
    built-in engine swaps them between batches and refuses true"""

    @model_validator(mode="after")
    def _keys_act_when_enabled(self) -> Self:
        if not self.enabled and (self.max_trajectory_age_steps != 1 or self.in_flight_weight_updates):
            raise ValueError(
                "max_trajectory_age_steps and in_flight_weight_updates act only with enabled=true"
            )
        return self


class ImportanceSampling(Strict):
    """The off-policy correction (NeMo-RL v0.7.0: loss_fn.use_importance_sampling_correction and the
    truncated_importance_sampling_* keys): each token's loss is weighted by pi_trainer / pi_generator, the
    trainer's probability of the token before this step's update over the generating engine's."""

    use_importance_sampling_correction: bool = False
    """weight each token's policy loss by exp(logp_trainer - logp_generator): corrects for samples from an
    older policy (asynchronous RL) or another engine (vLLM); 1 exactly when they agree"""
    truncated_importance_sampling_type: TruncatedIS | None = None
    """tis: clamp the weights to [ratio_min (default 0), ratio]; icepop: zero the tokens whose weight is
    outside [ratio_min, ratio]; seq-mask-tis: zero whole responses whose geometric-mean weight is outside
    [ratio_min, ratio] and keep the raw token weights of the rest (null: untruncated)"""
    truncated_importance_sampling_ratio: float | None = Field(None, gt=0)
    """the upper bound of the truncation (needs a truncated_importance_sampling_type)"""
    truncated_importance_sampling_ratio_min: float | None = Field(None, ge=0)
    """the lower bound of the truncation (tis: default 0; icepop and seq-mask-tis need it)"""

    @model_validator(mode="after")
    def _truncation_is_whole(self) -> Self:
        """NeMo-RL v0.7.0's ClippedPGLossFn asserts these at start-up; here they are config errors."""
        kind, high, low = (
            self.truncated_importance_sampling_type,
            self.truncated_importance_sampling_ratio,
            self.truncated_importance_sampling_ratio_min,
        )
        if kind is None:
            if high is not None or low is not None:
                raise ValueError(
                    "truncated_importance_sampling_ratio(_min) act only with a truncated_importance_sampling_type"
                )
            return self
        if not self.use_importance_sampling_correction:
            raise ValueError(
                "truncated_importance_sampling_type needs use_importance_sampling_correction=true"
            )
        if high is None:
            raise ValueError(
                f"truncated_importance_sampling_type={kind} needs truncated_importance_sampling_ratio"
            )
        if low is None and kind != "tis":
            raise ValueError(
                f"truncated_importance_sampling_type={kind} needs truncated_importance_sampling_ratio_min"
            )
        if low is not None and low > high:
            raise ValueError(
                "truncated_importance_sampling_ratio_min must be <= truncated_importance_sampling_ratio"
            )
        return self


def check_async(asynchronous: AsyncGRPO, correction: ImportanceSampling, where: tuple[str, str]) -> None:
    """NeMo-RL v0.7.0's async_grpo_train asserts the correction is on; `where` is the dotted paths of the two
    groups."""
    if asynchronous.enabled and not correction.use_importance_sampling_correction:
        raise ValueError(
            f"{where[0]}.enabled needs {where[1]}.use_importance_sampling_correction=true: its samples come from "
            "an older policy (NeMo-RL requires it too)"
        )


def check_builtin_async(asynchronous: AsyncGRPO, sharding: str, where: str) -> None:
    """What the built-in engine's asynchronous loop cannot do, refused when the config is compiled (a step's
    schema calls it when its backend is the built-in one); `where` is the group's dotted path."""
    if not asynchronous.enabled:
        return
    if asynchronous.in_flight_weight_updates:
        raise ValueError(
            f"{where}.in_flight_weight_updates=true: the built-in generator takes new weights between batches "
            "only; set it false (or backend=nemo_rl)"
        )
    if sharding != "ddp":
        raise ValueError(
            f"{where}.enabled=true with runtime.sharding={sharding}: the built-in generator process loads the "
            "whole policy, which FSDP shards over the ranks; use runtime.sharding=ddp"
        )


# The keys of each group, for an engine that refuses them all (a key it cannot express is exit 2, naming it).
ASYNC_KEYS = tuple(f"async_grpo.{name}" for name in AsyncGRPO.model_fields)
CORRECTION_KEYS = tuple(ImportanceSampling.model_fields)


def refusing(prefix: str, keys: tuple[str, ...], why: str) -> tuple[tuple[str, str], ...]:
    """(dotted key, why) pairs for `Refusals.all_unless_default`, each key under `prefix` (a section and a dot)."""
    return tuple((prefix + key, why) for key in keys)


def async_group(config: BaseModel) -> AsyncGRPO | None:
    """A step config's asynchronous-RL group, wherever its schema keeps it (at the top or one group deep, as
    grpo.async_grpo or reinforce.async_grpo): found by its type, so the plan and the engines serve any step."""
    found = located_async_group(config)
    return None if found is None else found[1]


def located_async_group(config: BaseModel) -> tuple[str, AsyncGRPO] | None:
    """`async_group` with its dotted key in the config (grpo.async_grpo), for a message that names its keys."""
    for name in type(config).model_fields:
        group = getattr(config, name)
        if isinstance(group, AsyncGRPO):
            return name, group
        if isinstance(group, BaseModel):
            found = next(((f"{name}.{n}", v) for n in type(group).model_fields
                          if isinstance(v := getattr(group, n), AsyncGRPO)), None)  # fmt: skip
            if found is not None:
                return found
    return None
