"""Config schema of rl/ppo: NeMo-Aligner's PPO (actor + critic initialised from the reward model, GAE, clipping)."""

from typing import Literal

from pydantic import Field

from nemotron.stepconfig import (
    Checkpointing,
    Evaluation,
    Generation,
    NemoRL,
    Optim,
    RewardServer,
    Runtime,
    Strict,
)


class Inputs(Strict):
    prompts: str | None = Field(None, description="prompt JSONL: artifact ref or path")
    policy: str | None = Field(None, description="the SFT policy (checkpoint_hf) to align")
    reward_model: str | None = Field(None, description="the reward model (reward_model_hf): served for rewards, and the critic's init")


class Outputs(Strict):
    policy: str = Field("ppo_policy", description="artifact name of the aligned policy")
    critic: str = Field("ppo_critic", description="artifact name of the trained critic")


class Trainer(Strict):
    max_steps: int = Field(100, ge=1)
    num_prompts_per_step: int = Field(16, ge=1, description="prompts per step (global batch)")
    micro_batch_size: int = Field(16, ge=1)
    log_interval: int = Field(1, ge=1)


class PPO(Strict):
    num_rollouts_per_prompt: int = Field(1, ge=1)
    discount_factor: float = Field(1.0, ge=0, le=1, description="gamma")
    gae_lambda: float = Field(0.95, ge=0, le=1)
    ratio_eps: float = Field(0.2, gt=0, description="clip the ratio to [1-eps, 1+eps]")
    dual_clip: float | None = Field(None, gt=1, description="dual-clip constant c for negative advantages (off when null)")
    entropy_bonus: float = Field(0.0, ge=0)
    initial_policy_kl_penalty: float = Field(0.02, ge=0, description="per-token KL penalty in the reward")
    kl_estimator: Literal["k1", "k2", "k3", "abs"] = "k1"
    ppo_epochs: int = Field(1, ge=1)
    critic_warmup_steps: int = Field(0, ge=0, description="steps that train only the critic")
    whiten_advantages: bool = True
    loss_level: Literal["token", "sequence"] = "token"


class Critic(Strict):
    loss_clip_val: float = Field(0.2, gt=0, description="clip the value update around the old value")
    optim: Optim = Optim(lr=5e-5)


class Reward(Strict):
    source: Literal["server", "in_process"] = "server"
    server: RewardServer = RewardServer()


class Config(Strict):
    backend: Literal["builtin", "nemo_rl"] = Field(
        "builtin", description="nemo_rl: run NeMo-RL v0.7.0 in its container (see docs/nemo-rl.md)"
    )
    inputs: Inputs = Inputs()
    outputs: Outputs = Outputs()
    trainer: Trainer = Trainer()
    ppo: PPO = PPO()
    critic: Critic = Critic()
    optim: Optim = Optim()
    generation: Generation = Generation()
    reward: Reward = Reward()
    checkpoint: Checkpointing = Checkpointing()
    eval: Evaluation = Evaluation()
    runtime: Runtime = Runtime()
    nemo_rl: NemoRL = NemoRL()
