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
}
CONVERTERS = {"examples/converters/convert_dcp_to_hf.py", "examples/converters/convert_megatron_to_hf.py"}
BASES = {"grpo": "examples/configs/grpo_math_1B.yaml", "ppo": "examples/configs/ppo_math_1B.yaml"}

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
}

# (dotted key, file, line): a key NeMo-RL indexes unconditionally on our path. The line holds the last key part.
_RUN = [
    ("logger.log_dir", "examples/run_grpo.py", 90),
    ("checkpointing.enabled", "examples/run_grpo.py", 92),
    ("policy.tokenizer", "examples/run_grpo.py", 100),
    ("policy.draft.enabled", "examples/run_grpo.py", 104),
    ("grpo.async_grpo.enabled", "examples/run_grpo.py", 159),
]
_GRPO_SETUP = [
    ("grpo.seed", "nemo_rl/algorithms/grpo.py", 308),
    ("grpo.num_prompts_per_step", "nemo_rl/algorithms/grpo.py", 331),
    ("data.use_multiple_dataloader", "nemo_rl/algorithms/grpo.py", 332),
    ("grpo.batch_multiplier", "nemo_rl/algorithms/grpo.py", 338),
    ("grpo.use_dynamic_sampling", "nemo_rl/algorithms/grpo.py", 339),
    ("data.shuffle", "nemo_rl/algorithms/grpo.py", 361),
    ("data.num_workers", "nemo_rl/algorithms/grpo.py", 364),
    ("grpo.val_period", "nemo_rl/algorithms/grpo.py", 404),
    ("grpo.val_at_start", "nemo_rl/algorithms/grpo.py", 405),
    ("grpo.val_at_end", "nemo_rl/algorithms/grpo.py", 406),
    ("grpo.num_generations_per_prompt", "nemo_rl/algorithms/grpo.py", 432),
    ("policy.train_global_batch_size", "nemo_rl/algorithms/grpo.py", 433),
    ("policy.generation.colocated.enabled", "nemo_rl/algorithms/grpo.py", 454),
    ("cluster.num_nodes", "nemo_rl/algorithms/grpo.py", 520),
    ("cluster.gpus_per_node", "nemo_rl/algorithms/grpo.py", 569),
    ("policy.generation.backend", "nemo_rl/algorithms/grpo.py", 591),
    ("policy.model_name", "nemo_rl/algorithms/grpo.py", 810),
    ("grpo.max_num_steps", "nemo_rl/algorithms/grpo.py", 820),
    ("grpo.max_num_epochs", "nemo_rl/algorithms/grpo.py", 821),
    ("policy.generation.vllm_cfg.precision", "nemo_rl/algorithms/grpo.py", 999),
    ("policy.generation.vllm_cfg.kv_cache_dtype", "nemo_rl/algorithms/grpo.py", 1003),
    ("policy.dtensor_cfg.enabled", "nemo_rl/algorithms/grpo.py", 1010),
    ("checkpointing.checkpoint_must_save_by", "nemo_rl/algorithms/grpo.py", 2148),
    ("grpo.max_rollout_turns", "nemo_rl/algorithms/grpo.py", 2385),
    ("grpo.reward_scaling", "nemo_rl/algorithms/grpo.py", 2414),
    ("grpo.reward_shaping.enabled", "nemo_rl/algorithms/grpo.py", 2417),
    ("grpo.overlong_filtering", "nemo_rl/algorithms/grpo.py", 2525),
    ("checkpointing.save_period", "nemo_rl/algorithms/grpo.py", 2875),
    ("checkpointing.metric_name", "nemo_rl/algorithms/grpo.py", 2899),
    ("logger.wandb_enabled", "nemo_rl/algorithms/grpo.py", 3019),
]
_POLICY = [  # nemo_rl/models/policy/lm_policy.py, Policy.__init__ (also built from env.reward_model)
    ("policy.megatron_cfg.tensor_model_parallel_size", "nemo_rl/models/policy/lm_policy.py", 115),
    ("policy.megatron_cfg.pipeline_model_parallel_size", "nemo_rl/models/policy/lm_policy.py", 116),
    ("policy.megatron_cfg.context_parallel_size", "nemo_rl/models/policy/lm_policy.py", 117),
    ("policy.dtensor_cfg.tensor_parallel_size", "nemo_rl/models/policy/lm_policy.py", 162),
    ("policy.dtensor_cfg.context_parallel_size", "nemo_rl/models/policy/lm_policy.py", 163),
    ("policy.dynamic_batching.enabled", "nemo_rl/models/policy/lm_policy.py", 282),
    ("policy.sequence_packing.enabled", "nemo_rl/models/policy/lm_policy.py", 310),
    ("policy.make_sequence_length_divisible_by", "nemo_rl/models/policy/lm_policy.py", 312),
    ("policy.sequence_packing.algorithm", "nemo_rl/models/policy/lm_policy.py", 314),
    (
        "policy.generation.vllm_cfg.tensor_parallel_size",
        "nemo_rl/models/generation/vllm/vllm_generation.py",
        105,
    ),
    (
        "policy.generation.vllm_cfg.pipeline_parallel_size",
        "nemo_rl/models/generation/vllm/vllm_generation.py",
        106,
    ),
    (
        "policy.generation.vllm_cfg.expert_parallel_size",
        "nemo_rl/models/generation/vllm/vllm_generation.py",
        107,
    ),
    ("policy.generation.vllm_cfg.async_engine", "nemo_rl/models/generation/vllm/vllm_generation.py", 118),
    ("policy.generation.top_k", "nemo_rl/models/generation/vllm/vllm_generation.py", 137),
    ("policy.generation.top_p", "nemo_rl/models/generation/vllm/vllm_generation.py", 143),
]
_RM_ENV = [  # nemo_rl/environments/reward_model_environment.py, RewardModelEnvironment.__init__
    ("env.reward_model.reward_model_cfg.enabled", "nemo_rl/environments/reward_model_environment.py", 102),
    (
        "env.reward_model.reward_model_cfg.reward_model_type",
        "nemo_rl/environments/reward_model_environment.py",
        106,
    ),
    ("env.reward_model.dynamic_batching.enabled", "nemo_rl/environments/reward_model_environment.py", 110),
    ("env.reward_model.sequence_packing.enabled", "nemo_rl/environments/reward_model_environment.py", 113),
    ("env.reward_model.dtensor_cfg.enabled", "nemo_rl/environments/reward_model_environment.py", 116),
    ("env.reward_model.max_grad_norm", "nemo_rl/environments/reward_model_environment.py", 119),
    ("env.reward_model.dtensor_cfg.cpu_offload", "nemo_rl/environments/reward_model_environment.py", 122),
    (
        "env.reward_model.dtensor_cfg.activation_checkpointing",
        "nemo_rl/environments/reward_model_environment.py",
        125,
    ),
    ("env.reward_model.resources.gpus_per_node", "nemo_rl/environments/reward_model_environment.py", 151),
    ("env.reward_model.resources.num_nodes", "nemo_rl/environments/reward_model_environment.py", 152),
    ("env.reward_model.tokenizer", "nemo_rl/environments/reward_model_environment.py", 164),
    # the environment hands its whole config to Policy(...): lm_policy.py reads these of it too
    ("env.reward_model.dtensor_cfg.tensor_parallel_size", "nemo_rl/models/policy/lm_policy.py", 162),
    ("env.reward_model.dtensor_cfg.context_parallel_size", "nemo_rl/models/policy/lm_policy.py", 163),
    ("env.reward_model.model_name", "nemo_rl/models/policy/lm_policy.py", 304),
    ("data.default.env_name", "nemo_rl/data/datasets/utils.py", 214),  # extract_necessary_env_names
]
_GYM = [
    ("grpo.max_val_samples", "examples/nemo_gym/run_grpo_nemo_gym.py", 170),  # must be null
    ("env.nemo_gym", "examples/nemo_gym/run_grpo_nemo_gym.py", 196),
    ("policy.generation.vllm_cfg.expose_http_server", "nemo_rl/algorithms/grpo.py", 1717),
]
_PPO = [
    ("logger.log_dir", "examples/run_ppo.py", 74),
    ("checkpointing.enabled", "examples/run_ppo.py", 76),
    ("policy.tokenizer", "examples/run_ppo.py", 84),
    ("ppo.policy_training_start_step", "nemo_rl/algorithms/ppo.py", 238),
    ("checkpointing.save_optimizer", "nemo_rl/algorithms/ppo.py", 240),
    ("value.megatron_cfg.enabled", "nemo_rl/algorithms/ppo.py", 252),
    ("value.dtensor_cfg.enabled", "nemo_rl/algorithms/ppo.py", 262),
    ("value.dtensor_cfg.context_parallel_size", "nemo_rl/algorithms/ppo.py", 270),
    ("value.dynamic_batching.enabled", "nemo_rl/algorithms/ppo.py", 274),
    ("ppo.seed", "nemo_rl/algorithms/ppo.py", 280),
    ("ppo.batch_multiplier", "nemo_rl/algorithms/ppo.py", 303),
    ("ppo.num_prompts_per_step", "nemo_rl/algorithms/ppo.py", 304),
    ("ppo.use_dynamic_sampling", "nemo_rl/algorithms/ppo.py", 305),
    ("data.shuffle", "nemo_rl/algorithms/ppo.py", 315),
    ("ppo.val_period", "nemo_rl/algorithms/ppo.py", 329),
    ("ppo.num_generations_per_prompt", "nemo_rl/algorithms/ppo.py", 358),
    ("policy.generation.colocated.enabled", "nemo_rl/algorithms/ppo.py", 370),
    ("cluster.num_nodes", "nemo_rl/algorithms/ppo.py", 380),
    ("cluster.gpus_per_node", "nemo_rl/algorithms/ppo.py", 399),
    ("ppo.ppo_epochs", "nemo_rl/algorithms/ppo.py", 448),
    ("ppo.max_num_steps", "nemo_rl/algorithms/ppo.py", 452),
    ("ppo.max_num_epochs", "nemo_rl/algorithms/ppo.py", 453),
    ("policy.dtensor_cfg.enabled", "nemo_rl/algorithms/ppo.py", 577),
    ("ppo.max_rollout_turns", "nemo_rl/algorithms/ppo.py", 1075),
    ("ppo.reward_shaping.enabled", "nemo_rl/algorithms/ppo.py", 1101),
    ("ppo.overlong_filtering", "nemo_rl/algorithms/ppo.py", 1113),
    ("checkpointing.save_period", "nemo_rl/algorithms/ppo.py", 1479),
    ("checkpointing.metric_name", "nemo_rl/algorithms/ppo.py", 1498),
    # GeneralizedAdvantageEstimator.__init__ (advantage_estimator.py)
    ("ppo.adv_estimator.gae_lambda", "nemo_rl/algorithms/advantage_estimator.py", 293),
    ("ppo.adv_estimator.gae_gamma", "nemo_rl/algorithms/advantage_estimator.py", 294),
    ("ppo.adv_estimator.normalize_advantages", "nemo_rl/algorithms/advantage_estimator.py", 295),
    ("ppo.adv_estimator.gae_lambda_value", "nemo_rl/algorithms/advantage_estimator.py", 299),
    ("ppo.adv_estimator.gae_lambda_policy", "nemo_rl/algorithms/advantage_estimator.py", 300),
    ("value_loss_fn.cliprange", "nemo_rl/algorithms/loss/loss_functions.py", 1144),
]
# GRPOAdvantageEstimator.__init__ reads these of grpo.adv_estimator (advantage_estimator.py:50-51).
_GRPO_ADV = [
    ("grpo.adv_estimator.use_leave_one_out_baseline", "nemo_rl/algorithms/advantage_estimator.py", 50),
    ("grpo.adv_estimator.normalize_rewards", "nemo_rl/algorithms/advantage_estimator.py", 51),
]

REQUIRED: dict[str, list[tuple[str, str, int]]] = {
    "grpo+reward_model": _RUN + _GRPO_SETUP + _GRPO_ADV + _POLICY + _RM_ENV,
    "grpo+nemo_gym": [r for r in _RUN if r[0] != "grpo.async_grpo.enabled"]
    + _GRPO_SETUP
    + _GRPO_ADV
    + _POLICY
    + _GYM,
    "ppo+reward_model": _PPO + [(k, f, n) for k, f, n in _POLICY] + _RM_ENV,
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
