"""How the supervised steps map onto NeMo-Aligner v0.7.0: SFT (examples/nlp/gpt/train_gpt_sft.py, conf/gpt_sft.yaml)
and reward-model training (train_reward_model.py, conf/training_rm.yaml), from a .nemo, to the .nemo checkpoints
rl/reinforce and rl/ppo on NeMo-Aligner start from.

The recipes are the manifests' `engines.nemo_aligner` ("gpt_sft", "reward_model"). Both take their validation set from
a file: our data is split (and for the reward model, rewritten as NeMo-Aligner's chosen/rejected text lines) in the
job dir before the trainer starts (nemotron.engines.data_files)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nemotron.engines.data_files import every_nth
from nemotron.engines.nemo_aligner.scripts import AlignerRun, jsonl_from_nemo, nemo_path, trainer_run
from nemotron.engines.refusals import Refusals

if TYPE_CHECKING:  # mypy reads steps/ as a package root; at run time the catalog loads each schema.py itself
    from rm.train.schema import Config as RMConfig
    from sft.schema import Config as SFTConfig

DATA_FILES = "nemotron.engines.data_files"
# the final .nemo: NeMo's checkpoint callback writes <explicit_log_dir>/checkpoints/<exp_manager.name>.nemo on train
# end (save_nemo_on_train_end); the names are the YAMLs' exp_manager.name
SFT_NAME = "megatron_gpt_sft"
RM_NAME = "megatron_gpt"


def _common(
    c: SFTConfig | RMConfig, refuse: Refusals, kind: str, job_dir: str
) -> tuple[str, tuple[str, ...], str, str]:
    """What both steps refuse; returns (the .nemo to start from, the data preparation's words, train, validation)."""
    t = c.trainer
    model = c.inputs.init_from
    if not model:
        refuse("inputs.init_from", "NeMo-Aligner fine-tunes a .nemo checkpoint, it builds none from model.*")
    data = c.inputs.data
    if not data:
        refuse("inputs.data", "NeMo-Aligner needs it set (an artifact ref or a path)")
    refuse.all_unless_default(
        ("checkpoint.resume", "NeMo-Aligner resumes only from its own log dir in this job"),
        ("checkpoint.resume_from", "NeMo-Aligner resumes only from its own log dir in this job"),
        ("checkpoint.force", "NeMo-Aligner has no check to force past"),
    )
    if t.validation_fraction == 0:
        refuse(
            "trainer.validation_fraction",
            "NeMo-Aligner validates on a held-out file every val_check_interval",
        )
    train, val = (
        f"{job_dir}/nemo_aligner_{kind}_train.jsonl",
        f"{job_dir}/nemo_aligner_{kind}_validation.jsonl",
    )
    every = (
        every_nth(t.validation_fraction) or 2
    )  # 0 is refused above; 2 keeps the words well-formed meanwhile
    prepare = ("-m", DATA_FILES, kind, str(data or ""), train, val, str(every))
    return str(model or ""), prepare, train, val


def compile_sft(c: SFTConfig, refuse: Refusals, job_dir: str, nodes: int, gpus: int) -> AlignerRun:
    t = c.trainer
    model, prepare, train, val = _common(c, refuse, "sft_text", job_dir)
    log_dir = "sft_results"
    overrides: list[tuple[str, Any]] = [
        ("model.restore_from_path", model),
        ("model.data.train_ds.file_path", train),
        ("model.data.validation_ds.file_path", val),
        # our rows' columns: the prompt, then the response the loss is on (validation_ds interpolates these)
        ("model.data.train_ds.prompt_template", "{prompt}{response}"),
        ("model.data.train_ds.label_key", "response"),
        ("model.data.train_ds.truncation_field", "prompt"),
        ("model.data.train_ds.global_batch_size", t.global_batch_size),
        ("model.data.train_ds.max_seq_length", t.max_length),
        # index the file for max_steps x global_batch_size samples: the steps end the run, as ours do
        ("model.data.sample", True),
        ("trainer.sft.max_steps", t.max_steps),
        ("trainer.sft.val_check_interval", t.log_interval),
        ("trainer.sft.save_interval", c.checkpoint.save_interval or t.max_steps),
        ("trainer.sft.gradient_clip_val", c.optim.clip_grad),
        ("exp_manager.explicit_log_dir", f"{job_dir}/{log_dir}"),
        ("exp_manager.checkpoint_callback_params.save_nemo_on_train_end", True),
    ]
    outputs = {"policy": nemo_path(job_dir, log_dir, SFT_NAME)}
    return trainer_run(
        c, refuse, "train_gpt_sft.py", "gpt_sft.yaml", overrides, nodes, gpus, outputs, prepare
    )


def compile_rm(c: RMConfig, refuse: Refusals, job_dir: str, nodes: int, gpus: int) -> AlignerRun:
    t = c.trainer
    model, prepare, train, val = _common(c, refuse, "rm_text", job_dir)
    log_dir = "rm_results"
    overrides: list[tuple[str, Any]] = [
        *jsonl_from_nemo(model, train, val, t.max_length),
        ("model.global_batch_size", t.global_batch_size),
        ("trainer.rm.max_steps", t.max_steps),
        # training_rm.yaml's max_epochs 1 would end the run after one pass over the pairs whatever max_steps says
        # (SupervisedTrainer.set_max_steps takes the smaller); its random sampler (train_random_sampler: True)
        # allows more epochs and reshuffles each: max_steps ends the run, as ours does
        ("trainer.rm.max_epochs", t.max_steps),
        ("trainer.rm.val_check_interval", t.log_interval),
        ("trainer.rm.save_interval", c.checkpoint.save_interval or t.max_steps),
        ("trainer.rm.gradient_clip_val", c.optim.clip_grad),
        ("exp_manager.explicit_log_dir", f"{job_dir}/{log_dir}"),
    ]
    outputs = {"reward_model": nemo_path(job_dir, log_dir, RM_NAME)}
    return trainer_run(
        c, refuse, "train_reward_model.py", "training_rm.yaml", overrides, nodes, gpus, outputs, prepare
    )


# recipe (a manifest's `engines.nemo_aligner`) -> its compiler
RECIPES: dict[str, Callable[[Any, Refusals, str, int, int], AlignerRun]] = {
    "gpt_sft": compile_sft,
    "reward_model": compile_rm,
}
