"""How the supervised steps map onto NeMo-RL v0.7.0: SFT (examples/run_sft.py over examples/configs/sft.yaml) and
Bradley-Terry reward-model training (examples/run_rm.py over rm.yaml), from a pretrained model.

The recipes are the manifests' `engines.nemo_rl` ("run_sft", "run_rm", after the entries); each reads the attributes of the step's pydantic
Config (the schema's SupervisedConfig groups), so mypy checks every key it maps. Both entries take their validation
set from a file, so our data is written in the job dir before the entry runs, by nemotron.engines.data_files
(shipped into the job dir: NeMo-RL's container has no nemotron): sft_jsonl as the `messages` column ResponseDataset
takes as it is, preference_jsonl as BinaryPreferenceDataset's prompt/chosen/rejected rows."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemotron.config.stepconfig import SupervisedConfig
from nemotron.engines.data_files import every_nth
from nemotron.engines.nemo_rl import sections as sec
from nemotron.engines.nemo_rl.batches import data_parallel_ranks, refuse_uneven_batches
from nemotron.engines.nemo_rl.compiled import Compiled
from nemotron.engines.refusals import Refusals

if TYPE_CHECKING:  # mypy reads steps/ as a package root; at run time the catalog loads each schema.py itself
    from rm.train.schema import Config as RMConfig
    from sft.schema import Config as SFTConfig

SFT_ENTRY = "examples/run_sft.py"
SFT_BASE = "examples/configs/sft.yaml"
RM_ENTRY = "examples/run_rm.py"
RM_BASE = "examples/configs/rm.yaml"
RM_RECIPE = "run_rm"  # the manifests' `engines.nemo_rl` of reward-model training
RM_OUTPUT = "reward_model"  # its converted checkpoint (rm/train's [[produces]] name)
DATA_FILES = "nemotron_data_files.py"  # nemotron.engines.data_files, written into the job dir


# BinaryPreferenceDataset's own keys (nemo_rl/data/datasets/preference_datasets/binary_preference_dataset.py), as
# data_files' `pairs` rows carry them: the entries that read preference pairs (run_rm.py, run_dpo.py) take them
PAIRS_DATASET = {"dataset_name": "BinaryPreferenceDataset", "prompt_key": "prompt", "chosen_key": "chosen",
                 "rejected_key": "rejected", "prompt_file": None, "system_prompt_file": None}  # fmt: skip


def data_files(
    kind: str, data: str, job_dir: str, fraction: float, held_out: str | None = None
) -> tuple[tuple[str, ...], str, str]:
    """(the data step's arguments, the train file, the validation file), both in the job dir: every n-th record of
    `data` held out, or every record of `held_out` (the user's own validation file) when it is given."""
    train, val = f"{job_dir}/nemo_rl_{kind}_train.jsonl", f"{job_dir}/nemo_rl_{kind}_validation.jsonl"
    if held_out:
        return (kind, data, train, val, "0", held_out), train, val
    return (kind, data, train, val, str(every_nth(fraction))), train, val


def refuse_trainer_keys(c: Any, refuse: Refusals) -> None:
    """What every step NeMo-RL trains on a dataset refuses (`c` has the runtime and nemo_rl groups): CPU, the
    built-in engine's own training keys, pipeline parallelism on DTensor."""
    if c.runtime.device == "cpu":
        refuse("runtime.device", "NeMo-RL trains on GPUs only")
    sec.refuse_builtin_training(c, refuse)
    if c.nemo_rl.policy_backend == "dtensor" and c.nemo_rl.pipeline_parallel_size > 1:
        refuse("nemo_rl.pipeline_parallel_size", "pipeline parallelism needs nemo_rl.policy_backend=megatron")


def _refusals(c: SFTConfig | RMConfig, refuse: Refusals) -> tuple[str, str]:
    """What both steps refuse; returns (the pretrained model, the data file)."""
    refuse_trainer_keys(c, refuse)
    model = c.inputs.init_from
    if not model:
        refuse(
            "inputs.init_from",
            "NeMo-RL fine-tunes a pretrained model (an HF id or checkpoint_hf), it builds none from model.*",
        )
    data = c.inputs.data
    if not data:
        refuse("inputs.data", "NeMo-RL needs it set (an artifact ref or a path)")
    return str(model or ""), str(data or "")


def policy_section(
    c: Any, model: str, *, global_batch: int, max_length: int, max_steps: int
) -> dict[str, Any]:
    """policy.*: the pretrained model, its tokenizer, the batch, the sequence budget and the trainer (from the
    optim, runtime and nemo_rl groups of `c`)."""
    return {
        "model_name": model,
        # chat_template null = NeMo-RL's passthrough template: prompt and response text as they are, as the
        # built-in engine reads them (the bases' own templates would wrap them in "Question: ... Answer:")
        "tokenizer": {"name": model, "chat_template": None, "chat_template_kwargs": None},
        "train_global_batch_size": global_batch,
        "max_total_sequence_length": max_length,
        **sec.trainer(c.nemo_rl, c.optim, max_steps, packing=c.nemo_rl.sequence_packing, runtime=c.runtime),
    }


def _policy(c: SupervisedConfig, model: str) -> dict[str, Any]:
    t = c.trainer
    return policy_section(
        c, model, global_batch=t.global_batch_size, max_length=t.max_length, max_steps=t.max_steps
    )


def _loop(c: SupervisedConfig, validates: bool) -> dict[str, Any]:
    """sft.* / rm.*: our steps end on trainer.max_steps (the epochs never do), validate every log_interval steps
    and at the end on every held-out record."""
    t = c.trainer
    return {
        "max_num_steps": t.max_steps,
        "max_num_epochs": t.max_steps,  # an epoch is at least one step: max_num_steps ends the run
        "val_period": t.log_interval if validates else 0,
        "val_batches": -1,
        "val_global_batch_size": t.global_batch_size,
        "val_at_start": False,
        "val_at_end": validates,
        "seed": c.runtime.seed,
    }


def data_section(max_length: int, train: dict[str, Any], validation: dict[str, Any] | None) -> dict[str, Any]:
    """data.*, owned whole (`_override_`): the bases' datasets (squad, HelpSteer3) must not survive. Each dataset
    names its dataset_name itself: the bases' logger names interpolate ${data.train.dataset_name}."""
    return {
        "_override_": True,
        "max_input_seq_length": max_length,
        "shuffle": True,
        "num_workers": 1,
        "train": train,
        "validation": validation,
    }


def compile_sft(c: SFTConfig, refuse: Refusals, job_dir: str, nodes: int, gpus: int) -> Compiled:
    model, data = _refusals(c, refuse)
    # sft.yaml's train_micro_batch_size is 1, which we keep
    refuse_uneven_batches(
        refuse, data_parallel_ranks(c.nemo_rl, nodes * gpus), ("trainer.global_batch_size", c.trainer.global_batch_size),
        ("", 1), "examples", "shard_by_batch_size asserts it",
    )  # fmt: skip
    fraction = c.trainer.validation_fraction
    prepare, train, val = data_files("messages", data, job_dir, fraction)
    # rows carry a `messages` column, which ResponseDataset keeps as it is (its input/output keys go unread)
    dataset = {"dataset_name": "ResponseDataset"}
    config: dict[str, Any] = {
        sec.algorithm_section(SFT_ENTRY): {
            **_loop(c, fraction > 0),
            "val_micro_batch_size": 1,
            "only_unmask_final": False,
        },
        "policy": _policy(c, model),
        "data": {
            **data_section(
                c.trainer.max_length,
                {**dataset, "data_path": train},
                {**dataset, "data_path": val} if fraction > 0 else None,
            ),
            # the built-in engine's SFT rows: prompt + response + EOS, the loss on the response only
            "add_bos": True,
            "add_eos": True,
            "add_generation_prompt": False,
            "default": {"processor": "sft_processor", "prompt_file": None, "system_prompt_file": None},
        },
        **sec.runtime(job_dir, nodes, gpus, c.checkpoint.save_interval or c.trainer.max_steps),
    }
    megatron = c.nemo_rl.policy_backend == "megatron"
    return Compiled(SFT_ENTRY, SFT_BASE, config, [("policy", None, "policy")], {}, megatron, prepare)


def compile_rm(c: RMConfig, refuse: Refusals, job_dir: str, nodes: int, gpus: int) -> Compiled:
    model, data = _refusals(c, refuse)
    nemo = c.nemo_rl
    # NeMo-RL v0.7.0's reward models: DTensor only (models/megatron/setup.py:258), no packing
    # (models/automodel/setup.py:350), no context parallelism (algorithms/rm.py:126)
    if nemo.policy_backend == "megatron":
        refuse("nemo_rl.policy_backend", "NeMo-RL trains reward models on DTensor only")
    if nemo.sequence_packing:
        refuse("nemo_rl.sequence_packing", "NeMo-RL packs no reward-model sequences")
    if nemo.context_parallel_size > 1:
        refuse("nemo_rl.context_parallel_size", "NeMo-RL's reward-model loss takes no context parallelism")
    # rm.py trains on twice rm.yaml's batches (a pair's two rows, in one micro-batch): the pairs split as the rows do
    refuse_uneven_batches(
        refuse, data_parallel_ranks(nemo, nodes * gpus), ("trainer.global_batch_size", c.trainer.global_batch_size),
        ("", 1), "preference pairs", "shard_by_batch_size asserts it; a pair is never split",
    )  # fmt: skip
    fraction = c.trainer.validation_fraction
    prepare, train_file, val_file = data_files("pairs", data, job_dir, fraction)
    dataset = PAIRS_DATASET
    config: dict[str, Any] = {
        sec.algorithm_section(RM_ENTRY): {**_loop(c, fraction > 0), "val_micro_batch_size": 1},
        "policy": {
            **_policy(c, model),
            "reward_model_cfg": {"enabled": True, "reward_model_type": "bradley_terry"},
        },
        "data": data_section(
            c.trainer.max_length,
            {**dataset, "data_path": train_file},
            {**dataset, "data_path": val_file} if fraction > 0 else None,
        ),
        **sec.runtime(job_dir, nodes, gpus, c.checkpoint.save_interval or c.trainer.max_steps),
    }
    return Compiled(RM_ENTRY, RM_BASE, config, [("policy", None, RM_OUTPUT)], {}, False, prepare)


def adopt_reward_model(checkpoint: Path) -> None:
    """NeMo-RL's DCP converter writes the HF config of policy.model_name, the causal LM the reward model started
    from (nemo_rl/utils/native_checkpoint.py convert_dcp_to_hf: AutoConfig.from_pretrained), beside the weights of
    the AutoModelForSequenceClassification NeMo-RL trained (models/automodel/setup.py:357, its one label): the
    config is made to name the architecture the weights have, so the checkpoint loads as the reward model it is."""
    path = checkpoint / "config.json"
    config = json.loads(path.read_text())
    config["architectures"] = [
        re.sub(r"(LMHeadModel|For[A-Za-z]+)$", "ForSequenceClassification", name)  # GPT2LMHeadModel too
        for name in config.get("architectures") or []
    ]
    config["id2label"], config["label2id"] = {"0": "LABEL_0"}, {"LABEL_0": 0}
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
