"""Config schema of rl/rlhf: NeMo-RL's GRPO with a reward-model judge. Keys follow NeMo-RL's GRPO recipe."""

from typing import Literal

from pydantic import Field, field_validator

from nemotron.stepconfig import Checkpointing, Evaluation, Generation, NemoRL, Optim, Runtime, Strict


class GRPO(Strict):
    num_prompts_per_step: int = Field(32, ge=1)
    num_generations_per_prompt: int = Field(8, ge=2, description="the GRPO group size")
    max_num_steps: int = Field(1000, ge=1)
    use_leave_one_out_baseline: bool = True
    normalize_rewards: bool = Field(True, description="divide advantages by the group's std (floored)")
    std_floor: float = Field(1e-3, gt=0)
    val_period: int = Field(0, ge=0, description="validate every N steps (0 = off)")


class LossFn(Strict):
    reference_policy_kl_penalty: float = Field(0.01, ge=0)
    kl_estimator: Literal["k1", "k2", "k3", "abs"] = "k3"
    ratio_clip_min: float = Field(0.2, gt=0)
    ratio_clip_max: float = Field(0.2, gt=0)
    ratio_clip_c: float | None = Field(None, gt=1, description="dual-clip constant (off when null)")
    token_level_loss: bool = True


class Policy(Strict):
    model_name: str | None = Field(None, description="the SFT policy to align: artifact ref or path")
    train_micro_batch_size: int = Field(16, ge=1, description="responses per forward/backward pass")
    train_global_batch_size: int | None = Field(None, ge=1, description="responses per optimizer step (default: all of a step's)")
    generation: Generation = Generation()
    optimizer: Optim = Optim(lr=5e-6)


class DataSplit(Strict):
    data_path: str | None = None


class Data(Strict):
    train: DataSplit = DataSplit()
    validation: DataSplit = DataSplit()


class VllmModel(Strict):
    model: str | None = Field(None, description="judge model: HF id or local path")


class ResponsesApiModels(Strict):
    vllm_model: VllmModel = VllmModel()


class GenRM(Strict):
    responses_api_models: ResponsesApiModels = ResponsesApiModels()


class NemoGym(Strict):
    genrm_model: GenRM = GenRM()


class Env(Strict):
    should_use_nemo_gym: bool = False
    nemo_gym: NemoGym = NemoGym()


class Judge(Strict):
    """How responses are scored: a served Bradley-Terry reward model, or a generative judge (chat completions)."""

    kind: Literal["reward_model", "generative"] = "reward_model"
    url: str | None = Field(None, description="a running server; unset: local runs start rm/serve beside the trainer")
    token: str | None = None
    prompt_template: str = (
        "Rate how positive this review is, from 0 to 10.\nReview: {prompt} {response}\n"
        'Answer with JSON only: {"score": <0-10>}'
    )
    mode: Literal["pointwise", "pairwise"] = Field(
        "pointwise",
        description="generative judge: score each response alone, or compare the responses of each prompt's "
        "group in pairs (NeMo-Gym genrm_compare); a prompt with one response is scored alone",
    )
    comparison_strategy: Literal["circular", "all_pairs"] = Field(
        "circular", description="pairwise: compare i with i+1 (N pairs per group), or every pair (N(N-1)/2)"
    )
    pairwise_template: str = (
        "Compare two reviews that continue the same opening. Score how positive each is from 1 to 5 and rank them "
        "from 1 (review 1 much better) to 6 (review 2 much better).\nOpening: {prompt}\nReview 1: {response_1}\n"
        'Review 2: {response_2}\nAnswer with JSON only: {"score_1": <1-5>, "score_2": <1-5>, "ranking": <1-6>}'
    )
    default_score: float = 0.0
    max_retries: int = Field(2, ge=0, description="re-asks when the judge's answer does not parse")
    timeout_s: float = Field(30.0, gt=0)
    guided_choice: bool = Field(False, description="constrain the judge to valid answers (vLLM guided_choice)")

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
    policy: str = Field("rlhf_policy", description="artifact name of the aligned policy")


class Config(Strict):
    backend: Literal["builtin", "nemo_rl"] = Field("builtin", description="nemo_rl: run NeMo-RL's GRPO in its container")
    grpo: GRPO = GRPO()
    loss_fn: LossFn = LossFn()
    policy: Policy = Policy()
    data: Data = Data()
    env: Env = Env()
    judge: Judge = Judge()
    outputs: Outputs = Outputs()
    checkpoint: Checkpointing = Checkpointing()
    eval: Evaluation = Evaluation()
    runtime: Runtime = Runtime()
    nemo_rl: NemoRL = NemoRL()
