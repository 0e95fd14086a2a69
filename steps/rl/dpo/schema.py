"""Config schema of rl/dpo: Direct Preference Optimization against a frozen reference, in NeMo-RL v0.7.0's key
names (dpo.*), with NeMo-Aligner v0.7.0's loss variants and conservative DPO's label smoothing."""

from typing import Literal, Self

from pydantic import Field, model_validator

from nemotron.config import stepconfig
from nemotron.config.stepconfig import (
    AlignerBackend,
    Checkpointing,
    NemoRLTraining,
    Optim,
    ResourcePlan,
    Strict,
    Tracking,
    TrainRuntime,
)
from nemotron.config.workload import Training, Workload

PreferenceLoss = Literal["dpo", "ipo", "rpo_sq", "rpo_bwd_kl", "rpo_fwd_kl"]
RPO_LOSSES = ("rpo_sq", "rpo_bwd_kl", "rpo_fwd_kl")


class Inputs(Strict):
    """The artifacts rl/dpo reads: an artifact reference (name:latest, name:vN, name@alias, art://...) or a
    path."""

    policy: str | None = None
    """the policy to align (checkpoint_hf; .nemo on nemo_aligner), usually the SFT policy; a frozen copy of it
    is the reference unless inputs.reference is set"""
    preferences: str | None = None
    """preference JSONL to train on, one {prompt, chosen, rejected} per line (preference_jsonl); the RPO
    losses also read each line's chosen_reward and rejected_reward (1 and 0 where absent, NeMo-Aligner's
    defaults)"""
    validation_preferences: str | None = None
    """held-out preference JSONL for the val_* metrics; unset: trainer.validation_fraction of
    inputs.preferences is held out (seeded)"""
    reference: str | None = None
    """the frozen reference policy (checkpoint_hf) whose log-probabilities the rewards are measured against;
    its tokenizer must be the policy's. Unset: a frozen copy of inputs.policy (NeMo-RL and NeMo-Aligner do the
    same)"""


class Outputs(Strict):
    """Names the outputs are registered under in the artifact store."""

    policy: str = "dpo_policy"
    """artifact name of the DPO-aligned policy (checkpoint_hf)"""


class DPO(Strict):
    """The DPO algorithm and its schedule (NeMo-RL: dpo.*; NeMo-Aligner: model.dpo.* and trainer.dpo.*). A
    response's reward is r = sum over its tokens of log pi(t) - log pi_ref(t) (the mean with
    preference_average_log_probs), and the loss is preference_loss_weight * L_pref(r_chosen - r_rejected) +
    sft_loss_weight * NLL(chosen)."""

    max_num_steps: int = Field(150, ge=1)
    """optimizer steps (NeMo-RL: dpo.max_num_steps; NeMo-Aligner: trainer.dpo.max_steps; TRL: max_steps)"""
    val_period: int = Field(25, ge=0)
    """validate every N steps (0 = not during training; NeMo-RL: dpo.val_period)"""
    val_batches: int = Field(8, ge=0)
    """validation batches of val_global_batch_size pairs per validation (0 = all the validation pairs; NeMo-
    RL: dpo.val_batches)"""
    val_global_batch_size: int = Field(8, ge=1)
    """validation pairs per batch (NeMo-RL: dpo.val_global_batch_size)"""
    val_at_start: bool = True
    """validate before the first step, so val_* shows where the policy started (NeMo-RL: dpo.val_at_start)"""
    val_at_end: bool = False
    """validate after the last step whatever val_period says (NeMo-RL: dpo.val_at_end)"""
    reference_policy_kl_penalty: float = Field(0.05, gt=0)
    """beta, the strength of the implicit KL to the reference: the preference loss sees beta * (r_chosen -
    r_rejected) (NeMo-RL: dpo.reference_policy_kl_penalty; NeMo-Aligner: dpo.ref_policy_kl_penalty; TRL:
    beta)"""
    preference_average_log_probs: bool = False
    """a response's reward is the mean, not the sum, of its per-token log-ratios (NeMo-RL and NeMo-Aligner:
    dpo.preference_average_log_probs)"""
    sft_average_log_probs: bool | None = None
    """the SFT term is the chosen response's mean, not summed, token NLL; unset: as
    preference_average_log_probs (NeMo-RL and NeMo-Aligner: dpo.sft_average_log_probs)"""
    preference_loss: PreferenceLoss = "dpo"
    """the preference loss on d = r_chosen - r_rejected: dpo = -log sigmoid(beta d); ipo = (d - 1/(2 beta))^2;
    rpo_sq = (beta d - g)^2; rpo_bwd_kl and rpo_fwd_kl = the backward or forward KL between the Bernoulli
    sigmoid(g) and sigmoid(beta d), where g = gt_reward_scale * (chosen_reward - rejected_reward) of each line
    (1 and 0 where absent) (NeMo-Aligner: dpo.preference_loss; NeMo-RL runs dpo only)"""
    gt_reward_scale: float = Field(1.0, gt=0)
    """scale of the data's reward difference g in the RPO losses; refused with dpo and ipo, which read no
    rewards (NeMo-Aligner: dpo.gt_reward_scale)"""
    label_smoothing: float = Field(0.0, ge=0, lt=0.5)
    """conservative DPO: the chance a pair's label is flipped, loss = -(1-e) log sigmoid(beta d) - e log
    sigmoid(-beta d); only with preference_loss dpo (TRL: label_smoothing; neither NeMo engine has it)"""
    preference_loss_weight: float = Field(1.0, ge=0)
    """weight of the preference loss (NeMo-RL and NeMo-Aligner: dpo.preference_loss_weight)"""
    sft_loss_weight: float = Field(0.0, ge=0)
    """weight of the chosen responses' NLL added to the loss (NeMo-RL and NeMo-Aligner: dpo.sft_loss_weight)
    """

    @model_validator(mode="after")
    def _every_key_acts(self) -> Self:
        """Accepted-but-ignored is refused: keys a variant does not read, and a loss of nothing."""
        if self.preference_loss_weight == 0 and self.sft_loss_weight == 0:
            raise ValueError("preference_loss_weight and sft_loss_weight are both 0: the loss would be 0")
        if self.label_smoothing and self.preference_loss != "dpo":
            raise ValueError(
                f"label_smoothing acts only with preference_loss: dpo, not {self.preference_loss}"
            )
        if self.gt_reward_scale != 1.0 and self.preference_loss not in RPO_LOSSES:
            raise ValueError(
                f"gt_reward_scale acts only with the RPO losses ({', '.join(RPO_LOSSES)}), not "
                f"{self.preference_loss}"
            )
        return self

    @property
    def sft_average(self) -> bool:
        """Whether the SFT term averages over tokens (sft_average_log_probs, else the preference setting)."""
        if self.sft_average_log_probs is None:
            return self.preference_average_log_probs
        return self.sft_average_log_probs


class Trainer(Strict):
    """Batches of the DPO loop: each optimizer step learns from a random global batch of training pairs (NeMo-
    RL: policy.train_global_batch_size and friends)."""

    global_batch_size: int = Field(128, ge=1)
    """preference pairs per optimizer step, split evenly over ranks; each pair is two sequences (NeMo-RL:
    policy.train_global_batch_size; NeMo-Aligner: model.global_batch_size)"""
    micro_batch_size: int = Field(2, ge=1)
    """pairs per forward/backward pass, chosen and rejected in one batch; gradients accumulate to one
    optimizer step (NeMo-RL: policy.train_micro_batch_size; NeMo-Aligner: model.micro_batch_size)"""
    max_length: int = Field(1024, ge=4)
    """tokens per sequence (prompt + response + EOS); longer ones lose their end, and a pair whose prompt
    leaves no response token is refused (NeMo-RL: policy.max_total_sequence_length; NeMo-Aligner:
    model.encoder_seq_length)"""
    validation_fraction: float | None = Field(None, ge=0, lt=1)
    """share of inputs.preferences held out (seeded, at least one pair) for the val_* metrics; unset: 0.05, or
    nothing held out when inputs.validation_preferences is set (setting both is refused)"""
    log_interval: int = Field(10, ge=1)
    """print a summary line every N steps (metrics.jsonl gets every step)"""


class Config(Strict):
    """rl/dpo: Direct Preference Optimization of a policy against a frozen reference."""

    backend: AlignerBackend = stepconfig.backend_field(
        "DPO (run_dpo.py)", "DPO and its IPO and RPO variants (train_gpt_dpo.py)"
    )
    inputs: Inputs = Field(default_factory=Inputs)
    outputs: Outputs = Field(default_factory=Outputs)
    dpo: DPO = Field(default_factory=DPO)
    trainer: Trainer = Field(default_factory=Trainer)
    optim: Optim = Optim(lr=5e-6, weight_decay=0.1, adam_beta2=0.98, warmup_steps=20)
    """the policy's optimizer (NeMo-RL dpo.yaml's: AdamW 5e-6, weight decay 0.1, betas 0.9/0.98, 20 warm-up
    steps, then constant)"""
    checkpoint: Checkpointing = Field(default_factory=Checkpointing)
    runtime: TrainRuntime = Field(default_factory=TrainRuntime)
    tracking: Tracking = Field(default_factory=Tracking)
    nemo_rl: NemoRLTraining = Field(default_factory=NemoRLTraining)
    plan: ResourcePlan = Field(default_factory=ResourcePlan)
    """the resource plan's model hints and what a plan that cannot fit does"""

    @model_validator(mode="after")
    def _one_validation_source(self) -> Self:
        """The held-out share acts only when no validation file is given."""
        if self.inputs.validation_preferences and self.trainer.validation_fraction is not None:
            raise ValueError(
                "trainer.validation_fraction acts only without inputs.validation_preferences (it holds pairs "
                "out of inputs.preferences)"
            )
        return self

    def held_out_share(self) -> float:
        """The share of inputs.preferences held out for validation: none with a validation file."""
        if self.inputs.validation_preferences:
            return 0.0
        return 0.05 if self.trainer.validation_fraction is None else self.trainer.validation_fraction

    def prompt_token_limits(self) -> dict[str, tuple[str, int, str]]:
        """Preflight: a pair whose prompt alone fills trainer.max_length, counted with the policy's tokenizer,
        would keep no response token; refused at compile time, naming its line."""
        limit = ("trainer.max_length", self.trainer.max_length, "policy")
        return {"preferences": limit, "validation_preferences": limit}

    def workload(self) -> Workload:
        """One optimizer step: micro-batches of pairs, chosen and rejected in one forward."""
        return Training(
            "trainer.micro_batch_size",
            self.trainer.global_batch_size,
            self.trainer.max_length,
            rows_per_record=2,
            micro_batch=self.trainer.micro_batch_size,
        )
