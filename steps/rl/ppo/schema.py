"""Config schema of rl/ppo: NeMo-Aligner's PPO (actor + critic initialised from the reward model, GAE,
clipping)."""

from typing import Literal

from pydantic import Field

from nemotron.config.stepconfig import (
    KLEstimator,
    Optim,
    RLConfig,
    Strict,
    kl_estimator_field,
)
from nemotron.config.workload import Workload


class Outputs(Strict):
    """Names the outputs are registered under in the artifact store."""

    policy: str = "ppo_policy"
    """artifact name of the aligned policy"""
    critic: str = "ppo_critic"
    """artifact name of the trained critic"""


class PPO(Strict):
    """PPO with GAE over per-token rewards (NeMo-Aligner: trainer.ppo.* and model.ppo.*; "TRL PPO" names the
    keys of TRL's PPOConfig, in trl.experimental.ppo at TRL 1.9 and since removed)."""

    num_rollouts_per_prompt: int = Field(1, ge=1)
    """responses sampled per prompt (NeMo-RL: ppo.num_generations_per_prompt)"""
    discount_factor: float = Field(1.0, ge=0, le=1)
    """GAE gamma (NeMo-Aligner: trainer.ppo.discount_factor; TRL PPO: gamma)"""
    gae_lambda: float = Field(0.95, ge=0, le=1)
    """GAE lambda: 1 = Monte-Carlo returns, 0 = one-step TD (NeMo-Aligner: gae_lambda; TRL PPO: lam)"""
    ratio_eps: float = Field(0.2, gt=0)
    """clip the probability ratio to [1-eps, 1+eps] (NeMo-Aligner: model.ppo.ratio_eps; TRL PPO: cliprange)"""
    dual_clip: float | None = Field(None, gt=1)
    """dual-clip constant c: for negative advantages the per-token loss is capped at c*|A| (off when null;
    NeMo-RL: loss_fn.ratio_clip_c)"""
    entropy_bonus: float = Field(0.0, ge=0)
    """subtract this times the mean token entropy from the actor loss (NeMo-Aligner: model.ppo.entropy_bonus)
    """
    initial_policy_kl_penalty: float = Field(0.02, ge=0)
    """beta of the per-token KL penalty to the initial policy, subtracted from each token's reward
    (NeMo-Aligner: initial_policy_kl_penalty; TRL PPO: kl_coef)"""
    kl_estimator: KLEstimator = kl_estimator_field("k1", "NeMo-Aligner's use_absolute_kl: true is abs")
    ppo_epochs: int = Field(1, ge=1)
    """optimisation passes over each rollout batch, one optimizer step each"""
    critic_warmup_steps: int = Field(0, ge=0)
    """first N steps train only the critic (NeMo-RL: ppo.policy_training_start_step)"""
    whiten_advantages: bool = True
    """normalise advantages to mean 0, std 1 over the global batch (NeMo-Aligner: normalize_advantages)"""
    loss_level: Literal["token", "sequence"] = "token"
    """average the losses over all response tokens of the global batch (token), or per response first
    (sequence) (NeMo-RL: loss_fn.token_level_loss)"""


class Critic(Strict):
    """The value model, initialised from the reward model and trained in the actor's process."""

    loss_clip_val: float = Field(0.2, gt=0)
    """clip the new value to old value +- this in the value loss (NeMo-Aligner critic: model.loss_clip_val;
    TRL PPO: cliprange_value)"""
    optim: Optim = Optim(lr=5e-5)
    """the critic's optimizer"""


class Config(RLConfig):
    """rl/ppo: NeMo-Aligner's PPO (actor, critic from the reward model, GAE, clipped losses)."""

    outputs: Outputs = Field(default_factory=Outputs)
    ppo: PPO = Field(default_factory=PPO)
    critic: Critic = Field(default_factory=Critic)

    def workload(self) -> Workload:
        return self.rollouts(self.ppo.num_rollouts_per_prompt)
