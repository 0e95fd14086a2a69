"""Config schema of sft: supervised fine-tuning of a causal LM, built from a model config (random init, with a
tokenizer trained on the data) or started from a checkpoint."""

from pydantic import Field

from nemotron.config.stepconfig import ModelArch, Optim, Strict, SupervisedConfig


class Inputs(Strict):
    """The artifacts sft reads: an artifact reference (name:latest, name:vN, name@alias, art://...) or a
    path."""

    data: str | None = None
    """SFT JSONL, one {prompt, response} per line (type sft_jsonl)"""
    init_from: str | None = None
    """start from this checkpoint_hf (weights and tokenizer) instead of a random init from model.*"""


class Outputs(Strict):
    """Names the outputs are registered under in the artifact store."""

    policy: str = "sft_policy"
    """artifact name of the fine-tuned policy (checkpoint_hf)"""


class Config(SupervisedConfig):
    """sft: supervised fine-tuning of a causal LM on prompt/response pairs."""

    inputs: Inputs = Field(default_factory=Inputs)
    outputs: Outputs = Field(default_factory=Outputs)
    model: ModelArch = Field(default_factory=ModelArch)
    """architecture of a random-init policy (refused with inputs.init_from)"""
    optim: Optim = Optim(lr=3e-3, warmup_steps=20, min_lr_ratio=0.1)
    """the policy's optimizer"""
