"""How a DPO step maps onto NeMo-Aligner v0.7.0: examples/nlp/gpt/train_gpt_dpo.py with conf/gpt_dpo.yaml, from the
policy's .nemo to the aligned .nemo, with its preference losses (dpo, ipo, rpo_sq, rpo_bwd_kl, rpo_fwd_kl).

The recipe is a manifest's `engines.nemo_aligner = "dpo"`. Our pairs are rewritten in the job dir, before the
trainer starts, as the JSONL DPOModelDataset reads (nemotron.engines.data_files `dpo_text`: prompt,
chosen_response, rejected_response and the rewards the RPO losses read). The reference is the policy's own initial
weights (train_gpt_dpo.py keeps them as ref_policy_state_dict), and validation runs after every val_check_interval
steps and the last one, never before the first."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nemotron.engines.data_files import every_nth
from nemotron.engines.nemo_aligner import scripts as sc
from nemotron.engines.refusals import Refusals

if TYPE_CHECKING:  # mypy reads steps/ as a package root; at run time the catalog loads each schema.py itself
    from rl.dpo.schema import Config as DPOConfig

DATA_FILES = "nemotron.engines.data_files"
NAME = "megatron_gpt"  # gpt_dpo.yaml's exp_manager.name: the final .nemo is <log dir>/checkpoints/megatron_gpt.nemo
LOG_DIR = "dpo_results"


def _refusals(c: DPOConfig, refuse: Refusals) -> None:
    d = c.dpo
    refuse.all_unless_default(
        ("dpo.label_smoothing", "NeMo-Aligner's DPO losses have no label smoothing; backend=builtin runs it"),
        ("trainer.log_interval", "NeMo-Aligner logs every step"),
        ("checkpoint.resume", "NeMo-Aligner resumes only from its own log dir in this job"),
        ("checkpoint.resume_from", "NeMo-Aligner resumes only from its own log dir in this job"),
        ("checkpoint.force", "NeMo-Aligner has no check to force past"),
    )
    if c.inputs.reference:
        refuse(
            "inputs.reference",
            "NeMo-Aligner's reference is the policy's own initial weights (train_gpt_dpo.py): leave it unset, "
            "or backend=builtin",
        )
    for key, value in (("inputs.policy", c.inputs.policy), ("inputs.preferences", c.inputs.preferences)):
        if not value:
            refuse(key, "NeMo-Aligner needs it set (an artifact ref or a path)")
    if not c.inputs.validation_preferences and c.held_out_share() == 0:
        refuse(
            "trainer.validation_fraction",
            "NeMo-Aligner's DPO validates on held-out pairs (or set inputs.validation_preferences)",
        )
    if d.val_at_start:
        refuse("dpo.val_at_start", "NeMo-Aligner's DPO validates after training steps only")
    if not d.val_at_end:
        refuse("dpo.val_at_end", "NeMo-Aligner's DPO always validates after the last step (check_progress)")
    if d.val_global_batch_size != c.trainer.global_batch_size:
        refuse(
            "dpo.val_global_batch_size",
            f"NeMo-Aligner validates in batches of model.global_batch_size: set it to trainer.global_batch_size "
            f"({c.trainer.global_batch_size})",
        )


def _validation(c: DPOConfig, refuse: Refusals, save_every: int) -> list[tuple[str, Any]]:
    """trainer.dpo's validation keys: every dpo.val_period steps (0: only after the last), on dpo.val_batches
    batches (0: all); NeMo-Aligner asserts that its saves fall on validations."""
    d = c.dpo
    every = d.val_period or d.max_num_steps
    if save_every % every:
        refuse(
            "dpo.val_period",
            f"NeMo-Aligner saves only at validations: checkpoint.save_interval (or dpo.max_num_steps), {save_every}, "
            f"must be a multiple of the validation interval, {every}",
        )
    return [
        ("trainer.dpo.val_check_interval", every),
        ("trainer.dpo.limit_val_batches", d.val_batches or 1.0),
    ]


def compile_dpo(c: DPOConfig, refuse: Refusals, job_dir: str, nodes: int, gpus: int) -> sc.AlignerRun:
    d, t = c.dpo, c.trainer
    _refusals(c, refuse)
    train = f"{job_dir}/nemo_aligner_dpo_text_train.jsonl"
    val = f"{job_dir}/nemo_aligner_dpo_text_validation.jsonl"
    given = c.inputs.validation_preferences
    data = ("-m", DATA_FILES, "dpo_text", str(c.inputs.preferences or ""), train, val)
    # every n-th pair held out; 0 (refused above) would hold out none: 2 keeps the words well-formed meanwhile
    prepare = (*data, "0", given) if given else (*data, str(every_nth(c.held_out_share()) or 2))
    save_every = c.checkpoint.save_interval or d.max_num_steps
    overrides: list[tuple[str, Any]] = [
        *sc.jsonl_from_nemo(c.inputs.policy or "", train, val, t.max_length),
        # the built-in engine ends each response with EOS; DPOModelDataset appends it only when told (a key
        # gpt_dpo.yaml lacks, read with .get: added with ++)
        ("++model.data.append_eod", True),
        ("model.global_batch_size", t.global_batch_size),
        ("model.micro_batch_size", t.micro_batch_size),
        ("model.dpo.ref_policy_kl_penalty", d.reference_policy_kl_penalty),
        ("model.dpo.preference_average_log_probs", d.preference_average_log_probs),
        ("model.dpo.sft_average_log_probs", d.sft_average),
        ("model.dpo.preference_loss", d.preference_loss),
        ("model.dpo.gt_reward_scale", d.gt_reward_scale),
        ("model.dpo.preference_loss_weight", d.preference_loss_weight),
        ("model.dpo.sft_loss_weight", d.sft_loss_weight),
        ("trainer.dpo.max_steps", d.max_num_steps),
        # an epoch is at least one step, and the random sampler reshuffles each: max_steps ends the run
        ("trainer.dpo.max_epochs", d.max_num_steps),
        *_validation(c, refuse, save_every),
        ("trainer.dpo.save_interval", save_every),
        ("trainer.dpo.gradient_clip_val", c.optim.clip_grad),
        ("exp_manager.explicit_log_dir", f"{job_dir}/{LOG_DIR}"),
    ]
    outputs = {"policy": sc.nemo_path(job_dir, LOG_DIR, NAME)}
    return sc.trainer_run(
        c, refuse, "train_gpt_dpo.py", "gpt_dpo.yaml", overrides, nodes, gpus, outputs, prepare
    )
