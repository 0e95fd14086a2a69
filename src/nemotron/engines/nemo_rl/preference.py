"""How a DPO step maps onto NeMo-RL v0.7.0: examples/run_dpo.py over examples/configs/dpo.yaml, the policy trained
against a frozen copy of itself on preference pairs.

The recipe is a manifest's `engines.nemo_rl = "run_dpo"`; its compiler reads the attributes of the step's pydantic
Config (rl/dpo's schema), so mypy checks every key it maps. run_dpo.py reads its pairs through the same loader as
run_rm.py (setup_preference_data), so our pairs are written in the job dir as BinaryPreferenceDataset's rows by the
same data step (nemotron.engines.data_files `pairs`). NeMo-RL v0.7.0's DPO has one preference loss (its DPOConfig
keeps preference_loss as a TODO, algorithms/dpo.py:77) and no label smoothing: other variants are refused, naming
the engines that run them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nemotron.config.targets import NEMO_RL_VERSION
from nemotron.engines.nemo_rl import sections as sec
from nemotron.engines.nemo_rl import supervised as sup
from nemotron.engines.nemo_rl.batches import data_parallel_ranks, refuse_uneven_batches
from nemotron.engines.nemo_rl.compiled import Compiled
from nemotron.engines.refusals import Refusals

if TYPE_CHECKING:  # mypy reads steps/ as a package root; at run time the catalog loads each schema.py itself
    from rl.dpo.schema import Config as DPOConfig

DPO_ENTRY = "examples/run_dpo.py"
DPO_BASE = "examples/configs/dpo.yaml"
OTHER_ENGINES = "backend=nemo_aligner (NeMo-Aligner's dpo.preference_loss) or backend=builtin"


def _refusals(c: DPOConfig, refuse: Refusals) -> tuple[str, str]:
    """What NeMo-RL's DPO cannot express; returns (the policy, the preference file)."""
    d, nemo = c.dpo, c.nemo_rl
    sup.refuse_trainer_keys(c, refuse)
    if d.preference_loss != "dpo":
        refuse(
            "dpo.preference_loss",
            f"NeMo-RL {NEMO_RL_VERSION} runs dpo only (its DPOConfig has no preference_loss); {OTHER_ENGINES} run "
            f"{d.preference_loss}",
        )
    refuse.unless_default(
        "dpo.label_smoothing", "NeMo-RL's DPO loss has no label smoothing; backend=builtin runs it"
    )
    if c.inputs.reference:
        refuse(
            "inputs.reference",
            "NeMo-RL's reference is a frozen copy of the policy (Policy(init_reference_model=True)): leave it "
            "unset, or backend=builtin",
        )
    if nemo.sequence_packing:
        refuse("nemo_rl.sequence_packing", "NeMo-RL's DPO packs no sequences (algorithms/dpo.py asserts it)")
    refuse.unless_default("trainer.log_interval", "NeMo-RL prints every step's metrics")
    model, data = c.inputs.policy, c.inputs.preferences
    for key, value in (("inputs.policy", model), ("inputs.preferences", data)):
        if not value:
            refuse(key, "NeMo-RL needs it set (an artifact ref or a path)")
    return str(model or ""), str(data or "")


def compile_dpo(c: DPOConfig, refuse: Refusals, job_dir: str, nodes: int, gpus: int) -> Compiled:
    d, t = c.dpo, c.trainer
    model, data = _refusals(c, refuse)
    # dpo.py also asserts whole micro-batches of pairs itself (add_ref_logprobs_to_data: only validation may pad)
    refuse_uneven_batches(
        refuse, data_parallel_ranks(c.nemo_rl, nodes * gpus), ("trainer.global_batch_size", t.global_batch_size),
        ("trainer.micro_batch_size", t.micro_batch_size), "preference pairs", "DPO asserts it",
    )  # fmt: skip
    given = c.inputs.validation_preferences
    share = c.held_out_share()  # 0 with inputs.validation_preferences, which is then the validation set whole
    validates = bool(given) or share > 0
    prepare, train, val = sup.data_files("pairs", data, job_dir, share, given)
    # dpo.*: DPOConfig's every field (algorithms/dpo.py:61-82), none left to the base's; our steps end on
    # dpo.max_num_steps (the epochs never do); without held-out pairs NeMo-RL validates nothing
    loop: dict[str, Any] = {
        "max_num_steps": d.max_num_steps,
        "max_num_epochs": d.max_num_steps,  # an epoch is at least one step: max_num_steps ends the run
        "val_period": d.val_period if validates else 0,
        "val_batches": d.val_batches,
        "val_global_batch_size": d.val_global_batch_size,
        "val_micro_batch_size": t.micro_batch_size,
        "val_at_start": d.val_at_start and validates,
        "val_at_end": d.val_at_end and validates,
        "seed": c.runtime.seed,
        "reference_policy_kl_penalty": d.reference_policy_kl_penalty,
        "preference_average_log_probs": d.preference_average_log_probs,
        "sft_average_log_probs": d.sft_average,  # the base interpolates the preference setting; set either way
        "preference_loss_weight": d.preference_loss_weight,
        "sft_loss_weight": d.sft_loss_weight,
    }
    policy = sup.policy_section(
        c, model, global_batch=t.global_batch_size, max_length=t.max_length, max_steps=d.max_num_steps
    )
    # pairs per micro-batch: NeMo-RL passes chosen and rejected of each together (mbs x 2, algorithms/dpo.py)
    policy["train_micro_batch_size"] = t.micro_batch_size
    config: dict[str, Any] = {
        sec.algorithm_section(DPO_ENTRY): loop,
        "policy": policy,
        "data": sup.data_section(
            t.max_length,
            {**sup.PAIRS_DATASET, "data_path": train},
            {**sup.PAIRS_DATASET, "data_path": val} if validates else None,
        ),
        **sec.runtime(job_dir, nodes, gpus, c.checkpoint.save_interval or d.max_num_steps),
    }
    megatron = c.nemo_rl.policy_backend == "megatron"
    return Compiled(DPO_ENTRY, DPO_BASE, config, [("policy", None, "policy")], {}, megatron, prepare)
