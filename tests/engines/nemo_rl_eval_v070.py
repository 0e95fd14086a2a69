"""What NeMo-RL v0.7.0's eval entry reads, encoded as data from a reading of its sources at the tag.

tests/engines/test_nemo_rl_eval.py checks our compiled eval config against this data, and re-reads the real files
(when the mirror is on disk) so the data cannot drift from the tag: the TypedDicts run_eval validates its config
with (`MasterConfig(**config)`, a pydantic model with extra="allow", so unknown keys pass silently and must be read
somewhere to act), the base YAML's values, and the line that reads each key we write."""

from __future__ import annotations

from typing import Any

from tests.engines.nemo_rl_v070 import read_in

ENTRY = "examples/run_eval.py"
BASE = "examples/configs/evals/eval.yaml"

# Keys of eval.yaml our config leaves to it (values as written there), and one that must not survive the merge.
BASE_KEYS: dict[str, Any] = {
    "eval.seed": 42,
    "generation.stop_token_ids": None,  # configure_generation_config puts the tokenizer's EOS there
    "generation.stop_strings": None,
    "generation.vllm_cfg.async_engine": False,  # run_env_eval then generates with generate_text (sync)
    "generation.vllm_cfg.pipeline_parallel_size": 1,
    "generation.vllm_cfg.expert_parallel_size": 1,
    "generation.vllm_cfg.gpu_memory_utilization": 0.9,
    "generation.vllm_cfg.enforce_eager": False,
    "generation.colocated.enabled": True,
    "data.dataset_name": "aime2024",  # what must NOT survive into our runs
    "env.math.num_workers": 8,
    "cluster.gpus_per_node": 1,
}

# TypedDict -> (file, {field: annotation as written}). MasterConfig's fields name the section classes.
TYPED: dict[str, tuple[str, dict[str, str]]] = {
    "MasterConfig": ("nemo_rl/evals/eval.py", {"eval": "EvalConfig", "generation": "GenerationConfig", "tokenizer": "TokenizerConfig", "data": "EvalDataConfigType", "env": "_PassThroughEnvConfig", "cluster": "ClusterConfig"}),
    "EvalConfig": ("nemo_rl/evals/eval.py", {"metric": "str", "num_tests_per_prompt": "int", "seed": "int", "k_value": "int", "save_path": "str | None"}),
    "GenerationConfig": ("nemo_rl/models/generation/interfaces.py", {"backend": "str", "max_new_tokens": "int", "temperature": "float", "top_p": "float", "top_k": "int | None", "model_name": "NotRequired[str]", "stop_token_ids": "list[int] | None", "stop_strings": "list[str] | None", "colocated": "NotRequired[ColocationConfig]", "port_range_low": "NotRequired[int]", "port_range_high": "NotRequired[int]", "use_async_rollouts": "NotRequired[bool]", "_pad_token_id": "NotRequired[int]", "_mtp_weights_from_refit": "NotRequired[bool]"}),
    "VllmSpecificArgs": ("nemo_rl/models/generation/vllm/config.py", {"tensor_parallel_size": "int", "pipeline_parallel_size": "int", "expert_parallel_size": "int", "gpu_memory_utilization": "float", "max_model_len": "int", "skip_tokenizer_init": "bool", "async_engine": "bool", "load_format": "NotRequired[str]", "precision": "NotRequired[str]", "kv_cache_dtype": "Literal['auto', 'fp8', 'fp8_e4m3']", "enforce_eager": "NotRequired[bool]", "enable_return_routed_experts": "NotRequired[bool]", "use_tqdm": "NotRequired[bool]", "expose_http_server": "NotRequired[bool]", "http_server_serving_chat_kwargs": "NotRequired[dict[str, Any]]", "tool_parser_plugin": "NotRequired[str]", "env_vars": "NotRequired[dict[str, str]]", "reasoning_parser_plugin": "NotRequired[str]"}),
    "TokenizerConfig": ("nemo_rl/models/policy/__init__.py", {"name": "str", "chat_template": "NotRequired[str]", "chat_template_kwargs": "NotRequired[dict[str, Any] | None]", "audio": "NotRequired[dict[str, Any]]", "video": "NotRequired[dict[str, Any]]", "use_processor": "NotRequired[bool]"}),
    "LocalMathEvalDataConfig": ("nemo_rl/data/__init__.py", {"max_input_seq_length": "int", "dataset_name": "str", "problem_key": "str", "solution_key": "str", "file_format": "Literal['csv', 'json']", "split": "NotRequired[str | None]", "prompt_file": "NotRequired[str | None]", "system_prompt_file": "NotRequired[str | None]"}),
    "MathEnvConfig": ("nemo_rl/environments/math_environment.py", {"num_workers": "int", "stop_strings": "NotRequired[list[str] | None]", "verifier_type": "NotRequired[str | None]", "math_verify_impl": "NotRequired[str | None]"}),
    "ClusterConfig": ("nemo_rl/distributed/virtual_cluster.py", {"gpus_per_node": "int", "num_nodes": "int", "master_port_range_low": "NotRequired[int]", "master_port_range_high": "NotRequired[int]", "segment_size": "NotRequired[int | None]"}),
}  # fmt: skip
# Which class each section of our config is validated or read as. pydantic validates `generation` as
# GenerationConfig (its vllm_cfg is an extra key there, read by VllmGeneration as VllmConfig's VllmSpecificArgs,
# whose required keys configure_generation_config partly fills in: only its declared types are checked); `data` is
# the union EvalDataConfigType, of which a path dataset_name matches LocalMathEvalDataConfig only.
SECTIONS = {
    "eval": "EvalConfig",
    "generation": "GenerationConfig",
    "generation.vllm_cfg": "VllmSpecificArgs",
    "tokenizer": "TokenizerConfig",
    "data": "LocalMathEvalDataConfig",
    "env.math": "MathEnvConfig",
    "cluster": "ClusterConfig",
}
REQUIRED_CHECKED = {
    "eval",
    "generation",
    "tokenizer",
    "data",
    "env.math",
    "cluster",
}  # what pydantic validates

# (dotted key, file, line): where the eval path reads each key our config writes.
READS = (
    read_in(
        "nemo_rl/evals/eval.py",
        ("eval.metric", 103),
        ("eval.k_value", 104),
        ("eval.num_tests_per_prompt", 105),
        ("eval.save_path", 422),
        ("generation.backend", 153),
        ("generation.temperature", 106),
        ("generation.top_k", 107),
        ("generation.num_prompts_per_step", 124),
        ("cluster.gpus_per_node", 140),
        ("cluster.num_nodes", 141),
    )
    + read_in(
        "nemo_rl/models/generation/vllm/vllm_worker.py",
        ("generation.model_name", 218),
        ("generation.max_new_tokens", 868),
        ("generation.top_p", 866),
        ("generation.vllm_cfg.precision", 224),
        ("generation.vllm_cfg.max_model_len", 449),
        ("generation.vllm_cfg.gpu_memory_utilization", 223),
    )
    + read_in(
        "nemo_rl/models/generation/vllm/vllm_generation.py", ("generation.vllm_cfg.tensor_parallel_size", 105)
    )
    + read_in(
        "nemo_rl/algorithms/utils.py",
        ("tokenizer.name", 367),
        ("tokenizer.chat_template", 374),
        ("tokenizer.chat_template_kwargs", 393),
    )
    + read_in(ENTRY, ("data.max_input_seq_length", 69))
    + read_in(
        "nemo_rl/data/datasets/eval_datasets/__init__.py",
        ("data.dataset_name", 36),
        ("data.problem_key", 102),
        ("data.solution_key", 103),
        ("data.file_format", 104),
        ("data.split", 105),
        ("data.prompt_file", 106),
        ("data.system_prompt_file", 107),
    )
    + read_in(
        "nemo_rl/environments/math_environment.py",
        ("env.math.num_workers", 350),
        ("env.math.math_verify_impl", 471),
    )
)
