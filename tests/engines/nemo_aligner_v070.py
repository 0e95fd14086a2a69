"""What NeMo-Aligner v0.7.0 reads, encoded as data from a reading of the tag's examples/nlp/gpt/ (scripts and
conf/*.yaml): the scripts our heterogeneous jobs start, and for each YAML the keys we override, with the value the
tag's file gives them (interpolations kept as text).

test_nemo_aligner.py checks every override we emit against this data (Hydra refuses a key its YAML lacks unless
it is prefixed with `+`; only the trackers' keys the YAMLs lack are prefixed, `++`, and test_remote_tracking.py checks
those against NeMo's own dataclasses), and, when the mirror is on disk, re-reads the real files at the tag
so the data cannot drift from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MIRROR = Path("/work/.mirror/NVIDIA+NeMo-Aligner/repo")
TAG = "v0.7.0"
CONF = "examples/nlp/gpt/conf"

# script (relative to the checkout, /opt/NeMo-Aligner in the NeMo container) -> the YAML its @hydra_runner loads
SCRIPTS = {
    "examples/nlp/gpt/serve_reward_model.py": "inference_rm.yaml",
    "examples/nlp/gpt/train_gpt_reinforce_actor.py": "gpt_reinforce_actor.yaml",
    "examples/nlp/gpt/serve_ppo_critic.py": "gpt_ppo_critic.yaml",
    "examples/nlp/gpt/train_gpt_ppo_actor.py": "gpt_ppo_actor.yaml",
    "examples/nlp/gpt/train_gpt_sft.py": "gpt_sft.yaml",
    "examples/nlp/gpt/train_reward_model.py": "training_rm.yaml",
    "examples/nlp/gpt/train_gpt_dpo.py": "gpt_dpo.yaml",
}

# The keys and values both actor YAMLs (gpt_reinforce_actor.yaml, gpt_ppo_actor.yaml) carry at the tag.
ACTOR_SHARED: dict[str, Any] = {
    "exp_manager.explicit_log_dir": "/results",
    "model.data.data_impl": "jsonl",
    "model.data.data_prefix": None,
    "model.global_batch_size": 64,
    "model.megatron_amp_O2": True,
    "model.micro_batch_size": 1,
    "model.optim.betas": [0.9, 0.98],
    "model.optim.lr": "9e-7",
    "model.optim.sched.min_lr": "9e-8",
    "model.optim.sched.warmup_steps": 10,
    "model.optim.weight_decay": 0.1,
}

# The keys and values the critic's YAML (gpt_ppo_critic.yaml) and both supervised trainers' YAMLs that load a .nemo by
# pretrained_checkpoint (training_rm.yaml, gpt_dpo.yaml) carry alike at the tag.
CRITIC_AND_TRAINERS: dict[str, Any] = {
    "exp_manager.explicit_log_dir": "/results",
    "model.global_batch_size": 64,
    "model.megatron_amp_O2": True,
    "model.optim.betas": [0.9, 0.98],
    "model.optim.lr": "9e-6",
    "model.optim.sched.min_lr": "9e-7",
    "model.optim.sched.warmup_steps": 10,
    "model.optim.weight_decay": 0.1,
    "model.seed": 1234,
    "pretrained_checkpoint.restore_from_path": None,
    "trainer.devices": 8,
    "trainer.precision": "bf16",
}

# conf/<file> -> {dotted key: the tag's value}
KEYS: dict[str, dict[str, Any]] = {
    "inference_rm.yaml": {
        "inference.inference_micro_batch_size": "${model.forward_micro_batch_size}",
        "inference.max_queue_delay_microseconds": 2000,
        "inference.model_name": "reward_model",
        "inference.port": 5555,
        "rm_model_file": None,
        "trainer.devices": 8,
        "trainer.num_nodes": 1,
        "trainer.precision": "bf16",
    },
    "gpt_reinforce_actor.yaml": {
        **ACTOR_SHARED,
        "exp_manager.create_wandb_logger": False,
        "exp_manager.wandb_logger_kwargs.project": "nemo_aligner_reinforce",
        "exp_manager.wandb_logger_kwargs.name": "gpt3_reinforce_2b",
        "model.reinforce.length_params.max_length": "${int_div:${model.encoder_seq_length}, 2}",
        "model.reinforce.num_rollout_samples": 512,
        "model.reinforce.num_val_samples": "${.num_rollout_samples}",
        "model.reinforce.sampling_params.end_strings": ["<|endoftext|>", "<extra_id_1>"],
        "model.reinforce.sampling_params.temperature": 1.0,
        "model.reinforce.sampling_params.top_k": 0,
        "model.reinforce.sampling_params.top_p": 1.0,
        "model.seed": 1234,
        "pretrained_checkpoint.restore_from_path": None,
        "remote_rm.reward_model.ip": "localhost",
        "remote_rm.reward_model.port": 5555,
        "trainer.devices": 8,
        "trainer.num_nodes": 8,
        "trainer.precision": "bf16",
        "trainer.reinforce.gradient_clip_val": 1.0,
        "trainer.reinforce.initial_policy_kl_penalty": 0.01,
        "trainer.reinforce.max_steps": -1,
        "trainer.reinforce.num_rollouts_per_prompt": 4,
        "trainer.reinforce.save_interval": "${.val_check_interval}",
        "trainer.reinforce.use_absolute_kl": True,
        "trainer.reinforce.val_check_interval": 10,
    },
    "gpt_ppo_critic.yaml": {
        **CRITIC_AND_TRAINERS,
        "exp_manager.checkpoint_callback_params.always_save_nemo": False,
        "model.loss_clip_val": 0.2,
        "model.micro_batch_size": 1,
        "trainer.num_nodes": 1,
        "trainer.ppo.combine_rm_and_critic_server": True,
        "trainer.ppo.gradient_clip_val": 1.0,
        "trainer.ppo.max_steps": 10000,
        "trainer.ppo.port": 5556,
    },
    "gpt_ppo_actor.yaml": {
        **ACTOR_SHARED,
        "exp_manager.create_wandb_logger": False,
        "exp_manager.wandb_logger_kwargs.project": "nemo_aligner_ppo",
        "exp_manager.wandb_logger_kwargs.name": "gpt3_ppo_2b",
        "model.ppo.entropy_bonus": 0.0,
        "model.ppo.length_params.max_length": "${int_div:${model.encoder_seq_length}, 2}",
        "model.ppo.num_rollout_samples": 512,
        "model.ppo.num_val_samples": "${.num_rollout_samples}",
        "model.ppo.ratio_eps": 0.2,
        "model.ppo.sampling_params.end_strings": ["<|endoftext|>", "<extra_id_1>"],
        "model.ppo.sampling_params.temperature": 1.0,
        "model.ppo.sampling_params.top_k": 0,
        "model.ppo.sampling_params.top_p": 1.0,
        "model.seed": 1234,
        "pretrained_checkpoint.restore_from_path": None,
        "remote_critic_rm.combine_rm_and_critic_server": True,
        "remote_critic_rm.critic.ip": "localhost",
        "remote_critic_rm.critic.port": 5556,
        "remote_critic_rm.reward_model.ip": "localhost",
        "remote_critic_rm.reward_model.port": 5555,
        "trainer.devices": 8,
        "trainer.num_nodes": 8,
        "trainer.ppo.critic_warmup_steps": 0,
        "trainer.ppo.discount_factor": 1.0,
        "trainer.ppo.gae_lambda": 0.95,
        "trainer.ppo.gradient_clip_val": 1.0,
        "trainer.ppo.initial_policy_kl_penalty": 0.01,
        "trainer.ppo.max_steps": -1,
        "trainer.ppo.normalize_advantages": True,
        "trainer.ppo.save_interval": "${.val_check_interval}",
        "trainer.ppo.use_absolute_kl": True,
        "trainer.ppo.val_check_interval": 10,
        "trainer.precision": "bf16",
    },
}


KEYS["gpt_sft.yaml"] = {
    "name": "megatron_gpt_sft",  # exp_manager.name, the final .nemo's file name
    "exp_manager.name": "${name}",
    "exp_manager.checkpoint_callback_params.save_nemo_on_train_end": False,  # we set it: the .nemo we register
    "exp_manager.create_wandb_logger": False,
    "exp_manager.explicit_log_dir": None,
    "exp_manager.wandb_logger_kwargs.name": None,
    "exp_manager.wandb_logger_kwargs.project": None,
    "model.data.sample": False,
    "model.data.train_ds.file_path": "???",
    "model.data.train_ds.global_batch_size": 128,
    "model.data.train_ds.label_key": "output",
    "model.data.train_ds.max_seq_length": "${model.encoder_seq_length}",
    "model.data.train_ds.prompt_template": "{input} {output}",
    "model.data.train_ds.truncation_field": "input",
    "model.data.validation_ds.file_path": "???",
    # validation_ds follows train_ds's columns and lengths
    "model.data.validation_ds.label_key": "${model.data.train_ds.label_key}",
    "model.data.validation_ds.prompt_template": "${model.data.train_ds.prompt_template}",
    "model.data.validation_ds.truncation_field": "${model.data.train_ds.truncation_field}",
    "model.data.validation_ds.max_seq_length": "${model.data.train_ds.max_seq_length}",
    "model.megatron_amp_O2": False,
    "model.optim.betas": [0.9, 0.98],
    "model.optim.lr": "3e-5",
    "model.optim.sched.min_lr": "9e-7",
    "model.optim.sched.warmup_steps": 10,
    "model.optim.weight_decay": 0.01,
    "model.restore_from_path": "???",
    "model.seed": 1234,
    "trainer.devices": 1,
    "trainer.num_nodes": 1,
    "trainer.precision": "bf16",
    "trainer.sft.gradient_clip_val": 1.0,
    "trainer.sft.max_steps": -1,
    "trainer.sft.save_interval": "${.val_check_interval}",
    "trainer.sft.val_check_interval": 100,
}
# The keys and values both supervised trainers' YAMLs that load a .nemo by pretrained_checkpoint (training_rm.yaml,
# gpt_dpo.yaml) carry at the tag.
TRAINER_SHARED: dict[str, Any] = {
    **CRITIC_AND_TRAINERS,
    "exp_manager.name": "megatron_gpt",  # the final .nemo's file name
    "exp_manager.checkpoint_callback_params.save_nemo_on_train_end": True,
    "exp_manager.create_wandb_logger": False,
    "model.data.data_impl": "jsonl",
    "model.data.data_prefix": None,
    "model.data.seq_length": "${model.encoder_seq_length}",
    "trainer.num_nodes": 8,
}
KEYS["training_rm.yaml"] = {
    **TRAINER_SHARED,
    "exp_manager.wandb_logger_kwargs.name": "rlhf_gpt3_rm_2b",
    "exp_manager.wandb_logger_kwargs.project": "nemo_aligner_rm",
    "model.reward_model_type": "binary_ranking",  # RewardModelDataset: chosen, rejected, chosen, ...
    "trainer.rm.gradient_clip_val": 1.0,
    "trainer.rm.max_epochs": 1,
    "trainer.rm.max_steps": -1,
    "trainer.rm.train_random_sampler": True,  # what lets max_epochs pass 1 (SupervisedTrainer.fit)
    "trainer.rm.save_interval": 100,
    "trainer.rm.val_check_interval": 100,
}
KEYS["gpt_dpo.yaml"] = {
    **TRAINER_SHARED,
    "exp_manager.wandb_logger_kwargs.name": "rlhf_gpt3_dpo",
    "exp_manager.wandb_logger_kwargs.project": "nemo_aligner_dpo",
    # the RPO losses' rewards of a line that carries none (DPOModelDataset.__getitem__): left to the YAML
    "model.data.default_chosen_reward": 1.0,
    "model.data.default_rejected_reward": 0.0,
    "model.micro_batch_size": 1,
    "model.dpo.ref_policy_kl_penalty": 0.2,
    "model.dpo.preference_average_log_probs": False,
    "model.dpo.sft_average_log_probs": "${.preference_average_log_probs}",
    "model.dpo.preference_loss": "dpo",
    "model.dpo.gt_reward_scale": 1.0,
    "model.dpo.preference_loss_weight": 1,
    "model.dpo.sft_loss_weight": 0,
    "trainer.dpo.max_epochs": 1,
    "trainer.dpo.max_steps": -1,
    "trainer.dpo.val_check_interval": 0.1,
    "trainer.dpo.save_interval": 100,
    "trainer.dpo.limit_val_batches": 1.0,
    "trainer.dpo.gradient_clip_val": 1.0,
}
# Keys a YAML lacks that its code reads with a default, so we add them (`++key`): (YAML, key) -> (file, the read).
ADDED = {
    ("gpt_dpo.yaml", "model.data.append_eod"): (
        "nemo_aligner/data/nlp/datasets.py",  # DPOModelDataset.__getitem__ (its cfg is the model's)
        'self.cfg.data.get("append_eod", False)',
    ),
}
# What model.dpo.preference_loss takes (megatron_gpt_dpo_model.py loss_func: one branch each, else
# NotImplementedError), and the dataset keys a line of its JSONL is read by (DPOModelDataset.__getitem__).
PREFERENCE_LOSSES = ("dpo", "rpo_bwd_kl", "rpo_fwd_kl", "ipo", "rpo_sq")
DPO_ROW_KEYS = ("prompt", "chosen_response", "rejected_response", "chosen_reward", "rejected_reward")


# NeMo's exp_manager at the tag NeMo-Aligner v0.7.0's Dockerfile builds on (ARG NEMO_TAG, "On: v2.1.0"), and the
# NeMo of its image (nemo:25.02, v2.2.x): ExpManagerConfig's logger fields (nemo/utils/exp_manager.py) and
# MLFlowParams' fields (nemo/utils/loggers/mlflow_logger.py). wandb_logger_kwargs is a free Dict[Any, Any] that
# Lightning's WandbLogger takes, handing keys it does not name to wandb.init.
NEMO_MIRROR = Path("/work/.mirror/NVIDIA+NeMo/repo")
NEMO_TAGS = ("v2.1.0", "v2.2.1")
EXP_MANAGER_FIELDS = {
    "create_wandb_logger",
    "wandb_logger_kwargs",
    "create_mlflow_logger",
    "mlflow_logger_kwargs",
}
MLFLOW_PARAMS = {
    "experiment_name",
    "tracking_uri",
    "tags",
    "save_dir",
    "prefix",
    "artifact_location",
    "run_id",
    "log_model",
}
WANDB_INIT_KWARGS = {"project", "name", "entity", "tags", "id"}  # wandb.init's own parameters

# What each trainer YAML gives the two things Megatron's batch rule reads where we override neither: the micro
# batch (gpt_sft.yaml: model.data.train_ds.micro_batch_size, which its model.micro_batch_size interpolates; the
# others: model.micro_batch_size) and the model-parallel sizes (TP, PP, CP), None where the YAML sets none and the
# .nemo's own count (nemotron.engines.nemo_aligner.megatron_batch).
TRAINER_BATCH: dict[str, tuple[int, tuple[int, int, int] | None]] = {
    "gpt_sft.yaml": (1, (1, 1, 1)),
    "training_rm.yaml": (2, None),
    "gpt_dpo.yaml": (1, None),
    "gpt_reinforce_actor.yaml": (1, None),
    "gpt_ppo_actor.yaml": (1, None),
    "gpt_ppo_critic.yaml": (1, None),
}
