"""Config schema of sft: supervised fine-tuning of a causal LM, built from a model config (random init, with a
tokenizer trained on the data) or started from a checkpoint."""

from pydantic import Field

from nemotron.stepconfig import ModelArch, Optim, Strict, TrainRuntime


class Inputs(Strict):
    """The artifacts sft reads: an artifact reference (name:latest, name:vN, art://...) or a path."""

    data: str | None = Field(None, description="SFT JSONL, one {prompt, response} per line (type sft_jsonl)")
    init_from: str | None = Field(
        None,
        description="start from this checkpoint_hf (weights and tokenizer) instead of a random init from "
        "model.*",
    )


class Outputs(Strict):
    """Names the outputs are registered under in the artifact store."""

    policy: str = Field("sft_policy", description="artifact name of the fine-tuned policy (checkpoint_hf)")


class Trainer(Strict):
    """The training loop."""

    max_steps: int = Field(300, ge=1, description="optimizer steps (NeMo-Aligner: trainer.sft.max_steps)")
    global_batch_size: int = Field(
        64,
        ge=1,
        description="examples per optimizer step, split evenly over ranks (NeMo-Aligner: "
        "model.global_batch_size)",
    )
    max_length: int = Field(
        32, ge=4, description="tokens per example (prompt + response + EOS); longer ones are cut"
    )
    validation_fraction: float = Field(
        0.05,
        ge=0,
        lt=1,
        description="share of examples held out (seeded split) for the validation loss val_loss",
    )
    log_interval: int = Field(25, ge=1, description="print a summary line and compute val_loss every N steps")


class Config(Strict):
    """sft: supervised fine-tuning of a causal LM on prompt/response pairs."""

    inputs: Inputs = Inputs()
    outputs: Outputs = Outputs()
    model: ModelArch = Field(
        ModelArch(), description="architecture of a random-init policy (unused with inputs.init_from)"
    )
    trainer: Trainer = Trainer()
    optim: Optim = Field(
        Optim(lr=3e-3, warmup_steps=20, min_lr_ratio=0.1), description="the policy's optimizer"
    )
    runtime: TrainRuntime = TrainRuntime()
