"""What NeMo-RL v0.7.0's supervised entries (run_sft.py, run_rm.py) validate and load, encoded as data from a reading
of the tag's sources: the TypedDicts their MasterConfig checks our sections against, and the dataset classes our
files reach. test_nemo_rl_supervised.py checks our compiled configs against it and re-reads the real classes (when
the mirror is on disk), so it cannot drift from the tag. The keys the entries read are in nemo_rl_v070.REQUIRED."""

from __future__ import annotations

# The TypedDicts (nemo_rl/data/__init__.py, nemo_rl/algorithms/rm.py) the supervised entries' MasterConfig validates
# our data and rm sections against (pydantic validates a TypedDict field: its required keys must be there), and
# the pydantic SFTConfig and DPOConfig (algorithms/sft.py, dpo.py) whose fields sft.* and dpo.* set:
# {class: (file, required keys, all keys)}.
RM_KEYS = {
    "max_num_steps",
    "max_num_epochs",
    "val_period",
    "val_batches",
    "val_global_batch_size",
    "val_micro_batch_size",
    "val_at_start",
    "val_at_end",
    "seed",
}
# DPOConfig's loss fields beside the loop's (RM_KEYS), which DPOLossFn reads (algorithms/loss/loss_functions.py)
DPO_LOSS_KEYS = {
    "reference_policy_kl_penalty",
    "preference_average_log_probs",
    "sft_average_log_probs",
    "preference_loss_weight",
    "sft_loss_weight",
}
TYPED_DICTS: dict[str, tuple[str, set[str], set[str]]] = {
    "DataConfig": (
        "nemo_rl/data/__init__.py",
        {"max_input_seq_length", "shuffle", "train"},
        {
            "max_input_seq_length",
            "add_bos",
            "add_eos",
            "add_generation_prompt",
            "add_system_prompt",
            "shuffle",
            "num_workers",
            "use_multiple_dataloader",
            "num_prompts_per_dataloader",
            "custom_dataloader",
            "train",
            "validation",
            "default",
        },
    ),
    "ResponseDatasetConfig": (
        "nemo_rl/data/__init__.py",
        set(),
        {
            "dataset_name",
            "data_path",
            "input_key",
            "output_key",
            "subset",
            "split",
            "prompt_file",
            "system_prompt_file",
            "env_name",
            "processor",
            "download_dir",
            "split_validation_size",
            "seed",
        },
    ),
    "PreferenceDatasetConfig": (
        "nemo_rl/data/__init__.py",
        set(),
        {
            "dataset_name",
            "data_path",
            "prompt_key",
            "chosen_key",
            "rejected_key",
            "subset",
            "split",
            "prompt_file",
            "system_prompt_file",
        },
    ),
    "RMConfig": (
        "nemo_rl/algorithms/rm.py",
        RM_KEYS,  # every key required
        RM_KEYS,
    ),
    "DPOConfig": (
        "nemo_rl/algorithms/dpo.py",
        set(),  # every field has a default; preference_loss and gt_reward_scale are comments (a TODO)
        RM_KEYS | DPO_LOSS_KEYS,
    ),
    "SFTConfig": (
        "nemo_rl/algorithms/sft.py",
        set(),  # every field has a default
        RM_KEYS | {"only_unmask_final"},  # RMConfig's keys, and one of its own
    ),
}
# The loaders our data reach, by data.*.dataset_name: (file, class, the keyword arguments its __init__ takes).
LOADERS: dict[str, tuple[str, str, set[str]]] = {
    "ResponseDataset": (
        "nemo_rl/data/datasets/response_datasets/response_dataset.py",
        "ResponseDataset",
        {"data_path", "input_key", "output_key", "subset", "split", "split_validation_size", "seed"},
    ),
    "BinaryPreferenceDataset": (
        "nemo_rl/data/datasets/preference_datasets/binary_preference_dataset.py",
        "BinaryPreferenceDataset",
        {"data_path", "prompt_key", "chosen_key", "rejected_key", "subset", "split"},
    ),
}
