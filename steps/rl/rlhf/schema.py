"""Config schema of rl/rlhf: NeMo-RL's GRPO with a reward-model judge. Keys follow NeMo-RL's GRPO recipe."""

from typing import Literal, Self

from pydantic import Field, field_validator, model_validator

from nemotron.config.offpolicy import AsyncGRPO, ImportanceSampling, check_async, check_builtin_async
from nemotron.config.stepconfig import (
    Backend,
    Checkpointing,
    Evaluation,
    Generation,
    KLEstimator,
    NemoRL,
    Optim,
    ResourcePlan,
    Strict,
    Tracking,
    TrainRuntime,
    backend_field,
    kl_estimator_field,
)
from nemotron.config.workload import Workload


class GRPO(Strict):
    """The GRPO loop (NeMo-RL: grpo.*)."""

    num_prompts_per_step: int = Field(32, ge=1)
    """prompts per step over all ranks (NeMo-RL: grpo.num_prompts_per_step)"""
    num_generations_per_prompt: int = Field(8, ge=2)
    """the GRPO group size: responses per prompt (NeMo-RL: grpo.num_generations_per_prompt; TRL GRPO:
    num_generations)"""
    max_num_steps: int = Field(1000, ge=1)
    """rollout + update steps (NeMo-RL: grpo.max_num_steps; TRL GRPO: max_steps)"""
    use_leave_one_out_baseline: bool = True
    """baseline each response with the mean of the other responses of its group instead of the whole group's
    mean"""
    normalize_rewards: bool = True
    """divide advantages by the group's std when it is above std_floor (NeMo-RL: grpo.normalize_rewards)"""
    std_floor: float = Field(1e-3, gt=0)
    """groups whose reward std is at or below this keep unscaled advantages (a zero-variance group gets 0)"""
    val_period: int = Field(0, ge=0)
    """validate every N steps (0 = off): the policy answers the first eval.num_prompts validation prompts,
    logged as val_<name> (NeMo-RL: validation/*); eval_*_before/after come regardless"""
    async_grpo: AsyncGRPO = Field(default_factory=AsyncGRPO)
    """asynchronous rollouts (NeMo-RL: grpo.async_grpo)"""


class LossFn(ImportanceSampling):
    """The clipped policy-gradient loss with the KL to the reference policy in the loss (NeMo-RL:
    loss_fn.*)."""

    reference_policy_kl_penalty: float = Field(0.01, ge=0)
    """beta: the loss adds beta times the KL(policy || reference) estimate (TRL GRPO: beta)"""
    kl_estimator: KLEstimator = kl_estimator_field(
        "k3", "NeMo-RL: loss_fn.reference_policy_kl_type, k1/k2/k3 only"
    )
    ratio_clip_min: float = Field(0.2, gt=0)
    """clip the probability ratio from below at 1 - this (TRL GRPO: epsilon)"""
    ratio_clip_max: float = Field(0.2, gt=0)
    """clip the probability ratio from above at 1 + this (a larger value is DAPO's clip-higher; TRL GRPO:
    epsilon_high)"""
    ratio_clip_c: float | None = Field(None, gt=1)
    """dual-clip constant c: for negative advantages the per-token loss is capped at c*|A| (off when null)"""
    token_level_loss: bool = True
    """average the loss over all response tokens of the update (true), or per response first (false)"""


class Policy(Strict):
    """The policy being trained (NeMo-RL: policy.*)."""

    model_name: str | None = None
    """the SFT policy (checkpoint_hf) to align: artifact ref or path; it also starts the frozen reference
    policy"""
    train_micro_batch_size: int = Field(16, ge=1)
    """responses per forward/backward pass; also the reward model's batch on NeMo-RL"""
    train_global_batch_size: int | None = Field(None, ge=1)
    """responses per optimizer step over all ranks (default: all of a step's, one update per step)"""
    generation: Generation = Field(default_factory=Generation)
    optimizer: Optim = Optim(lr=5e-6)
    """the policy's optimizer"""


class DataSplit(Strict):
    """One prompt file."""

    data_path: str | None = None
    """prompt JSONL (prompt_jsonl): artifact ref or path"""


class Data(Strict):
    """Prompt files (NeMo-RL: data.*)."""

    train: DataSplit = Field(default_factory=DataSplit)
    """the training prompts"""
    validation: DataSplit = Field(default_factory=DataSplit)
    """the prompts evaluation and validation answer (eval_*, val_*); default: the training prompts"""


class VllmModel(Strict):
    """The judge model."""

    model: str | None = None
    """judge model: the reward model (reward_model_hf) for judge.kind=reward_model, a causal LM for
    generative; artifact ref, path or HF id"""


class ResponsesApiModels(Strict):
    """NeMo-Gym's models section."""

    vllm_model: VllmModel = Field(default_factory=VllmModel)


class GenRM(Strict):
    """NeMo-Gym's GenRM model."""

    responses_api_models: ResponsesApiModels = Field(default_factory=ResponsesApiModels)


class NemoGym(Strict):
    """NeMo-Gym settings, in NeMo-RL's key layout."""

    genrm_model: GenRM = Field(default_factory=GenRM)


class Env(Strict):
    """The reward environment (NeMo-RL: env.*)."""

    should_use_nemo_gym: bool = False
    """nemo_rl only: judge through NeMo-Gym's pairwise GenRM (needs judge.kind=generative,
    judge.mode=pairwise)"""
    nemo_gym: NemoGym = Field(default_factory=NemoGym)


class Judge(Strict):
    """How responses are scored: a served Bradley-Terry reward model, or a generative judge (chat
    completions)."""

    kind: Literal["reward_model", "generative"] = "reward_model"
    """reward_model: a Bradley-Terry reward model behind rm/serve (KServe v2); generative: a causal LM asked
    for a score through chat completions"""
    url: str | None = None
    """base URL of a running server (reward_model: rm/serve; generative: an OpenAI-compatible
    /v1/chat/completions); unset: $NEMOTRON_REWARD_URL, else local runs start one beside the trainer"""
    token_file: str | None = None
    """file (mode 0600) holding the bearer token for url; unset: $NEMOTRON_REWARD_TOKEN. Never the token
    itself: a command line is visible in ps"""
    prompt_template: str = (
        "Rate how positive this review is, from 0 to 10.\nReview: {prompt} {response}\n"
        'Answer with JSON only: {"score": <0-10>}'
    )
    """generative, pointwise: the judge's user message; must contain {prompt} and {response}"""
    mode: Literal["pointwise", "pairwise"] = "pointwise"
    """generative judge: score each response alone, or compare the responses of each prompt's group in pairs
    (NeMo-Gym genrm_compare); a prompt with one response is scored alone"""
    comparison_strategy: Literal["circular", "all_pairs"] = "circular"
    """pairwise: compare i with i+1 (N pairs per group), or every pair (N(N-1)/2)"""
    pairwise_template: str = (
        "Compare two reviews that continue the same opening. Score how positive each is from 1 to 5 and "
        "rank them from 1 (review 1 much better) to 6 (review 2 much better).\nOpening: {prompt}\n"
        "Review 1: {response_1}\nReview 2: {response_2}\nAnswer with JSON only: "
        '{"score_1": <1-5>, "score_2": <1-5>, "ranking": <1-6>}'
    )
    """generative, pairwise: the judge's user message; must contain {prompt}, {response_1} and {response_2}"""
    default_score: float = 0.0
    """generative: the score of a response whose verdict never parses (NeMo-Gym: genrm_compare.default_score)
    """
    max_retries: int = Field(2, ge=0)
    """generative: re-asks when the judge's answer does not parse (NeMo-Gym: genrm_parse_retries)"""
    timeout_s: float = Field(30.0, gt=0)
    """seconds to wait for one request to the judge"""
    guided_choice: bool = False
    """constrain the judge to valid answers (vLLM structured_outputs.choice; our chat server too)"""
    server: Literal["builtin", "vllm"] = "builtin"
    """generative, with no url: what serves the judge beside the trainer: our chat server (rm/serve
    server.mode=chat, any device) or `vllm serve` (.venv-vllm; docs/vllm.md). Locally one per node; on
    Slurm `vllm serve` is its own group of a heterogeneous job"""
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    """judge.server=vllm: vLLM's --gpu-memory-utilization for the judge, the share of the GPU's memory (on
    vLLM's CPU build: of the machine's memory) it reserves; raise it when the judge has a node of its own
    (Slurm)"""

    @model_validator(mode="after")
    def _vllm_serves_generative_judges(self) -> Self:
        if self.server == "vllm" and self.kind != "generative":
            raise ValueError("judge.server=vllm serves a generative judge: set judge.kind=generative")
        if self.vllm_gpu_memory_utilization != 0.3 and self.server != "vllm":
            raise ValueError("judge.vllm_gpu_memory_utilization acts only with judge.server=vllm")
        if self.server == "vllm" and self.url:
            raise ValueError(
                "judge.server=vllm starts a judge, judge.url names a running one: set one of them"
            )
        return self

    @field_validator("prompt_template")
    @classmethod
    def _pointwise_placeholders(cls, value: str) -> str:
        return _require(value, "{prompt}", "{response}")

    @field_validator("pairwise_template")
    @classmethod
    def _pairwise_placeholders(cls, value: str) -> str:
        return _require(value, "{prompt}", "{response_1}", "{response_2}")


def _require(template: str, *placeholders: str) -> str:
    missing = [p for p in placeholders if p not in template]
    if missing:
        raise ValueError(f"the template lacks {', '.join(missing)}")
    return template


class Outputs(Strict):
    """Names the outputs are registered under in the artifact store."""

    policy: str = "rlhf_policy"
    """artifact name of the aligned policy"""


class Config(Strict):
    """rl/rlhf: GRPO scored by a judge, in NeMo-RL's key layout."""

    backend: Backend = backend_field("GRPO")
    grpo: GRPO = Field(default_factory=GRPO)
    loss_fn: LossFn = Field(default_factory=LossFn)
    policy: Policy = Field(default_factory=Policy)
    data: Data = Field(default_factory=Data)
    env: Env = Field(default_factory=Env)
    judge: Judge = Field(default_factory=Judge)
    outputs: Outputs = Field(default_factory=Outputs)
    checkpoint: Checkpointing = Field(default_factory=Checkpointing)
    eval: Evaluation = Field(default_factory=Evaluation)
    runtime: TrainRuntime = Field(default_factory=TrainRuntime)
    tracking: Tracking = Field(default_factory=Tracking)
    nemo_rl: NemoRL = Field(default_factory=NemoRL)
    plan: ResourcePlan = Field(default_factory=ResourcePlan)
    """the resource plan's model hints and what a plan that cannot fit does"""

    def workload(self) -> Workload:
        micro_batch = ("policy.train_micro_batch_size", self.policy.train_micro_batch_size)
        prompts = ("grpo.num_prompts_per_step", self.grpo.num_prompts_per_step)
        batch = self.policy.train_global_batch_size
        update = None if batch is None else ("policy.train_global_batch_size", batch)
        return self.policy.generation.rollouts(
            micro_batch, prompts, self.grpo.num_generations_per_prompt, update
        )

    @model_validator(mode="after")
    def _nemo_gym_runs_under_nemo_rl(self) -> Self:
        if self.env.should_use_nemo_gym and self.backend != "nemo_rl":
            raise ValueError(
                "env.should_use_nemo_gym acts only with backend=nemo_rl (NeMo-Gym runs under NeMo-RL); the "
                "built-in engine judges through judge.*: set env.should_use_nemo_gym=false"
            )
        return self

    @model_validator(mode="after")
    def _async_keys(self) -> Self:
        check_async(self.grpo.async_grpo, self.loss_fn, ("grpo.async_grpo", "loss_fn"))
        if self.backend == "builtin":
            check_builtin_async(self.grpo.async_grpo, self.runtime.sharding, "grpo.async_grpo")
        return self
