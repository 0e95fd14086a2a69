"""Sections of a NeMo-RL v0.7.0 config shared by the three RL steps (policy, data, reward environments, runtime).

Pure functions: groups of our validated step config in, plain dicts out. Key names and where NeMo-RL reads them are
recorded in tests/engines/nemo_rl_v070.py; docs/nemo-rl.md is the mapping table."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from nemotron.config.stepconfig import Generation, NemoRL, NemoRLTraining, Optim, TrainRuntime
from nemotron.config.workload import Rollouts, Workload
from nemotron.engines.nemo_rl import generation as gen
from nemotron.engines.nemo_rl.batches import data_parallel_ranks, even_batches, model_parallel_size

if (
    TYPE_CHECKING
):  # mypy reads steps/ as a package root; the engine gets the catalog's loaded class at run time
    from rl.rlhf.schema import Judge

    from nemotron.engines.refusals import Refusals

GRPO_BASE = "examples/configs/grpo_math_1B.yaml"
PPO_BASE = "examples/configs/ppo_math_1B.yaml"
GRPO_ENTRY = "examples/run_grpo.py"
GYM_ENTRY = "examples/nemo_gym/run_grpo_nemo_gym.py"
PPO_ENTRY = "examples/run_ppo.py"
DCP_CONVERTER = "examples/converters/convert_dcp_to_hf.py"
MEGATRON_CONVERTER = "examples/converters/convert_megatron_to_hf.py"
# NeMo-Gym's pairwise GenRM judge: its policy-model server and the resources server, by path inside NeMo-Gym.
GYM_CONFIG_PATHS = [
    "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml",
    "resources_servers/genrm_compare/configs/genrm_compare.yaml",
]
NEVER = 10_000_000_000  # "total_iters" of a scheduler that never ends
# NeMo-Gym's GenRM server (responses_api_models/genrm_model, a local_vllm_model) as genrm_compare.yaml at the Gym
# commit NeMo-RL v0.7.0 pins (3rdparty/Gym-workspace/Gym, d67ad661) sets it and our config leaves it: vLLM data
# parallel 2 x tensor parallel 4 x pipeline parallel 1 at gpu_memory_utilization 0.9. Each DP rank is a Ray placement
# group of TP x PP GPUs packed on one node (STRICT_PACK), placed on what NeMo-RL's cluster leaves of the Ray cluster.
GENRM_DP, GENRM_TP, GENRM_PP, GENRM_SHARE = 2, 4, 1, 0.9


def algorithm_section(entry: str) -> str:
    """The config section an example entry reads its loop from: NeMo-RL's examples/run_<algorithm>.py reads
    master_config.<algorithm> (run_sft.py `sft:`, run_rm.py `rm:`, run_grpo.py `grpo:`, run_ppo.py `ppo:`; the keys
    tests/engines/nemo_rl_v070.REQUIRED cites, checked against the tag)."""
    name = entry.rsplit("/", 1)[-1].removesuffix(".py")
    if not name.startswith("run_"):
        raise ValueError(f"{entry} is no NeMo-RL example entry (examples/run_<algorithm>.py)")
    return name.removeprefix("run_")


def sequence_budget(prompt_tokens: int, max_new_tokens: int) -> int:
    """NeMo-RL's policy.max_total_sequence_length: the longest prompt plus the longest response."""
    return prompt_tokens + max_new_tokens


def adamw(optim: Optim) -> dict[str, Any]:
    return {
        "name": "torch.optim.AdamW",
        "kwargs": {
            "lr": optim.lr,
            "weight_decay": optim.weight_decay,
            "betas": [optim.adam_beta1, optim.adam_beta2],
            "eps": 1e-8,
            "foreach": False,
            "fused": False,
        },
    }


def lr_schedule(optim: Optim, max_steps: int) -> list[dict[str, Any]]:
    """Our schedule (linear warm-up from lr/W at step 1 to lr at step W, then linear decay to lr * min_lr_ratio
    at the last step) as torch schedulers chained by NeMo-RL (a `milestones` entry makes a SequentialLR)."""
    warmup, ratio = int(optim.warmup_steps), float(optim.min_lr_ratio)
    after = 1.0 - (1.0 - ratio) * warmup / max_steps  # our decay factor at the end of warm-up
    decay: dict[str, Any]
    if ratio < 1.0:
        decay = {
            "name": "torch.optim.lr_scheduler.LinearLR",
            "kwargs": {"start_factor": after, "end_factor": ratio, "total_iters": max(max_steps - warmup, 1)},
        }
    else:
        decay = {
            "name": "torch.optim.lr_scheduler.ConstantLR",
            "kwargs": {"factor": 1.0, "total_iters": NEVER},
        }
    if warmup <= 1:
        return [decay, {"milestones": []}]
    warm = {
        "name": "torch.optim.lr_scheduler.LinearLR",
        "kwargs": {"start_factor": 1.0 / warmup, "end_factor": 1.0, "total_iters": warmup - 1},
    }
    return [warm, decay, {"milestones": [warmup - 1]}]


def megatron_optimizer(optim: Optim, max_steps: int) -> dict[str, Any]:
    """Megatron-Core's own optimizer and scheduler keys (policy.optimizer is null on that backend)."""
    lr, ratio, warmup = optim.lr, optim.min_lr_ratio, optim.warmup_steps
    return {
        "optimizer": {
            "optimizer": "adam",
            "lr": lr,
            "min_lr": lr * ratio,
            "weight_decay": optim.weight_decay,
            "adam_beta1": optim.adam_beta1,
            "adam_beta2": optim.adam_beta2,
            "adam_eps": 1e-8,
            "clip_grad": optim.clip_grad,
        },
        "scheduler": {
            "start_weight_decay": optim.weight_decay,
            "end_weight_decay": optim.weight_decay,
            "weight_decay_incr_style": "constant",
            "lr_decay_style": "linear" if ratio < 1.0 else "constant",
            "lr_decay_iters": max_steps,
            "lr_warmup_iters": warmup,
            "lr_warmup_init": lr / warmup if warmup > 0 else lr,
        },
    }


# runtime.precision -> policy.precision. NeMo-RL loads policies in float32 (master weights) and trains "bfloat16"
# under FSDP2's MixedPrecisionPolicy (nemo_rl/models/automodel/setup.py): our bf16-mixed. Pure bf16 weights it has
# no setting for, so that one is refused (steps._common_refusals).
PRECISION = {"fp32": "float32", "bf16-mixed": "bfloat16"}


def trainer(
    nemo: NemoRL | NemoRLTraining, optim: Optim, max_steps: int, *, packing: bool, runtime: TrainRuntime
) -> dict[str, Any]:
    """The training backend keys shared by policy.* and value.*: DTensor or Megatron-Core, parallel sizes,
    precision, activation checkpointing, optimizer, schedule. NeMo-RL reads the keys of the enabled backend only."""
    megatron = nemo.policy_backend == "megatron"
    tp, pp, cp = nemo.tensor_parallel_size, nemo.pipeline_parallel_size, nemo.context_parallel_size
    out: dict[str, Any] = {
        "precision": PRECISION.get(runtime.precision, "bfloat16"),
        "max_grad_norm": optim.clip_grad,
        "make_sequence_length_divisible_by": tp,
        "sequence_packing": {"enabled": packing},
        "dynamic_batching": {"enabled": False},
        "dtensor_cfg": {
            "enabled": not megatron,
            "tensor_parallel_size": tp,
            "context_parallel_size": cp,
            "sequence_parallel": False,
            "cpu_offload": False,
            "activation_checkpointing": runtime.gradient_checkpointing,
        },
        "megatron_cfg": {
            "enabled": megatron,
            "activation_checkpointing": runtime.gradient_checkpointing,
            "tensor_model_parallel_size": tp,
            "pipeline_model_parallel_size": pp,
            "context_parallel_size": cp,
            **megatron_optimizer(optim, max_steps),
        },
        "optimizer": None if megatron else adamw(optim),
        "scheduler": None if megatron else lr_schedule(optim, max_steps),
    }
    return out


def policy(
    *,
    model: str,
    optim: Optim,
    generation: Generation,
    nemo: NemoRL,
    max_steps: int,
    micro_batch: int,
    global_batch: int,
    nemo_gym: bool,
    runtime: TrainRuntime,
    colocated: dict[str, Any],
    async_engine: bool = False,
) -> dict[str, Any]:
    """policy.*: the model, batches, the sequence budget, the trainer and the vLLM rollout engine (`colocated`:
    where it generates, nemotron.engines.nemo_rl.generation.placement; `async_engine`: vLLM's async engine, which
    async GRPO needs, grpo.py:3364)."""
    budget = sequence_budget(nemo.max_prompt_tokens, generation.max_new_tokens)
    return {
        "model_name": model,
        # chat_template null = NeMo-RL's passthrough template: the prompt text as is, like our built-in engine.
        "tokenizer": {"name": model, "chat_template": None, "chat_template_kwargs": None},
        "train_global_batch_size": global_batch,
        "train_micro_batch_size": micro_batch,
        "logprob_batch_size": micro_batch,
        "max_total_sequence_length": budget,
        **trainer(nemo, optim, max_steps, packing=nemo.sequence_packing, runtime=runtime),
        "generation": {
            "backend": "vllm",
            "max_new_tokens": generation.max_new_tokens,
            "temperature": generation.temperature,
            "top_p": generation.top_p,
            "top_k": generation.top_k or None,
            "stop_strings": list(generation.stop_strings) or None,
            "stop_token_ids": None,
            "vllm_cfg": {
                "tensor_parallel_size": nemo.generation_tensor_parallel_size,
                "gpu_memory_utilization": nemo.gpu_memory_utilization,
                "max_model_len": budget,
                # NeMo-Gym talks to the policy through vLLM's HTTP server, which needs the async engine.
                "async_engine": nemo_gym or async_engine,
                "expose_http_server": nemo_gym,
            },
            "colocated": colocated,
        },
    }


def _data(
    train: str, validation: str | None, max_input: int | None, dataset: dict[str, Any]
) -> dict[str, Any]:
    """data.*, owned whole (`_override_`): one dataset for training and validation, read in order of the file."""
    return {
        "_override_": True,
        "max_input_seq_length": max_input,
        "shuffle": True,
        "num_workers": 1,
        "use_multiple_dataloader": False,
        "train": {"data_path": train},
        "validation": {"data_path": validation} if validation else None,
        "default": {**dataset, "prompt_file": None, "system_prompt_file": None},
    }


def prompt_data(train: str, validation: str | None, prompt_tokens: int, env_name: str) -> dict[str, Any]:
    """Our prompt JSONL read by NeMo-RL's ResponseDataset with no conversion. Rows are {"prompt": ...}; the loader
    also indexes an output column, so it reads the prompt there too (the reward-model environment never looks at it)."""
    dataset = {"dataset_name": "ResponseDataset", "input_key": "prompt", "output_key": "prompt",
               "split_validation_size": 0, "processor": "math_hf_data_processor", "env_name": env_name}  # fmt: skip
    return _data(train, validation, prompt_tokens, dataset)


def gym_data(train: str, validation: str | None) -> dict[str, Any]:
    """data.* for NeMo-Gym: rows are NeMo-Gym's own JSONL (responses_create_params ...), read verbatim."""
    dataset = {
        "dataset_name": "NemoGymDataset",
        "processor": "nemo_gym_data_processor",
        "env_name": "nemo_gym",
    }
    return _data(train, validation, None, dataset)


def reward_model_resources(nodes: int, gpus_per_node: int, reward_model_gpus: int) -> dict[str, int]:
    """The reward model's own Ray workers (nemo_rl.reward_model_gpus). NeMo-RL's GRPO setup takes these GPUs out
    of a one-node cluster, or these nodes out of a larger one (grpo.py, setup: rm_nodes / rm_gpus_per_node)."""
    if nodes == 1:
        return {"num_nodes": 1, "gpus_per_node": reward_model_gpus}
    return {"num_nodes": 1, "gpus_per_node": min(reward_model_gpus, gpus_per_node)}


def nemo_gym(config: object) -> bool:
    """Whether NeMo-Gym's GenRM judges the job (rl/rlhf's env.should_use_nemo_gym) in place of the reward model's
    own workers, which every other RL step runs."""
    return bool(getattr(getattr(config, "env", None), "should_use_nemo_gym", False))


def reward_model_gpus(config: object, nemo: NemoRL, nodes: int, gpus_per_node: int) -> int | None:
    """The GPUs of the reward model's workers NeMo-RL sets aside out of the policy's (`reward_model_resources`),
    None for a job NeMo-Gym judges: the compile, the plan and the preflight all set aside what this says, whether
    or not the plan can read the reward model's shape."""
    if nemo_gym(config):
        return None
    return reward_model_resources(nodes, gpus_per_node, nemo.reward_model_gpus)["gpus_per_node"]


def reward_model_env(
    model: str, *, micro_batch: int, budget: int, resources: dict[str, int]
) -> dict[str, Any]:
    """env.*, owned whole: NeMo-RL's reward-model environment scoring with our Bradley-Terry reward model."""
    return {
        "_override_": True,
        "reward_model": {
            "enabled": True,
            "model_name": model,
            "tokenizer": {"name": model, "chat_template": None},
            "precision": "bfloat16",
            "batch_size": micro_batch,
            "logprob_batch_size": micro_batch,
            "checkpoint_path": None,
            "max_model_len": budget,
            "offload_optimizer_for_logprob": False,
            "processor": "math_hf_data_processor",
            "resources": resources,
            "dtensor_cfg": {
                "_v2": True,
                "enabled": True,
                "cpu_offload": False,
                "sequence_parallel": False,
                "activation_checkpointing": False,
                "tensor_parallel_size": 1,
                "context_parallel_size": 1,
                "custom_parallel_plan": None,
            },
            "reward_model_cfg": {"enabled": True, "reward_model_type": "bradley_terry"},
            "dynamic_batching": {"enabled": False},
            "sequence_packing": {"enabled": False},
            "max_grad_norm": None,
        },
    }


def genrm_nodes(gpus_per_node: int) -> int | None:
    """The whole nodes NeMo-Gym's GenRM vLLM takes on nodes of `gpus_per_node` GPUs: as many DP ranks on a node as
    its GPUs hold TP x PP groups; None when one rank's group is larger than a node (STRICT_PACK cannot place it)."""
    ranks_per_node = gpus_per_node // (GENRM_TP * GENRM_PP)
    return -(-GENRM_DP // ranks_per_node) if ranks_per_node else None


def genrm_split(nodes: int, gpus_per_node: int) -> tuple[int, int] | None:
    """(NeMo-RL's cluster.num_nodes, env.nemo_gym.num_gpu_nodes) on a profile of `nodes` x `gpus_per_node`: the
    judge's nodes kept out of the policy's cluster, as NeMo-RL's own RLHF recipes do (grpo-qwen3-1.7b-2n8g-megatron-
    super-rlhf.yaml: 1 + 1 nodes; "Total SLURM nodes = cluster.num_nodes + env.nemo_gym.num_gpu_nodes"). None when
    the profile cannot hold both."""
    judge = genrm_nodes(gpus_per_node)
    return (nodes - judge, judge) if judge is not None and nodes > judge else None


def genrm_shortfall(nodes: int, gpus_per_node: int, nemo: NemoRL, apart: bool, work: Workload | None) -> str:
    """One line: why `nodes` x `gpus_per_node` cannot hold NeMo-Gym's GenRM beside the policy, and what would: a
    profile that does, a reward model judge with what else it needs to pass (`_reward_model_instead`; `apart`:
    vLLM generates on GPUs of its own, `work`: the step's, None: not known), the built-in engine."""
    group = GENRM_TP * GENRM_PP
    judge = genrm_nodes(gpus_per_node)
    have = f"{nodes} node{'s' * (nodes != 1)} x {gpus_per_node} GPU{'s' * (gpus_per_node != 1)}"
    if judge is None:
        smallest = genrm_nodes(group) or 1
        need = (f"needs {group} GPUs on one node for each of its {GENRM_DP} ranks, but the profile has {have}: use "
                f"a profile whose nodes have at least {group} GPUs (e.g. {smallest + 1} nodes x {group} GPUs: "
                f"{smallest} for the judge, 1 for the policy)")  # fmt: skip
    else:
        need = (f"needs {judge} node{'s' * (judge != 1)} of its own outside NeMo-RL's cluster "
                f"(env.nemo_gym.num_gpu_nodes) and the policy at least one more, but the profile has {have}: use a "
                f"profile of at least {judge + 1} nodes x {gpus_per_node} GPUs")  # fmt: skip
    rollouts = work if isinstance(work, Rollouts) else None
    reward_model = _reward_model_instead(nodes, gpus_per_node, nemo, apart, rollouts)
    others = [] if reward_model is None else [" ".join(["judge.kind=reward_model", *reward_model])]
    others.append("backend=builtin env.should_use_nemo_gym=false")
    return (f"NeMo-Gym's GenRM judge (vLLM DP {GENRM_DP} x TP {GENRM_TP} x PP {GENRM_PP}, genrm_compare.yaml at the "
            f"Gym commit NeMo-RL v0.7.0 pins) {need}, or {', or '.join(others)}")  # fmt: skip


def _reward_model_instead(
    nodes: int, gpus_per_node: int, nemo: NemoRL, apart: bool, rollouts: Rollouts | None
) -> list[str] | None:
    """The overrides a reward model judge needs on this profile, after env.should_use_nemo_gym=false: its workers
    set aside as NeMo-RL sets them aside (grpo.py setup: a node of its own, or nemo_rl.reward_model_gpus of a single
    one, raised where the policy's GPUs must be a multiple of its model-parallel sizes and of vLLM's TP), and a
    step's responses split evenly over the policy's ranks (batches.even_batches). None when nothing it can set
    leaves the policy GPUs it can use."""
    model_parallel = model_parallel_size(nemo)
    asked = nemo.reward_model_gpus
    for gpus in range(asked, gpus_per_node) if nodes == 1 else [asked]:
        taken = reward_model_resources(nodes, gpus_per_node, gpus)["gpus_per_node"]
        share = gen.policy_share(nemo, apart, "", cluster_nodes=nodes, gpus_per_node=gpus_per_node,
                                 reward_model_gpus=taken)  # fmt: skip
        split = share.generation
        vllm = split.gpus if isinstance(split, gen.SeparateGeneration) else share.gpus
        train = share.train_gpus
        if train < 1 or train % model_parallel or vllm % nemo.generation_tensor_parallel_size:
            continue  # NeMo-RL asserts on the split, or the preflight refuses its sizes
        ranks = data_parallel_ranks(nemo, train)
        more = [f"nemo_rl.reward_model_gpus={gpus}"] if gpus != asked else []
        even = even_batches(ranks, rollouts) if rollouts is not None else []
        return ["env.should_use_nemo_gym=false", *more, *even]
    return None


def genrm_env(judge_model: str, judge: Judge, group_size: int, num_gpu_nodes: int | None) -> dict[str, Any]:
    """env.*, owned whole: NeMo-Gym with its pairwise GenRM resources server judging each prompt's group, on
    `num_gpu_nodes` nodes of its own (None on a profile without GPUs: nothing to set aside)."""
    nodes = {} if num_gpu_nodes is None else {"num_gpu_nodes": num_gpu_nodes}
    return {
        "_override_": True,
        "should_use_nemo_gym": True,
        "nemo_gym": {
            **nodes,
            "config_paths": list(GYM_CONFIG_PATHS),
            "genrm_compare_resources_server": {
                "resources_servers": {
                    "genrm_compare": {
                        "comparison_strategy": judge.comparison_strategy,
                        # genrm_compare waits for this many rollouts of a prompt before comparing them.
                        "num_rollouts_per_prompt": group_size,
                        "default_score": judge.default_score,
                        "genrm_parse_retries": judge.max_retries,
                    }
                }
            },
            "genrm_model": {"responses_api_models": {"genrm_model": {"model": judge_model}}},
        },
    }


def runtime(job_dir: str, nodes: int, gpus_per_node: int, save_period: int) -> dict[str, Any]:
    """checkpointing.*, logger.*, cluster.*: everything under the job directory."""
    return {
        "checkpointing": {
            "enabled": True,
            "checkpoint_dir": f"{job_dir}/checkpoints/nemo_rl",
            "save_period": save_period,
            "metric_name": None,
            "keep_top_k": None,
            "model_save_format": "safetensors",
            "save_consolidated": False,
            "save_optimizer": True,
        },
        "logger": {
            "log_dir": f"{job_dir}/logs/nemo_rl",
            "tensorboard_enabled": True,
            "wandb_enabled": False,
            "mlflow_enabled": False,
            "swanlab_enabled": False,
        },
        "cluster": {"num_nodes": nodes, "gpus_per_node": gpus_per_node},
    }


def driver_command(nemo_rl_dir: str, entry: str, config_path: str, env: dict[str, str] | None = None) -> str:
    """The driver's shell command; `env` (name -> plain value) is set on it alone, as `NAME=value` words."""
    q = shlex.quote
    assigns = "".join(f"{name}={q(value)} " for name, value in sorted((env or {}).items()))
    return f"cd {q(nemo_rl_dir)} && {assigns}uv run python {q(entry)} --config {q(config_path)}"


def python_command(nemo_rl_dir: str, script: str, args: tuple[str, ...]) -> str:
    """A script of ours run with NeMo-RL's Python (the data step before the entry)."""
    q = shlex.quote
    return f"cd {q(nemo_rl_dir)} && uv run python {q(script)} " + " ".join(q(a) for a in args)


def finalize_command(
    nemo_rl_dir: str,
    checkpoint_dir: str,
    megatron: bool,
    conversions: list[tuple[str, str | None, str]],
    to_safetensors: str,
) -> str:
    """Shell: pick the newest step_N under checkpoint_dir (NeMo-RL's CheckpointManager names them so and always
    saves the last step), then convert each (component, converter config or None for the step's own config.yaml,
    HF output dir) with the tag's converter: convert_dcp_to_hf.py on <step>/<component>/weights, whose pickled
    weights the script `to_safetensors` (engines/nemo_rl/to_safetensors.py in the job dir) then rewrites as
    safetensors, or convert_megatron_to_hf.py on <step>/<component>/weights/iter_0000000."""
    q = shlex.quote
    ckpt = q(checkpoint_dir)
    newest = (
        f"n=$(for d in {ckpt}/step_*; do b=${{d##*/step_}}; case $b in ''|*[!0-9]*) ;; *) echo \"$b\";; esac; done"
        " | sort -n | tail -n 1)"
    )
    parts = [f"cd {q(nemo_rl_dir)}", newest, 'test -n "$n"', f'step={ckpt}/step_"$n"']
    for component, config, out in conversions:
        cfg = q(config) if config else '"$step"/config.yaml'
        weights = f'"$step"/{q(component)}/weights'
        if megatron:
            parts.append(
                f"uv run --extra mcore python {MEGATRON_CONVERTER} --config {cfg}"
                f" --megatron-ckpt-path {weights}/iter_0000000 --hf-ckpt-path {q(out)}"
            )
        else:
            parts.append(
                f"uv run python {DCP_CONVERTER} --config {cfg} --dcp-ckpt-path {weights} --hf-ckpt-path {q(out)}"
            )
            parts.append(f"uv run python {q(to_safetensors)} {q(out)}")
    return " && ".join(parts)


def refuse_builtin_training(c: Any, refuse: Refusals) -> None:
    """The built-in engine's training keys that NeMo-RL does its own way, for every step it trains: its sharding
    (NeMo-RL's policy backend), a precision without fp32 masters, resuming from elsewhere or by force."""
    for key in ("runtime.sharding", "runtime.fsdp_cpu_offload"):
        refuse.unless_default(
            key, "NeMo-RL shards by nemo_rl.policy_backend: DTensor (FSDP2) or Megatron-Core"
        )
    if c.runtime.precision not in PRECISION:
        refuse(
            "runtime.precision",
            "NeMo-RL keeps fp32 master weights: use bf16-mixed (its policy.precision bfloat16)",
        )
    refuse.unless_default(
        "checkpoint.resume_from", "NeMo-RL resumes only from its own checkpoint_dir in this job"
    )
    refuse.unless_default("checkpoint.force", "NeMo-RL has no check to force past")
