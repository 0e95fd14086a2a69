"""Config groups of the steps that sample and score rollouts (rl/reinforce, rl/ppo, rl/rlhf; eval/policy samples
through `GenerationEngine`). Step schemas import them from `nemotron.config.stepconfig`, with the groups every
step shares."""

# ruff: noqa: RUF012  (a list or dict default below is a pydantic field default, copied for each instance; ruff
# cannot tell that Strict, imported, is a pydantic model)

from typing import Any, Literal, Self

from pydantic import Field, model_validator

from nemotron.config.strict import Strict
from nemotron.config.workload import Rollouts


class GenerationEngine(Strict):
    """Which engine generates: the `generation.backend` keys every step that samples shares (the RL steps'
    rollouts, eval/policy's answers), read by `nemotron.rl.generation_backends`."""

    backend: Literal["torch", "vllm"] = "torch"
    """who generates: our torch sampler, or a vLLM engine in the step's process (in the RL steps colocated
    with the trainer, its weights synced in memory after every optimizer step; CUDA, or vLLM's CPU build in
    .venv-vllm)"""
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    """with backend vllm: the share of GPU memory vLLM takes for weights and KV cache (on vLLM's CPU build,
    the share of the CPU's memory); the rest is the trainer's, or the scoring models' (NeMo-RL:
    vllm_cfg.gpu_memory_utilization)"""
    vllm_max_model_len: int = Field(0, ge=0)
    """with backend vllm: the longest prompt plus response vLLM plans for (0 = the model's context length;
    NeMo-RL: vllm_cfg.max_model_len)"""

    @model_validator(mode="after")
    def _vllm_keys_need_vllm(self) -> Self:
        """Accepted-but-ignored is refused: the vllm_* keys act only with backend vllm."""
        if self.backend != "vllm" and (
            self.vllm_gpu_memory_utilization != 0.3 or self.vllm_max_model_len != 0
        ):
            raise ValueError("vllm_gpu_memory_utilization and vllm_max_model_len act only with backend: vllm")
        return self

    def vllm_share(self) -> float | None:
        """The device share a colocated vLLM keeps the whole run; None when our sampler generates."""
        return self.vllm_gpu_memory_utilization if self.backend == "vllm" else None


class Generation(GenerationEngine):
    """Sampling for rollouts: our torch sampler, or a vLLM engine in the trainer's process (docs/vllm.md)."""

    temperature: float = Field(1.0, gt=0)
    """sampling temperature; log-probs for the loss are divided by it too (NeMo-Aligner:
    sampling_params.temperature)"""
    top_k: int = Field(0, ge=0)
    """sample from the k most likely tokens only (0 = off)"""
    top_p: float = Field(1.0, gt=0, le=1.0)
    """nucleus sampling: the smallest token set with this much mass (1 = off)"""
    max_new_tokens: int = Field(16, ge=1)
    """longest response in tokens; longer ones are cut and count as not ended (NeMo-Aligner:
    length_params.max_length)"""
    stop_strings: list[str] = []
    """end a response on the token that completes one of these strings; that token is kept, as in vLLM's
    output tokens (NeMo-Aligner: sampling_params.end_strings)"""

    def rollouts(
        self, micro_batch: tuple[str, int], prompts: tuple[str, int], per_prompt: int,
        global_batch: tuple[str, int] | None = None,
    ) -> Rollouts:  # fmt: skip
        """The work of one step that samples `per_prompt` responses to each prompt with this group, as the resource
        plan reads it; `micro_batch` (responses per forward/backward pass), `prompts` (prompts per step) and
        `global_batch` (responses per update, where the step sets it) are each (the config key that sets it, its
        value)."""
        (micro_key, micro), (prompts_key, count) = micro_batch, prompts
        share = self.vllm_share()
        return Rollouts(
            micro_key, micro, prompts_key, count, count * per_prompt, self.max_new_tokens, share, global_batch
        )


class RewardServer(Strict):
    """Where the reward model is served. With no url, local runs start rm/serve beside the trainer."""

    url: str | None = None
    """base URL of a running rm/serve (http://host:port); unset: $NEMOTRON_REWARD_URL (a Slurm hetjob's
    server), else a sibling rm/serve on a free loopback port (NeMo-Aligner: remote_rm.reward_model.ip/port)"""
    token_file: str | None = None
    """file (mode 0600) holding the bearer token for url; unset: $NEMOTRON_REWARD_TOKEN. Never the token
    itself: a command line is visible in ps"""
    timeout_s: float = Field(30.0, gt=0)
    """seconds to wait for one scoring request"""
    retries: int = Field(5, ge=0)
    """re-sends, with exponential backoff, of a request that failed (connection error, timeout or 5xx answer)
    """


class RLInputs(Strict):
    """The artifacts rl/reinforce and rl/ppo read: an artifact reference (name:latest, name:vN, name@alias,
    art://...) or a path."""

    prompts: str | None = None
    """prompt JSONL, one {prompt} per line (prompt_jsonl): artifact ref or path"""
    policy: str | None = None
    """the SFT policy (checkpoint_hf) to align; it also starts the frozen initial (reference) policy"""
    reward_model: str | None = None
    """the reward model (reward_model_hf): served by rm/serve, or loaded with reward.source=in_process; rl/ppo
    also initialises its critic from it (backbone and head)"""


class RLTrainer(Strict):
    """The rollout + update loop of rl/reinforce and rl/ppo (NeMo-Aligner: trainer.{reinforce,ppo}.* and
    model.{reinforce,ppo}.*)."""

    max_steps: int = Field(100, ge=1)
    """rollout + update steps (NeMo-Aligner: trainer.{reinforce,ppo}.max_steps)"""
    num_prompts_per_step: int = Field(16, ge=1)
    """prompts per step over all ranks; each gets num_rollouts_per_prompt responses (NeMo-Aligner:
    model.{reinforce,ppo}.num_rollout_samples)"""
    micro_batch_size: int = Field(16, ge=1)
    """responses per forward/backward pass of the actor (and of rl/ppo's critic); gradients accumulate to one
    optimizer step per epoch (NeMo-Aligner: model.micro_batch_size)"""
    log_interval: int = Field(1, ge=1)
    """print a summary line every N steps (metrics.jsonl gets every step)"""


class RewardSource(Strict):
    """Where the rewards come from."""

    source: Literal["server", "in_process"] = "server"
    """server: ask an rm/serve over HTTP (KServe v2, as NeMo-Aligner's remote_rm); in_process: load
    inputs.reward_model into the trainer (no server; local runs only)"""
    server: RewardServer = Field(default_factory=RewardServer)


KLEstimator = Literal["k1", "k2", "k3", "abs"]


def kl_estimator_field(default: KLEstimator, where_else: str) -> Any:
    """The `kl_estimator` field of an RL step: which per-token estimate of KL(policy || reference) it uses;
    `where_else` names the same setting in the framework the step follows."""
    return Field(
        default,
        description="per-token KL estimate from d = logp - ref_logp: k1 = d, k2 = d^2/2, k3 = exp(-d)+d-1, abs = "
        f"|d| ({where_else})",
    )


class Evaluation(Strict):
    """Before/after evaluation on a fixed prompt subset (logged as eval_rm_*, eval_gt_*, eval_distinct_*)."""

    task: Literal["sentiment", "reverse"] | None = None
    """task whose ground-truth scorer to report"""
    num_prompts: int = Field(64, ge=0)
    """evaluate on the first N training prompts before and after training (0 = skip)"""
    seed: int = 7
    """sampling seed of the evaluation responses, so before and after are comparable"""


class NemoRL(Strict):
    """Settings only `backend: nemo_rl` reads (NeMo-RL v0.7.0 in its container). The built-in backend refuses
    non-default values here, because there they would do nothing."""

    policy_backend: Literal["dtensor", "megatron"] = "dtensor"
    """NeMo-RL's training backend: PyTorch DTensor (FSDP2) or Megatron-Core"""
    tensor_parallel_size: int = Field(1, ge=1)
    """tensor-parallel size of the policy (and critic) training"""
    pipeline_parallel_size: int = Field(1, ge=1)
    """pipeline-parallel size; Megatron-Core only"""
    context_parallel_size: int = Field(1, ge=1)
    """context-parallel size of the policy training"""
    sequence_packing: bool = True
    """pack several sequences into one row for the policy's passes"""
    generation_tensor_parallel_size: int = Field(1, ge=1)
    """tensor-parallel size of the vLLM rollout engine"""
    gpu_memory_utilization: float = Field(0.6, gt=0, le=1)
    """share of GPU memory vLLM may take"""
    max_prompt_tokens: int = Field(512, ge=1)
    """longest prompt in tokens; the sequence budget is this plus max_new_tokens, and longer prompts are
    masked out of the loss"""
    reward_model_gpus: int = Field(1, ge=1)
    """GPUs of the reward model's own workers: on one node they come out of that node's GPUs, on several nodes
    the reward model gets a node of its own"""
    generation_gpus: int | None = Field(None, ge=1)
    """GPUs of vLLM's own, apart from training (non-colocated generation, which async GRPO needs): on a one-node
    policy share that many of the node's GPUs, on several nodes whole nodes (a multiple of the profile's
    gpus_per_node); null: colocated, or half the policy's GPUs (whole nodes) when async is on"""
