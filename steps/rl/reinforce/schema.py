"""Config schema of rl/reinforce: NeMo-Aligner's REINFORCE (RLOO baseline, KL to the initial policy, no
critic)."""

from typing import Literal, Self

from pydantic import Field, model_validator

from nemotron.config.offpolicy import AsyncGRPO, ImportanceSampling, check_async, check_builtin_async
from nemotron.config.stepconfig import (
    KLEstimator,
    RLConfig,
    Strict,
    kl_estimator_field,
)
from nemotron.config.workload import Workload


class Outputs(Strict):
    """Names the outputs are registered under in the artifact store."""

    policy: str = "reinforce_policy"
    """artifact name of the aligned policy"""


class Reinforce(ImportanceSampling):
    """REINFORCE with a leave-one-out (RLOO) baseline and a KL penalty to the initial policy (NeMo-Aligner:
    trainer.reinforce.*)."""

    initial_policy_kl_penalty: float = Field(0.01, ge=0)
    """beta: reward -= beta * KL(policy || initial policy) (NeMo-Aligner: initial_policy_kl_penalty; TRL RLOO:
    beta)"""
    kl_estimator: KLEstimator = kl_estimator_field("k1", "NeMo-Aligner's use_absolute_kl: true is abs")
    kl_in: Literal["reward_sequence_mean", "reward_per_token"] = "reward_sequence_mean"
    """reward_sequence_mean: subtract beta times the mean token KL of the response (NeMo-Aligner);
    reward_per_token: subtract beta times the sum of the token KLs"""
    num_rollouts_per_prompt: int = Field(4, ge=2)
    """responses per prompt (RLOO needs >= 2; NeMo-Aligner: num_rollouts_per_prompt; TRL RLOO:
    num_generations)"""
    reinforce_epochs: int = Field(1, ge=1)
    """optimisation passes over each rollout batch, one optimizer step each"""
    loss_level: Literal["token", "sequence"] = "token"
    """average the loss over all response tokens of the global batch (token), or per response first (sequence)
    (NeMo-RL: loss_fn.token_level_loss)"""
    truncated_responses: Literal["keep", "zero_reward"] = "keep"
    """responses without EOS: keep their reward, or score them 0 (they never enter baselines)"""
    async_grpo: AsyncGRPO = Field(default_factory=AsyncGRPO)
    """asynchronous rollouts, NeMo-RL's grpo.async_grpo group (rl/reinforce runs there as GRPO with RLOO)"""

    @model_validator(mode="after")
    def _async_needs_the_correction(self) -> Self:
        check_async(self.async_grpo, self, ("reinforce.async_grpo", "reinforce"))
        return self


class Config(RLConfig):
    """rl/reinforce: NeMo-Aligner's REINFORCE (RLOO baseline, KL to the initial policy, no critic)."""

    outputs: Outputs = Field(default_factory=Outputs)
    reinforce: Reinforce = Field(default_factory=Reinforce)

    @model_validator(mode="after")
    def _builtin_async(self) -> Self:
        if self.backend == "builtin":
            check_builtin_async(self.reinforce.async_grpo, self.runtime.sharding, "reinforce.async_grpo")
        return self

    def workload(self) -> Workload:
        return self.rollouts(self.reinforce.num_rollouts_per_prompt)
