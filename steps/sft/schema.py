"""Config schema of sft: supervised fine-tuning of a causal LM, built from a model config (random init, with a
tokenizer trained on the data) or started from a checkpoint."""

from nemotron.config.stepconfig import (
    ModelArch,
    Optim,
    ResourcePlan,
    Strict,
    SupervisedTrainer,
    Tracking,
    TrainRuntime,
)
from nemotron.config.workload import Training, Workload


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


class Config(Strict):
    """sft: supervised fine-tuning of a causal LM on prompt/response pairs."""

    inputs: Inputs = Inputs()
    outputs: Outputs = Outputs()
    model: ModelArch = ModelArch()
    """architecture of a random-init policy (unused with inputs.init_from)"""
    trainer: SupervisedTrainer = SupervisedTrainer()
    optim: Optim = Optim(lr=3e-3, warmup_steps=20, min_lr_ratio=0.1)
    """the policy's optimizer"""
    runtime: TrainRuntime = TrainRuntime()
    tracking: Tracking = Tracking()
    plan: ResourcePlan = ResourcePlan()
    """the resource plan's model hints and what a plan that cannot fit does"""

    def workload(self) -> Workload:
        t = self.trainer
        return Training("trainer.global_batch_size", t.global_batch_size, t.max_length)
