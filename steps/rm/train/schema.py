"""Config schema of rm/train: a Bradley-Terry reward model trained on preference pairs."""

from pydantic import Field

from nemotron.config.stepconfig import ModelArch, Optim, Strict, SupervisedConfig


class Inputs(Strict):
    """The artifacts rm/train reads: an artifact reference or a path."""

    data: str | None = None
    """preference JSONL, one {prompt, chosen, rejected} per line (type preference_jsonl)"""
    init_from: str | None = None
    """the SFT policy (checkpoint_hf): its backbone and tokenizer start the reward model, with a fresh scalar
    head; unset: a random init from model.*"""


class Outputs(Strict):
    """Names the outputs are registered under in the artifact store."""

    reward_model: str = "reward_model"
    """artifact name of the trained reward model (reward_model_hf)"""


class Config(SupervisedConfig):
    """rm/train: a Bradley-Terry reward model trained on preference pairs."""

    inputs: Inputs = Field(default_factory=Inputs)
    outputs: Outputs = Field(default_factory=Outputs)
    model: ModelArch = Field(default_factory=ModelArch)
    """architecture of a random-init reward model (refused with inputs.init_from)"""
    optim: Optim = Optim(lr=1e-3, warmup_steps=20, min_lr_ratio=0.1)
    """the reward model's optimizer"""

    rows_per_record = 2
