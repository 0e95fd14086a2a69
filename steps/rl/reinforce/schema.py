"""Config schema of rl/reinforce: NeMo-Aligner's REINFORCE (RLOO baseline, KL to the initial policy, no critic)."""

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
    reward_model: str | None = Field(None, description="the reward model (reward_model_hf) served by rm/serve")


class Outputs(Strict):
    policy: str = Field("reinforce_policy", description="artifact name of the aligned policy")


class Trainer(Strict):
    max_steps: int = Field(100, ge=1, description="rollout + update steps")
    num_prompts_per_step: int = Field(8, ge=1, description="prompts per step (global batch)")
    micro_batch_size: int = Field(16, ge=1, description="responses per forward/backward pass")
    log_interval: int = Field(1, ge=1)


class Reinforce(Strict):
    initial_policy_kl_penalty: float = Field(0.01, ge=0, description="beta: reward -= beta * KL(policy || initial policy)")
    kl_estimator: Literal["k1", "k2", "k3", "abs"] = "k1"
    kl_in: Literal["reward_sequence_mean", "reward_per_token"] = Field(
        "reward_sequence_mean", description="NeMo-Aligner subtracts the sequence-mean KL from the reward"
    )
    num_rollouts_per_prompt: int = Field(4, ge=2, description="responses per prompt (RLOO needs >= 2)")
    discount_factor: float = Field(1.0, ge=0, le=1)
    reinforce_epochs: int = Field(1, ge=1, description="optimisation passes over each rollout batch")
    loss_level: Literal["token", "sequence"] = "token"
    truncated_responses: Literal["keep", "zero_reward"] = Field(
        "keep", description="responses without EOS: keep their reward, or score them 0 (they never enter baselines)"
    )


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
    reinforce: Reinforce = Reinforce()
    optim: Optim = Optim()
    generation: Generation = Generation()
    reward: Reward = Reward()
    checkpoint: Checkpointing = Checkpointing()
    eval: Evaluation = Evaluation()
    runtime: Runtime = Runtime()
    nemo_rl: NemoRL = NemoRL()
