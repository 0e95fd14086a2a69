"""Config schema of eval/policy: which policy answers which prompts, how it samples, and which scorers run."""

from typing import Literal, Self

from pydantic import Field, field_validator, model_validator

from nemotron.config.stepconfig import Backend, GenerationEngine, Runtime, Strict, backend_field


class Inputs(Strict):
    """What is evaluated, on what, and against what: artifact refs or paths."""

    policy: str | None = None
    """the policy to evaluate (checkpoint_hf)"""
    prompts: str | None = None
    """the prompts (prompt_jsonl); a record's optional "answer" is scorers.math's reference"""
    baseline: str | None = None
    """a second policy answering the same prompts with the same sampling (scorers.win_rate's opponent)"""
    reward_model: str | None = None
    """reward model (reward_model_hf) for scorers.reward_model"""
    judge: str | None = None
    """the judge of scorers.win_rate: a causal LM served by our chat server (judge.kind=generative), or a
    reward model (reward_model_hf) loaded in process (judge.kind=reward_model)"""


class Outputs(Strict):
    """Names the outputs are registered under in the artifact store."""

    report: str = "eval_report"
    """artifact name of the eval_report"""


class Generation(GenerationEngine):
    """How the policy (and the baseline) answer, one response per prompt: our torch sampler (backend torch) or
    a vLLM engine started from the checkpoint (backend vllm, in .venv-vllm; docs/vllm.md)."""

    greedy: bool = True
    """take the most likely token; false samples (temperature, top_k, top_p) from runtime.seed"""
    temperature: float = Field(1.0, gt=0)
    """sampling temperature (greedy=false only)"""
    top_k: int = Field(0, ge=0)
    """keep the k most likely tokens when sampling; 0: off (greedy=false only)"""
    top_p: float = Field(1.0, gt=0, le=1)
    """nucleus sampling threshold; 1.0: off (greedy=false only)"""
    max_new_tokens: int = Field(64, ge=1)
    """longest response in tokens; a response that reaches it without EOS counts as truncated"""
    batch_size: int = Field(32, ge=1)
    """prompts generated together; batch i samples from its own seed, drawn from runtime.seed, so sampled
    answers depend on it (keep it fixed between runs you compare) and not on how many ranks share the
    batches (several ranks take whole batches each)"""

    @model_validator(mode="after")
    def _sampling_keys_act(self) -> Self:
        if self.greedy and (self.temperature != 1.0 or self.top_k != 0 or self.top_p != 1.0):
            raise ValueError(
                "generation.temperature, top_k and top_p act only when sampling: set generation.greedy=false"
            )
        return self


class Judge(Strict):
    """The judge of scorers.win_rate, with rl/rlhf's judge keys: a generative judge (a causal LM asked which
    of two responses is better), or a reward model whose two scores decide."""

    kind: Literal["generative", "reward_model"] = "generative"
    """generative: inputs.judge (a causal LM) compares the two responses through chat completions;
    reward_model: inputs.judge (a reward_model_hf) scores each response and the higher score wins, equal
    scores a tie. Both are asked in both orders; a scalar reward model's two orders agree by construction
    (its score of a response does not depend on the other), so its win is 1, 0 or 0.5 per prompt"""
    url: str | None = None
    """a running server to ask instead of inputs.judge: generative, an OpenAI-compatible
    /v1/chat/completions; reward_model, rm/serve (KServe v2, scoring the policy's token ids). Unset:
    inputs.judge, served by our chat server beside this step (generative) or loaded in this process
    (reward_model)"""
    pairwise_template: str = (
        "Compare two reviews that continue the same opening. Score how positive each is from 1 to 5.\n"
        "Opening: {prompt}\nReview 1: {response_1}\nReview 2: {response_2}\nAnswer with JSON only: "
        '{"score_1": <1-5>, "score_2": <1-5>}'
    )
    """generative: the judge's user message; must contain {prompt}, {response_1} and {response_2}; the higher
    score wins, equal scores are a tie"""
    guided_choice: bool = True
    """generative: constrain the judge to the 25 valid verdicts (vLLM structured_outputs.choice; our chat
    server too)"""
    max_retries: int = Field(2, ge=0)
    """generative: re-asks when a verdict does not parse; a verdict that never parses counts as a tie"""
    timeout_s: float = Field(60.0, gt=0)
    """seconds to wait for one request to the judge: judge.url, or the chat server this step started
    (kind=reward_model without judge.url loads the model here and refuses this key)"""

    @field_validator("pairwise_template")
    @classmethod
    def _placeholders(cls, value: str) -> str:
        missing = [p for p in ("{prompt}", "{response_1}", "{response_2}") if p not in value]
        if missing:
            raise ValueError(f"the pairwise template lacks {', '.join(missing)}")
        return value

    @model_validator(mode="after")
    def _generative_keys_act_only_there(self) -> Self:
        if self.kind == "generative":
            return self
        defaults = Judge.model_fields
        changed = [
            f"judge.{key}"
            for key in ("pairwise_template", "guided_choice", "max_retries")
            if getattr(self, key) != defaults[key].default
        ]
        if changed:
            raise ValueError(
                f"{', '.join(changed)} act{'s' if len(changed) == 1 else ''} only with judge.kind=generative "
                "(a reward model judge compares two scores: no template, no verdict to parse)"
            )
        if self.url is None and self.timeout_s != defaults["timeout_s"].default:
            raise ValueError(
                "judge.timeout_s acts with judge.kind=reward_model only through judge.url (a reward model "
                "loaded in this step is sent no request)"
            )
        return self


class Scorers(Strict):
    """Which scores each response gets; each adds metrics to the summary."""

    reward_model: bool = False
    """score each response with inputs.reward_model (metric reward_model; with inputs.baseline also
    baseline_reward_model, the baseline's answers)"""
    task: Literal["sentiment", "reverse"] | None = None
    """the tiny task whose ground truth scores each response (metrics task_score, task_well_formed)"""
    math: bool = False
    """check each response's final answer against its prompt's "answer" with math-verify (metrics
    math_correct, math_parsed); every prompt needs an answer"""
    win_rate: bool = False
    """the judge's pairwise preference of the policy's response over the baseline's, judged in both orders, a
    tie half (metric win_rate); needs inputs.baseline and inputs.judge (or judge.url); judge.kind picks a
    generative judge or a reward model"""
    length: bool = True
    """response length in tokens (metrics response_length, truncated)"""
    distinct_n: list[int] = Field(default_factory=lambda: [1, 2])
    """n of the distinct-n metrics (distinct_1, ...): per response, and over all responses in the summary;
    empty: none"""

    @field_validator("distinct_n")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if any(n < 1 for n in value):
            raise ValueError(f"distinct-n needs n >= 1, got {value}")
        return sorted(set(value))


class Summary(Strict):
    """How each metric's interval is computed: a percentile bootstrap over the prompts."""

    resamples: int = Field(1000, ge=100)
    """bootstrap resamples"""
    level: float = Field(0.95, gt=0, lt=1)
    """the interval's coverage"""
    seed: int = 0
    """the bootstrap's seed (the same scores always give the same interval)"""


class NemoRLEval(Strict):
    """Settings only `backend: nemo_rl` reads (NeMo-RL v0.7.0's eval entry, vLLM in its container). The
    built-in backend refuses non-default values here, because there they would do nothing."""

    generation_tensor_parallel_size: int = Field(1, ge=1)
    """tensor-parallel size of NeMo-RL's vLLM engine; it must divide the job's GPUs"""
    max_prompt_tokens: int = Field(512, ge=1)
    """longest prompt in tokens: vLLM plans for this plus generation.max_new_tokens (its max_model_len)"""


class Config(Strict):
    """eval/policy: generate with a policy on a prompt set and score the responses."""

    backend: Backend = backend_field(
        "eval entry (examples/run_eval.py): vLLM answers scored by its math environment"
    )
    inputs: Inputs = Field(default_factory=Inputs)
    outputs: Outputs = Field(default_factory=Outputs)
    generation: Generation = Field(default_factory=Generation)
    scorers: Scorers = Field(default_factory=Scorers)
    judge: Judge = Field(default_factory=Judge)
    summary: Summary = Field(default_factory=Summary)
    max_prompts: int = Field(0, ge=0)
    """evaluate the first N prompts of the file; 0: all"""
    runtime: Runtime = Field(default_factory=Runtime)
    nemo_rl: NemoRLEval = Field(default_factory=NemoRLEval)

    def record_fields_needed(self) -> dict[str, tuple[list[str], str, int]]:
        """Optional record fields the scorers read, checked at compile time (preflight) in the records the
        step evaluates: the first max_prompts (0: all)."""
        if self.scorers.math:
            why = "scorers.math checks each response against its prompt's answer"
            return {"prompts": (["answer"], why, self.max_prompts)}
        return {}

    @model_validator(mode="after")
    def _scorers_have_inputs(self) -> Self:
        needs = []
        if self.scorers.reward_model and not self.inputs.reward_model:
            needs.append("scorers.reward_model needs inputs.reward_model")
        if self.scorers.win_rate and not self.inputs.baseline:
            needs.append("scorers.win_rate needs inputs.baseline (the policy it is compared with)")
        if self.scorers.win_rate and not (self.inputs.judge or self.judge.url):
            needs.append("scorers.win_rate needs inputs.judge (or judge.url)")
        if needs:
            raise ValueError("; ".join(needs))
        unused = [
            f"inputs.{name} is given but no scorer reads it ({scorer})"
            for name, scorer in (
                ("reward_model", "scorers.reward_model"),
                ("baseline", "scorers.win_rate"),
                ("judge", "scorers.win_rate"),
            )
            if getattr(self.inputs, name) and not getattr(self.scorers, scorer.split(".")[1])
        ]
        if unused:
            raise ValueError("; ".join(unused))
        judge_set = [
            f"judge.{key}"
            for key, field in Judge.model_fields.items()
            if getattr(self.judge, key) != field.default
        ]
        if judge_set and not self.scorers.win_rate:
            raise ValueError(f"{', '.join(judge_set)}: the judge acts only with scorers.win_rate=true")
        return self
