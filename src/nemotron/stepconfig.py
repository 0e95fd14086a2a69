"""Config groups shared by step schemas (plain pydantic, no torch: schemas load on the CLI's start-up path)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    """Every config group rejects unknown keys, so a typo is an error with a suggestion, never silently ignored."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


class ModelArch(Strict):
    """Architecture for a model built from a config (random init): the tiny GPT-2 family."""

    n_layer: int = Field(2, ge=1)
    n_embd: int = Field(64, ge=8)
    n_head: int = Field(4, ge=1)
    n_positions: int = Field(64, ge=8)


class Optim(Strict):
    lr: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    clip_grad: float = Field(1.0, gt=0, description="max global gradient norm")
    warmup_steps: int = Field(0, ge=0)
    min_lr_ratio: float = Field(
        1.0, gt=0, le=1, description="decay linearly to lr * this by the last step (1 = constant)"
    )


class Generation(Strict):
    """Sampling for rollouts. `backend: vllm` needs a GPU and the vllm package."""

    backend: Literal["torch", "vllm"] = "torch"
    temperature: float = Field(1.0, gt=0)
    top_k: int = Field(0, ge=0, description="0 = off")
    top_p: float = Field(1.0, gt=0, le=1.0)
    max_new_tokens: int = Field(16, ge=1)
    stop_strings: list[str] = Field(
        [],
        description="end a response on the token that completes one of these (kept, as in vLLM's output tokens)",
    )


class Checkpointing(Strict):
    save_interval: int = Field(0, ge=0, description="save every N steps (0 = only at the end)")
    resume: bool = Field(False, description="continue from the job's (or resume_from's) last checkpoint")
    resume_from: str | None = Field(None, description="job id or checkpoint dir to resume from")
    force: bool = Field(False, description="resume even if the checkpoint's model or config differs")


class RewardServer(Strict):
    """Where the reward model is served. With no url, local runs start rm/serve beside the trainer."""

    url: str | None = None
    token: str | None = None
    timeout_s: float = Field(30.0, gt=0)
    retries: int = Field(5, ge=0)


class Runtime(Strict):
    seed: int = 1234
    num_threads: int = Field(2, ge=1, description="torch CPU threads per process")
    device: Literal["auto", "cpu", "cuda"] = "auto"


class Evaluation(Strict):
    """Before/after evaluation on a fixed prompt subset (logged as eval_rm_*, eval_gt_*, eval_distinct_*)."""

    task: Literal["sentiment", "reverse"] | None = Field(
        None, description="task whose ground-truth scorer to report"
    )
    num_prompts: int = Field(64, ge=0, description="0 = skip evaluation")
    seed: int = 7


class NemoRL(Strict):
    """Settings only `backend: nemo_rl` reads (NeMo-RL v0.7.0 in its container). The built-in backend refuses
    non-default values here, because there they would do nothing."""

    policy_backend: Literal["dtensor", "megatron"] = Field(
        "dtensor", description="NeMo-RL's training backend: PyTorch DTensor (FSDP2) or Megatron-Core"
    )
    tensor_parallel_size: int = Field(
        1, ge=1, description="tensor-parallel size of the policy (and critic) training"
    )
    pipeline_parallel_size: int = Field(1, ge=1, description="pipeline-parallel size; Megatron-Core only")
    context_parallel_size: int = Field(1, ge=1, description="context-parallel size of the policy training")
    sequence_packing: bool = Field(
        True, description="pack several sequences into one row for the policy's passes"
    )
    generation_tensor_parallel_size: int = Field(
        1, ge=1, description="tensor-parallel size of the vLLM rollout engine"
    )
    gpu_memory_utilization: float = Field(0.6, gt=0, le=1, description="share of GPU memory vLLM may take")
    max_prompt_tokens: int = Field(
        512,
        ge=1,
        description="longest prompt in tokens; the sequence budget is this plus max_new_tokens, and longer prompts "
        "are masked out of the loss",
    )
    reward_model_gpus: int = Field(
        1,
        ge=1,
        description="GPUs of the reward model's own workers: on one node they come out of that node's GPUs, on "
        "several nodes the reward model gets a node of its own",
    )
