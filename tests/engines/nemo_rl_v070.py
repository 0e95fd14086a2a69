"""What NeMo-RL v0.7.0 reads, encoded as data from a reading of its sources at the tag (file:line in comments).

The tests check our compiled configs against this data; test_nemo_rl_config.py::test_data_matches_the_tag
re-reads the real files (when the mirror is on disk) so this data cannot drift from the tag."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MIRROR = Path("/work/.mirror/NVIDIA-NeMo+RL/repo")
TAG = "v0.7.0"

# Scripts our runs start, relative to the NeMo-RL checkout (WORKDIR /opt/nemo-rl, docker/Dockerfile:112).
ENTRIES = {
    "examples/run_grpo.py",  # GRPO with data-driven environments (reward_model)
    "examples/nemo_gym/run_grpo_nemo_gym.py",  # GRPO whose rollouts and rewards go through NeMo-Gym
    "examples/run_ppo.py",  # PPO with a value model
    "examples/run_sft.py",  # SFT of a pretrained model
    "examples/run_rm.py",  # Bradley-Terry reward-model training
    "examples/run_dpo.py",  # DPO against a frozen copy of the policy
}
CONVERTERS = {"examples/converters/convert_dcp_to_hf.py", "examples/converters/convert_megatron_to_hf.py"}
BASES = {
    "grpo": "examples/configs/grpo_math_1B.yaml",
    "ppo": "examples/configs/ppo_math_1B.yaml",
    "sft": "examples/configs/sft.yaml",
    "rm": "examples/configs/rm.yaml",
    "dpo": "examples/configs/dpo.yaml",
}

# Keys of the base YAMLs that our compiled configs leave to the base (so the merged config has them).
# Values as written in the YAML; interpolations kept as text.
BASE_KEYS: dict[str, dict[str, Any]] = {
    "grpo": {
        "grpo.val_at_start": False,  # grpo_math_1B.yaml:11 (we set it; listed to check the file shape)
        "policy.precision": "bfloat16",  # grpo_math_1B.yaml:90
        "policy.draft.enabled": False,  # read by run_grpo.py:104
        "policy.sequence_packing.algorithm": "modified_first_fit_decreasing",  # lm_policy.py:314
        "policy.sequence_packing.train_mb_tokens": "${mul:${policy.max_total_sequence_length}, ${policy.train_micro_batch_size}}",
        "policy.generation.vllm_cfg.precision": "${policy.precision}",  # grpo.py:999
        "policy.generation.vllm_cfg.kv_cache_dtype": "auto",  # grpo.py:1003
        "policy.generation.vllm_cfg.pipeline_parallel_size": 1,  # vllm_generation.py:106
        "policy.generation.vllm_cfg.expert_parallel_size": 1,  # vllm_generation.py:107
        "policy.megatron_cfg.optimizer.bf16": True,
        "policy.megatron_cfg.distributed_data_parallel_config.overlap_grad_reduce": True,
        "loss_fn.kl_input_clamp_value": 20.0,
        "loss_fn.kl_output_clamp_value": 10.0,
        "checkpointing.higher_is_better": True,
        "checkpointing.checkpoint_must_save_by": None,  # grpo.py:2148
        "logger.monitor_gpus": True,
        "logger.gpu_monitoring.collection_interval": 10,
        "logger.num_val_samples_to_print": 0,
        # a server of the base's own: our runs must set it to null when tracking.mlflow.tracking_uri is unset
        "logger.mlflow.tracking_uri": "http://localhost:5000",
        "logger.wandb.name": "grpo-dev-logger",
        "data.train.dataset_name": "OpenMathInstruct-2",  # what must NOT survive into our runs
        "data.default.env_name": "math",
        "env.math.num_workers": 8,
    },
    "ppo": {
        "policy.precision": "bfloat16",
        "policy.sequence_packing.algorithm": "modified_first_fit_decreasing",
        "policy.generation.vllm_cfg.precision": "${policy.precision}",  # ppo.py:566
        "policy.generation.vllm_cfg.kv_cache_dtype": "auto",  # ppo.py:570
        "policy.generation.vllm_cfg.pipeline_parallel_size": 1,
        "policy.generation.vllm_cfg.expert_parallel_size": 1,
        "value.dtensor_cfg._v2": True,
        "value.megatron_cfg.optimizer.bf16": True,
        "value.sequence_packing.algorithm": "modified_first_fit_decreasing",
        "loss_fn.kl_input_clamp_value": 20.0,
        "checkpointing.checkpoint_must_save_by": None,  # ppo.py:887
        "logger.monitor_gpus": False,
        "ppo.reward_shaping.enabled": True,  # the base turns DAPO shaping on: our configs must turn it off
        "ppo.reward_scaling.enabled": True,
        "ppo.skip_reference_policy_logprobs_calculation": True,
        "data.train.dataset_name": "DAPOMath17K",
        "env.math.math_verify_impl": "dapo_math_verify",
    },
    "sft": {
        "policy.train_micro_batch_size": 1,  # left to the base: one record per micro-batch (the plan's too)
        "policy.dtensor_cfg._v2": True,
        "policy.sequence_packing.algorithm": "modified_first_fit_decreasing",  # lm_policy.py:314
        "checkpointing.checkpoint_must_save_by": None,  # sft.py:388
        # an interpolation our owned data section must still resolve (OmegaConf resolve=True, run_sft.py:174)
        "logger.wandb.name": "sft-dev-${data.train.dataset_name}",
        "logger.mlflow.tracking_uri": "http://localhost:5000",
        "data.train.dataset_name": "squad",  # what must NOT survive into our runs
        "data.default.processor": "sft_processor",
    },
    "rm": {
        "policy.train_micro_batch_size": 1,
        "policy.reward_model_cfg.enabled": True,  # run_rm.py:65 asserts it
        "policy.reward_model_cfg.reward_model_type": "bradley_terry",
        "checkpointing.checkpoint_must_save_by": None,  # rm.py:466
        "logger.wandb.name": "rm-dev-${data.train.dataset_name}",
        "data.train.dataset_name": "HelpSteer3",  # what must NOT survive into our runs
    },
    "dpo": {
        "policy.megatron_cfg.use_linear_ce_fusion_loss": False,  # dpo.py:287 reads it with Megatron on
        "checkpointing.checkpoint_must_save_by": None,  # dpo.py:534
        # the base ranks checkpoints by a validation metric and keeps 3: ours keep every one (metric_name null)
        "checkpointing.metric_name": "val:validation-default_loss",
        "checkpointing.keep_top_k": 3,
        "logger.wandb.name": "dpo",
        "logger.mlflow.tracking_uri": "http://localhost:5000",
        # the base's own loss settings, every one of which we set (dpo.sft_average_log_probs interpolates)
        "dpo.reference_policy_kl_penalty": 0.05,
        "dpo.sft_average_log_probs": "${.preference_average_log_probs}",
        "data.train.dataset_name": "HelpSteer3",  # what must NOT survive into our runs
    },
}


# The YAML at the tag that writes each key NeMo-RL reads (REQUIRED below): the algorithm's base (BASES), except the
# keys under these prefixes, which the bases leave out. test_data_matches_the_tag walks every dotted key there.
KEY_YAMLS = {
    "env.reward_model": "examples/configs/grpo_rm_1B.yaml",  # the reward-model environment's example
    "env.nemo_gym": "examples/nemo_gym/grpo_workplace_assistant_nemotron_nano_v2_9b.yaml",  # NeMo-Gym's example
    # NeMo-RL's own 2-node RLHF recipe: 1 node of policy (cluster.num_nodes) + 1 of NeMo-Gym's GenRM
    "env.nemo_gym.num_gpu_nodes": "examples/configs/recipes/llm/grpo-qwen3-1.7b-2n8g-megatron-super-rlhf.yaml",
    "policy.generation.vllm_cfg.expose_http_server": "examples/nemo_gym/grpo_workplace_assistant_nemotron_nano_v2_9b.yaml",
}


def yaml_of(dotted: str, alg: str) -> str:
    """The YAML at the tag that writes `dotted` (KEY_YAMLS by the longest prefix, else the algorithm's base)."""
    prefixes = [p for p in KEY_YAMLS if dotted == p or dotted.startswith(p + ".")]
    return KEY_YAMLS[max(prefixes, key=len)] if prefixes else BASES[alg]


def read_in(file: str, *refs: tuple[str, int]) -> list[tuple[str, str, int]]:
    """(dotted key, file, line) of each (dotted key, line) read in `file`."""
    return [(key, file, line) for key, line in refs]


# (dotted key, file, line): a key NeMo-RL indexes unconditionally on our path. The line reads the key's last part, as
# the end of a chain of subscripts (`cfg["vllm_cfg"]["precision"]`, `.get("...")`) that is a suffix of the dotted key.
_RUN = read_in(
    "examples/run_grpo.py",
    ("logger.log_dir", 90),
    ("checkpointing.enabled", 92),
    ("policy.tokenizer", 100),
    ("policy.draft.enabled", 104),
    ("grpo.async_grpo.enabled", 159),
)
_GRPO_SETUP = read_in(
    "nemo_rl/algorithms/grpo.py",
    ("grpo.seed", 308),
    ("grpo.num_prompts_per_step", 331),
    ("data.use_multiple_dataloader", 332),
    ("grpo.batch_multiplier", 338),
    ("grpo.use_dynamic_sampling", 339),
    ("data.shuffle", 361),
    ("data.num_workers", 364),
    ("grpo.val_period", 404),
    ("grpo.val_at_start", 405),
    ("grpo.val_at_end", 406),
    ("grpo.num_generations_per_prompt", 432),
    ("policy.train_global_batch_size", 433),
    ("policy.generation.colocated.enabled", 454),
    ("cluster.num_nodes", 520),
    ("cluster.gpus_per_node", 569),
    ("policy.generation.backend", 591),
    ("policy.model_name", 810),
    ("grpo.max_num_steps", 820),
    ("grpo.max_num_epochs", 821),
    ("policy.generation.vllm_cfg.precision", 999),
    ("policy.generation.vllm_cfg.kv_cache_dtype", 1003),
    ("policy.dtensor_cfg.enabled", 1010),
    ("checkpointing.checkpoint_must_save_by", 2148),
    ("grpo.max_rollout_turns", 2385),
    ("grpo.reward_scaling", 2414),
    ("grpo.reward_shaping.enabled", 2417),
    ("grpo.overlong_filtering", 2525),
    ("checkpointing.save_period", 2875),
    ("checkpointing.metric_name", 2899),
    ("logger.wandb_enabled", 3019),
)
# Policy.__init__ (also built from env.reward_model)
_POLICY = read_in(
    "nemo_rl/models/policy/lm_policy.py",
    ("policy.megatron_cfg.tensor_model_parallel_size", 115),
    ("policy.megatron_cfg.pipeline_model_parallel_size", 116),
    ("policy.megatron_cfg.context_parallel_size", 117),
    ("policy.dtensor_cfg.tensor_parallel_size", 162),
    ("policy.dtensor_cfg.context_parallel_size", 163),
    ("policy.dynamic_batching.enabled", 282),
    ("policy.sequence_packing.enabled", 310),
    ("policy.make_sequence_length_divisible_by", 312),
    ("policy.sequence_packing.algorithm", 314),
) + read_in(
    "nemo_rl/models/generation/vllm/vllm_generation.py",
    ("policy.generation.vllm_cfg.tensor_parallel_size", 105),
    ("policy.generation.vllm_cfg.pipeline_parallel_size", 106),
    ("policy.generation.vllm_cfg.expert_parallel_size", 107),
    ("policy.generation.vllm_cfg.async_engine", 118),
    ("policy.generation.top_k", 137),
    ("policy.generation.top_p", 143),
)
# RewardModelEnvironment.__init__
_RM_ENV = (
    read_in(
        "nemo_rl/environments/reward_model_environment.py",
        ("env.reward_model.reward_model_cfg.enabled", 102),
        ("env.reward_model.reward_model_cfg.reward_model_type", 106),
        ("env.reward_model.dynamic_batching.enabled", 110),
        ("env.reward_model.sequence_packing.enabled", 113),
        ("env.reward_model.dtensor_cfg.enabled", 116),
        ("env.reward_model.max_grad_norm", 119),
        ("env.reward_model.dtensor_cfg.cpu_offload", 122),
        ("env.reward_model.dtensor_cfg.activation_checkpointing", 125),
        ("env.reward_model.resources.gpus_per_node", 151),
        ("env.reward_model.resources.num_nodes", 152),
        ("env.reward_model.tokenizer", 164),
    )
    + read_in(
        "nemo_rl/models/policy/lm_policy.py",
        # the environment hands its whole config to Policy(...): lm_policy.py reads these of it too
        ("env.reward_model.dtensor_cfg.tensor_parallel_size", 162),
        ("env.reward_model.dtensor_cfg.context_parallel_size", 163),
        ("env.reward_model.model_name", 304),
    )
    + read_in(
        "nemo_rl/data/datasets/utils.py",
        ("data.default.env_name", 214),  # extract_necessary_env_names
    )
)
_GYM = read_in(
    "examples/nemo_gym/run_grpo_nemo_gym.py",
    ("grpo.max_val_samples", 170),  # must be null
    ("env.nemo_gym", 196),
) + read_in(
    "nemo_rl/algorithms/grpo.py",
    ("env.nemo_gym.num_gpu_nodes", 464),  # the GenRM's nodes: only the NemoGym actor's node affinity reads it
    ("policy.generation.vllm_cfg.expose_http_server", 1717),
)
_PPO = (
    read_in(
        "examples/run_ppo.py",
        ("logger.log_dir", 74),
        ("checkpointing.enabled", 76),
        ("policy.tokenizer", 84),
    )
    + read_in(
        "nemo_rl/algorithms/ppo.py",
        ("ppo.policy_training_start_step", 238),
        ("checkpointing.save_optimizer", 240),
        ("value.megatron_cfg.enabled", 252),
        ("value.dtensor_cfg.enabled", 262),
        ("value.dtensor_cfg.context_parallel_size", 270),
        ("value.dynamic_batching.enabled", 274),
        ("ppo.seed", 280),
        ("ppo.batch_multiplier", 303),
        ("ppo.num_prompts_per_step", 304),
        ("ppo.use_dynamic_sampling", 305),
        ("data.shuffle", 315),
        ("ppo.val_period", 329),
        ("ppo.num_generations_per_prompt", 358),
        ("policy.generation.colocated.enabled", 370),
        ("cluster.num_nodes", 380),
        ("cluster.gpus_per_node", 399),
        ("ppo.ppo_epochs", 448),
        ("ppo.max_num_steps", 452),
        ("ppo.max_num_epochs", 453),
        ("policy.dtensor_cfg.enabled", 577),
        ("ppo.max_rollout_turns", 1075),
        ("ppo.reward_shaping.enabled", 1101),
        ("ppo.overlong_filtering", 1113),
        ("checkpointing.save_period", 1479),
        ("checkpointing.metric_name", 1498),
    )
    + read_in(
        "nemo_rl/algorithms/advantage_estimator.py",
        # GeneralizedAdvantageEstimator.__init__
        ("ppo.adv_estimator.gae_lambda", 293),
        ("ppo.adv_estimator.gae_gamma", 294),
        ("ppo.adv_estimator.normalize_advantages", 295),
        ("ppo.adv_estimator.gae_lambda_value", 299),
        ("ppo.adv_estimator.gae_lambda_policy", 300),
    )
    + read_in(
        "nemo_rl/algorithms/loss/loss_functions.py",
        ("value_loss_fn.cliprange", 1144),
    )
)
# GRPOAdvantageEstimator.__init__ reads these of grpo.adv_estimator (advantage_estimator.py:50-51).
_GRPO_ADV = read_in(
    "nemo_rl/algorithms/advantage_estimator.py",
    ("grpo.adv_estimator.use_leave_one_out_baseline", 50),
    ("grpo.adv_estimator.normalize_rewards", 51),
)

# run_sft.py / run_rm.py build the same Policy (lm_policy.py) from policy.*; the vLLM lines are the RL steps' only.
_TRAIN_POLICY = [r for r in _POLICY if r[1] == "nemo_rl/models/policy/lm_policy.py"]
_SFT = (
    read_in(
        "examples/run_sft.py",
        ("data.train", 72),
        ("data.default", 77),
        ("data.add_bos", 84),
        ("data.add_eos", 85),
        ("data.add_generation_prompt", 86),
        ("data.max_input_seq_length", 99),
        ("logger.log_dir", 185),
        ("checkpointing.enabled", 187),
        ("policy.tokenizer", 195),
    )
    + read_in(
        "nemo_rl/algorithms/sft.py",
        # SFTConfig (a pydantic model with defaults): every field is set, none left to its default
        ("sft.max_num_steps", 66),
        ("sft.max_num_epochs", 67),
        ("sft.val_period", 68),
        ("sft.val_batches", 69),
        ("sft.val_global_batch_size", 70),
        ("sft.val_micro_batch_size", 71),
        ("sft.val_at_start", 72),
        ("sft.val_at_end", 75),
        ("sft.seed", 76),
        ("sft.only_unmask_final", 77),
        ("policy.train_global_batch_size", 156),
        ("data.shuffle", 157),
        ("data.num_workers", 160),
        ("cluster.num_nodes", 182),
        ("cluster.gpus_per_node", 187),
        ("policy.megatron_cfg.enabled", 230),
        ("checkpointing.checkpoint_must_save_by", 388),
        ("checkpointing.save_period", 525),
        ("checkpointing.metric_name", 540),
    )
    + _TRAIN_POLICY
)
_RM = (
    read_in(
        "examples/run_rm.py",
        ("policy.reward_model_cfg.enabled", 65),
        ("logger.log_dir", 67),
        ("checkpointing.enabled", 69),
        ("policy.tokenizer", 77),
    )
    + read_in(
        "nemo_rl/algorithms/rm.py",
        ("rm.seed", 120),
        ("policy.dtensor_cfg.enabled", 128),
        ("policy.dtensor_cfg.context_parallel_size", 129),
        ("policy.train_global_batch_size", 169),
        ("data.shuffle", 170),
        ("data.num_workers", 180),
        ("rm.val_global_batch_size", 189),
        ("cluster.num_nodes", 209),
        ("cluster.gpus_per_node", 214),
        ("checkpointing.checkpoint_must_save_by", 466),
        ("rm.val_period", 486),
        ("rm.val_at_start", 487),
        ("rm.val_at_end", 488),
        ("rm.max_num_epochs", 489),
        ("rm.val_batches", 501),
        ("rm.val_micro_batch_size", 503),
        ("rm.max_num_steps", 511),
        ("policy.train_micro_batch_size", 533),
        ("checkpointing.save_period", 582),
    )
    + read_in(
        "nemo_rl/data/utils.py",  # setup_preference_data
        ("data.train", 315),
        ("data.max_input_seq_length", 328),
        ("data.validation", 368),
    )
    # rm.yaml has no sequence_packing.algorithm: lm_policy.py reads it only with packing on, which rm/train refuses
    + [r for r in _TRAIN_POLICY if r[0] != "policy.sequence_packing.algorithm"]
)

# async GRPO (grpo.async_grpo.enabled) with vLLM on GPUs of its own: what the async path reads besides the above
_ASYNC = read_in(
    "nemo_rl/algorithms/grpo.py",
    ("policy.generation.colocated.resources", 610),  # setup, non-colocated: the generation's own resources
    ("policy.generation.colocated.resources.gpus_per_node", 611),
    ("policy.generation.colocated.resources.num_nodes", 612),
    ("policy.generation.vllm_cfg.async_engine", 1662),  # _should_use_async_rollouts, asserted at :3364
    ("grpo.async_grpo.max_trajectory_age_steps", 3383),  # async_grpo_train
    ("grpo.async_grpo.in_flight_weight_updates", 3384),
    ("policy.generation.colocated.enabled", 3416),  # asserted false at :3421
) + read_in(
    "nemo_rl/algorithms/async_utils/trajectory_collector.py",
    ("grpo.async_grpo.in_flight_weight_updates", 492),  # prepare_for_refit: swap weights mid-generation
)
_ASYNC_RUN = read_in(
    "examples/run_grpo.py",
    ("data.use_multiple_dataloader", 183),  # refused with async at the tag; ours is false
    ("grpo.async_grpo.max_trajectory_age_steps", 207),
)
_ASYNC_GYM = read_in(
    "examples/nemo_gym/run_grpo_nemo_gym.py",
    ("grpo.async_grpo.enabled", 232),
    ("grpo.async_grpo.max_trajectory_age_steps", 280),
)
_DPO = (
    read_in(
        "examples/run_dpo.py",
        ("logger.log_dir", 64),
        ("checkpointing.enabled", 66),
        ("policy.tokenizer", 74),
    )
    + read_in(
        "nemo_rl/algorithms/dpo.py",
        # DPOConfig (a pydantic model with defaults): every field is set, none left to the base's
        ("dpo.max_num_epochs", 62),
        ("dpo.max_num_steps", 63),
        ("dpo.val_period", 64),
        ("dpo.val_batches", 65),
        ("dpo.val_global_batch_size", 66),
        ("dpo.val_micro_batch_size", 67),
        ("dpo.val_at_start", 68),
        ("dpo.val_at_end", 71),
        ("dpo.seed", 72),
        ("dpo.reference_policy_kl_penalty", 74),
        ("dpo.preference_average_log_probs", 75),
        ("dpo.sft_average_log_probs", 76),
        ("dpo.preference_loss_weight", 81),
        ("dpo.sft_loss_weight", 82),
        ("policy.dynamic_batching.enabled", 147),  # asserted off
        ("policy.sequence_packing.enabled", 151),  # asserted off
        ("policy.train_global_batch_size", 197),
        ("data.shuffle", 198),
        ("policy.make_sequence_length_divisible_by", 203),
        ("data.num_workers", 208),
        ("cluster.num_nodes", 237),
        ("cluster.gpus_per_node", 242),
        ("policy.megatron_cfg.enabled", 286),
        ("policy.train_micro_batch_size", 317),
        ("checkpointing.checkpoint_must_save_by", 534),
        ("checkpointing.save_period", 648),
        ("checkpointing.metric_name", 682),
    )
    + [r for r in _RM if r[1] == "nemo_rl/data/utils.py"]  # setup_preference_data, as run_rm.py's
    # dpo.yaml has no sequence_packing.algorithm: lm_policy.py reads it only with packing on, which DPO refuses
    + [r for r in _TRAIN_POLICY if r[0] != "policy.sequence_packing.algorithm"]
)

REQUIRED: dict[str, list[tuple[str, str, int]]] = {
    "sft": _SFT,
    "rm": _RM,
    "dpo": _DPO,
    "grpo+reward_model": _RUN + _GRPO_SETUP + _GRPO_ADV + _POLICY + _RM_ENV,
    "grpo+nemo_gym": [r for r in _RUN if r[0] != "grpo.async_grpo.enabled"]
    + _GRPO_SETUP
    + _GRPO_ADV
    + _POLICY
    + _GYM,
    "ppo+reward_model": _PPO + [(k, f, n) for k, f, n in _POLICY] + _RM_ENV,
}
REQUIRED["grpo+reward_model+async"] = REQUIRED["grpo+reward_model"] + _ASYNC + _ASYNC_RUN
REQUIRED["grpo+nemo_gym+async"] = REQUIRED["grpo+nemo_gym"] + _ASYNC + _ASYNC_GYM

# TypedDicts of the sections async GRPO adds (extra keys would be silently ignored): AsyncGRPOConfig
# (nemo_rl/algorithms/grpo.py:136) and the non-colocated generation's OptionalResourcesConfig
# (nemo_rl/models/generation/interfaces.py:107, ColocationConfig.resources)
TYPED_DICTS = {
    ("nemo_rl/algorithms/grpo.py", "AsyncGRPOConfig"): {
        "enabled",
        "max_trajectory_age_steps",
        "in_flight_weight_updates",
        "recompute_kv_cache_after_weight_updates",
    },
    ("nemo_rl/models/generation/interfaces.py", "OptionalResourcesConfig"): {"gpus_per_node", "num_nodes"},
    ("nemo_rl/models/generation/interfaces.py", "ColocationConfig"): {"enabled", "resources"},
}

# ClippedPGLossConfig (loss_functions.py:101-157) is a pydantic model with a default for every field;
# loss_fn.reference_policy_kl_type accepts these (nemo_rl/algorithms/utils.py calculate_kl docstring).
KL_TYPES = ("k1", "k2", "k3")
LOSS_FIELDS = {
    "disable_ppo_ratio",
    "token_level_loss",
    "sequence_level_importance_ratios",
    "ratio_clip_min",
    "ratio_clip_max",
    "ratio_clip_c",
    "reference_policy_kl_penalty",
    "reference_policy_kl_type",
    "kl_input_clamp_value",
    "kl_output_clamp_value",
    "use_kl_in_reward",
    "use_importance_sampling_correction",
    "truncated_importance_sampling_type",
    "truncated_importance_sampling_ratio",
    "truncated_importance_sampling_ratio_min",
    "use_on_policy_kl_approximation",
    "force_on_policy_ratio",
    "use_cispo",
    "positive_example_nll_weight",
}
VALUE_LOSS_FIELDS = {"scale", "cliprange"}  # MseValueLossConfig, extra="forbid" (loss_functions.py:1138)


# The keys of `logger:` NeMo-RL declares (nemo_rl/utils/logger.py: LoggerConfig and the TypedDicts of its sections).
# WandbLogger hands its section to wandb.init(**cfg) (logger.py:209), so an undeclared key would reach wandb.init
# too; we emit declared keys only and pass the rest as the variables MLflow's and W&B's clients read.
LOGGER_KEYS: dict[str, set[str]] = {
    "LoggerConfig": {
        "log_dir",
        "wandb_enabled",
        "swanlab_enabled",
        "tensorboard_enabled",
        "mlflow_enabled",
        "wandb",
        "tensorboard",
        "swanlab",
        "mlflow",
        "monitor_gpus",
        "gpu_monitoring",
        "num_val_samples_to_print",
    },
    "WandbConfig": {"project", "name", "entity"},
    "MLflowConfig": {"experiment_name", "run_id", "run_name", "tracking_uri", "artifact_location"},
    "TensorboardConfig": {"log_dir"},
    "SwanlabConfig": {"project", "name"},
    "GPUMonitoringConfig": {"collection_interval", "flush_interval"},
}
LOGGER_SECTIONS = {  # LoggerConfig's key -> the TypedDict of its section
    "wandb": "WandbConfig",
    "mlflow": "MLflowConfig",
    "tensorboard": "TensorboardConfig",
    "swanlab": "SwanlabConfig",
    "gpu_monitoring": "GPUMonitoringConfig",
}

# NeMo-Gym, as the tag pins it (a submodule) and as its GenRM judge is placed (nemotron.engines.nemo_rl.sections.GENRM_*)
GYM_MIRROR = Path("/work/.mirror/NVIDIA-NeMo+Gym/repo")
GYM_SUBMODULE = "3rdparty/Gym-workspace/Gym"
GYM_COMMIT = "d67ad6611cfe21dbaeb301c59e59df32ce22ec50"
# resources_servers/genrm_compare/configs/genrm_compare.yaml at GYM_COMMIT, genrm_model.responses_api_models.genrm_model
GENRM_YAML = "resources_servers/genrm_compare/configs/genrm_compare.yaml"
GENRM_SERVE = {
    "vllm_serve_kwargs.data_parallel_size": 2,
    "vllm_serve_kwargs.tensor_parallel_size": 4,
    "vllm_serve_kwargs.pipeline_parallel_size": 1,
    "vllm_serve_kwargs.gpu_memory_utilization": 0.9,
    "vllm_serve_env_vars.VLLM_RAY_DP_PACK_STRATEGY": "strict",  # each DP rank's TP x PP GPUs packed on one node
}
# responses_api_models/local_vllm_model/app.py at GYM_COMMIT: the first rank's placement group, TP x PP GPUs,
# STRICT_PACK under the "strict" strategy (_select_vllm_server_head_node)
GENRM_PLACEMENT = (
    "responses_api_models/local_vllm_model/app.py",
    ('placement_strategy = "STRICT_PACK"', "pipeline_parallel_size * server_args.tensor_parallel_size"),
)
# NeMo-RL's own recipes with NeMo-Gym judges on nodes of their own: (file, its name's node count); their cluster.num_nodes
# + env.nemo_gym.num_gpu_nodes is that count ("Total SLURM nodes = cluster.num_nodes (1) + env.nemo_gym.num_gpu_nodes
# (5) = 6", grpo-qwen3-1.7b-6n8g-megatron-super-rlvr.yaml:87)
GYM_RECIPES = {
    "examples/configs/recipes/llm/grpo-qwen3-1.7b-2n8g-megatron-super-rlhf.yaml": 2,
    "examples/configs/recipes/llm/grpo-qwen3-1.7b-6n8g-megatron-super-rlvr.yaml": 6,
}
