"""The rollout phase shared by the RL steps: sample n responses per prompt, score them, and compute the
policy's and the reference's logprobs of every generated token."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from transformers import PreTrainedModel

from nemotron.rl.generation_backends import GenerationBackend
from nemotron.rl.rollout import Rollout, SamplingParams, sequence_logprobs

# (token rows: prompt + response ids, prompts, responses) -> one score per row
ScoreFn = Callable[[list[list[int]], list[str], list[str]], Sequence[float]]


@dataclass
class Experience:
    """One step's rollouts. B = prompts x n, N = response width."""

    sequences: torch.Tensor  # (B, P + N) long
    attention_mask: torch.Tensor  # (B, P + N) long
    prompt_width: int  # P
    mask: torch.Tensor  # (B, N) bool: response tokens up to and including EOS
    is_end: torch.Tensor  # (B,) bool
    group: torch.Tensor  # (B,) long: which prompt each response answers (global prompt index)
    logprobs: torch.Tensor  # (B, N): the trainer's logprobs before this step's update (PPO's old logprobs)
    generation_logprobs: (
        torch.Tensor
    )  # (B, N): the generating engine's (the same tensor when it was the trainer)
    ref_logprobs: torch.Tensor  # (B, N)
    scores: torch.Tensor  # (B,) reward source scores
    prompts: list[str]
    responses: list[str]
    timers: dict[str, float]
    # what the generation engine reports beside the rollouts (vllm: token_mult_prob_error); logged as metrics
    engine_stats: dict[str, float] = field(default_factory=dict)
    # (B,) long: how many updates the weights that sampled each row had made (asynchronous runs; None: this step's)
    policy_version: torch.Tensor | None = None

    @property
    def response_lengths(self) -> torch.Tensor:
        return self.mask.sum(dim=1)


@dataclass(frozen=True)
class PromptBatch:
    """Prompts to answer in one rollout phase."""

    texts: list[str]
    """the prompts as text, for judges and task scorers"""
    ids: list[list[int]]
    """the prompts as the model reads them (chat template applied, cut to fit)"""
    indices: list[int]
    """each prompt's index in the run's prompt set: the `Experience.group` of its responses"""


@dataclass(frozen=True, kw_only=True)
class RolloutSetup:
    """What samples, scores and takes the logprobs of rollouts: the same at every step of a run."""

    backend: GenerationBackend
    policy: PreTrainedModel
    reference: PreTrainedModel
    """the frozen initial policy: its logprobs are the KL's other side"""
    tokenizer: Any
    params: SamplingParams
    generator: torch.Generator
    """the sampler's random stream"""
    n: int
    """responses per prompt"""
    score: ScoreFn


def prompt_rows(prompts: PromptBatch, n: int) -> list[list[int]]:
    """The token rows a rollout samples from: each prompt `n` times in a row."""
    return [ids for ids in prompts.ids for _ in range(n)]


def collect(setup: RolloutSetup, prompts: PromptBatch) -> Experience:
    """Rollout phase: n responses to each prompt, scores from the reward source, policy + reference logprobs."""
    t0 = time.perf_counter()
    rollout = setup.backend.generate(
        setup.policy, prompt_rows(prompts, setup.n), setup.params, setup.generator
    )
    return finish(setup, prompts, rollout, time.perf_counter() - t0, setup.backend.recomputes_logprobs)


def finish(
    setup: RolloutSetup,
    prompts: PromptBatch,
    rollout: Rollout,
    generate_s: float,
    recompute: bool,
    ref_logprobs: torch.Tensor | None = None,
) -> Experience:
    """The rest of the rollout phase once `rollout` is sampled (here, or by a generator process in
    `generate_s` seconds): scores, the reference's logprobs (unless given: a generator process took them) and,
    when `recompute`, the policy's own (another engine, or an older policy, sampled;
    `Experience.generation_logprobs` keeps the sampler's)."""
    n, params = setup.n, setup.params
    rows = prompt_rows(prompts, n)
    texts = [p for p in prompts.texts for _ in range(n)]
    timers = {"generate": generate_s}
    t0 = time.perf_counter()
    # Two tolist() calls and one batched decode: per-row tensor indexing and decode calls cost more than this.
    kept = rollout.response_mask.tolist()
    responses_ids = [
        [t for t, k in zip(r, m, strict=True) if k]
        for r, m in zip(rollout.responses.tolist(), kept, strict=True)
    ]
    decoded = setup.tokenizer.batch_decode(responses_ids, skip_special_tokens=True)
    responses = [text.strip() for text in decoded]
    device = rollout.sequences.device
    scores = torch.tensor(
        list(setup.score([p + r for p, r in zip(rows, responses_ids, strict=True)], texts, responses)),
        dtype=torch.float32,
        device=device,
    )
    timers["reward"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    stats: dict[str, float] = {}
    logprobs = rollout.logprobs
    with torch.no_grad():
        if ref_logprobs is None:
            ref_logprobs = reference_logprobs(setup.reference, rollout, params.temperature)
        # another engine or an older policy sampled: the loss uses the trainer's own logprobs (NeMo-RL)
        if recompute:
            logprobs = sequence_logprobs(
                setup.policy,
                rollout.sequences,
                rollout.attention_mask,
                params.temperature,
                rollout.prompt_width,
            )
            stats["token_mult_prob_error"] = token_mult_prob_error(
                rollout.logprobs, logprobs, rollout.response_mask
            )
    timers["logprobs"] = time.perf_counter() - t0
    return Experience(
        sequences=rollout.sequences,
        attention_mask=rollout.attention_mask,
        prompt_width=rollout.prompt_width,
        mask=rollout.response_mask,
        is_end=rollout.is_end,
        group=torch.tensor(prompts.indices, device=device).repeat_interleave(n),
        logprobs=logprobs,
        generation_logprobs=rollout.logprobs,
        ref_logprobs=ref_logprobs,
        scores=scores,
        prompts=texts,
        responses=responses,
        timers=timers,
        engine_stats=stats,
    )


def reference_logprobs(reference: PreTrainedModel, rollout: Rollout, temperature: float) -> torch.Tensor:
    """``(B, N)`` the frozen reference's logprobs of the rollout's response tokens (call under no_grad)."""
    return sequence_logprobs(
        reference, rollout.sequences, rollout.attention_mask, temperature, rollout.prompt_width
    )


def token_mult_prob_error(engine: torch.Tensor, trainer: torch.Tensor, mask: torch.Tensor) -> float:
    """NeMo-RL's `token_mult_prob_error`: the mean over response tokens of exp(|logp_engine - logp_trainer|);
    1.0 when the generation engine and the trainer agree exactly."""
    if not bool(mask.any()):
        return 1.0
    return float(torch.exp((engine - trainer).detach().abs())[mask].mean())


def micro_batches(size: int, micro: int) -> list[slice]:
    return [slice(i, min(i + micro, size)) for i in range(0, size, micro)]


def distinct_ratio(responses: Sequence[str]) -> float:
    """Distinct words / total words over all responses: near 0 when the policy repeats one word."""
    words = [w for r in responses for w in r.split()]
    return len(set(words)) / max(1, len(words))


def prompt_schedule(num_prompts: int, seed: int, position: int, count: int) -> list[int]:
    """Indices of the `count` prompts after `position` in the run's prompt stream: epoch e visits a permutation
    seeded by (seed, e). A pure function, so the data position alone says where a resumed run continues, and
    every data-parallel rank draws the same global batch."""
    picked: list[int] = []
    perm: list[int] = []
    current = -1
    for p in range(position, position + count):
        epoch, i = divmod(p, num_prompts)
        if epoch != current:
            perm = torch.randperm(
                num_prompts, generator=torch.Generator().manual_seed(seed + 7919 * epoch)
            ).tolist()
            current = epoch
        picked.append(perm[i])
    return picked


class SamplingKeys(Protocol):
    """The sampling keys of every `generation` config group: the RL steps' (`stepconfig.Generation`, which adds
    stop strings) and eval/policy's (which adds greedy)."""

    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float


def sampling_params(
    generation: SamplingKeys, tokenizer: Any, *, greedy: bool = False, stop_strings: Sequence[str] = ()
) -> SamplingParams:
    """The SamplingParams of a `generation` config group, with the tokenizer's EOS and pad ids: the one mapping
    from config keys to the sampler's settings, for every engine. `greedy` and `stop_strings` are the keys only
    one of the groups has."""
    stops = tuple(stop_strings)
    return SamplingParams(
        max_new_tokens=generation.max_new_tokens,
        temperature=generation.temperature,
        top_k=generation.top_k,
        top_p=generation.top_p,
        greedy=greedy,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        stop_strings=stops,
        decode=(lambda ids: str(tokenizer.decode(ids))) if stops else None,
    )
