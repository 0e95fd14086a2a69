"""eval/policy's answers: a policy answers every prompt once, on our torch sampler or a vLLM engine started from its
checkpoint, in batches that each sample from their own seed. A batch's answers depend only on its prompts and its
seed, so ranks can share the batches and the report is the same on one rank or several."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

import torch

from nemotron.models.checkpoint import load_policy, load_tokenizer
from nemotron.models.prompts import fit_prompts, model_positions
from nemotron.models.tokenizer import encode_prompt
from nemotron.rl import distributed
from nemotron.rl.experience import SamplingKeys, sampling_params
from nemotron.rl.generation_backends import TorchBackend
from nemotron.rl.rollout import Rollout, SamplingParams
from nemotron.runtime.devices import DevicePlan

if TYPE_CHECKING:
    from nemotron.data.records import PromptRecord


class AnswerKeys(SamplingKeys, Protocol):
    """eval/policy's `generation` group as this module reads it (its schema lives with the step): the sampling
    keys every generation group has, and the engine, greedy and the batch."""

    backend: Literal["torch", "vllm"]
    vllm_gpu_memory_utilization: float
    vllm_max_model_len: int
    greedy: bool
    batch_size: int


log = logging.getLogger("nemotron")

# (prompt ids of one batch, sampling settings, the batch's random stream) -> the batch's rollout
Sampler = Callable[[list[list[int]], SamplingParams, torch.Generator], Rollout]


@dataclass
class Answers:
    """One response per prompt (of the prompts a rank answered, or of all of them once gathered)."""

    texts: list[str] = field(default_factory=list)
    ids: list[list[int]] = field(default_factory=list)  # response token ids up to and including EOS
    rows: list[list[int]] = field(default_factory=list)  # prompt + response ids, what a reward model scores
    truncated: list[bool] = field(default_factory=list)

    @classmethod
    def joined(cls, parts: Sequence[Answers]) -> Answers:
        """The answers of consecutive prompt ranges, in order."""
        out = cls()
        for part in parts:
            out.texts += part.texts
            out.ids += part.ids
            out.rows += part.rows
            out.truncated += part.truncated
        return out


def batch_seeds(seed: int, count: int) -> list[int]:
    """The seed of each of `count` batches, drawn from `seed` alone: batch i samples the same stream whichever
    rank answers it."""
    return torch.randint(0, 2**62, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


def batch_ranges(num_prompts: int, batch_size: int) -> list[range]:
    """The prompt indices of each batch, in order."""
    return [range(s, min(s + batch_size, num_prompts)) for s in range(0, num_prompts, batch_size)]


@contextmanager
def open_sampler(path: str, g: AnswerKeys, plan: DevicePlan) -> Iterator[Sampler]:
    """The policy at `path` on the engine `generation.backend` names: our torch sampler on the loaded policy, or
    a vLLM engine started from the checkpoint directory (no torch copy of the weights: nothing to sync). The
    engine is let go on exit, before the next policy or a scorer loads."""
    if g.backend == "vllm":
        from transformers import AutoConfig

        from nemotron.rl.vllm_backend import VLLMBackend

        engine = VLLMBackend(g.vllm_gpu_memory_utilization, g.vllm_max_model_len)  # exit 2 without vllm
        engine.start(Path(path), plan.dtype, model_positions(AutoConfig.from_pretrained(path)) or 0)
        try:
            yield engine.sample
        finally:
            engine.llm = None  # vLLM frees the engine's memory when its last reference goes
            gc.collect()
            if plan.device.type == "cuda":
                torch.cuda.empty_cache()
        return
    policy = load_policy(path, device=plan.device, dtype=plan.dtype)
    backend = TorchBackend()

    def sample(batch: list[list[int]], params: SamplingParams, generator: torch.Generator) -> Rollout:
        with torch.no_grad(), plan.autocast():
            return backend.generate(policy, batch, params, generator)

    yield sample  # the policy goes with this frame


def generate(
    path: str,
    records: Sequence[PromptRecord],
    g: AnswerKeys,
    seed: int,
    plan: DevicePlan,
    world: distributed.World,
) -> Answers:
    """This rank's answers: the policy at `path` answers the prompts of this rank's share of the batches (all of
    them on one rank; whole batches, contiguous, on several), batch i sampling from `batch_seeds(seed, ...)[i]`.
    The same checkpoint and settings give the same answers, and a baseline identical to the policy identical
    ones, on any number of ranks."""
    from transformers import AutoConfig

    tokenizer = load_tokenizer(path)
    prompt_ids = [encode_prompt(tokenizer, r.prompt) for r in records]
    prompt_ids = fit_prompts(prompt_ids, model_positions(AutoConfig.from_pretrained(path)), g.max_new_tokens)
    params = sampling_params(g, tokenizer, greedy=g.greedy)
    ranges = batch_ranges(len(prompt_ids), g.batch_size)
    seeds = batch_seeds(seed, len(ranges))
    mine = distributed.shard(list(range(len(ranges))), world)
    answers = Answers()
    if world.size > 1:
        count = sum(len(ranges[b]) for b in mine)
        log.info("rank %d of %d answers %d prompts (%d of %d batches)", world.rank, world.size, count, len(mine),
                 len(ranges))  # fmt: skip
    if not mine:  # more ranks than batches: nothing to load
        return answers
    with open_sampler(path, g, plan) as sample:
        for b in mine:
            batch = [prompt_ids[i] for i in ranges[b]]
            rollout = sample(batch, params, plan.generator(seeds[b]))
            kept = rollout.response_mask.tolist()
            for prompt, response, mask, end in zip(
                batch, rollout.responses.tolist(), kept, rollout.is_end.tolist(), strict=True
            ):
                ids = [t for t, k in zip(response, mask, strict=True) if k]
                answers.ids.append(ids)
                answers.rows.append(list(prompt) + ids)
                answers.texts.append(str(tokenizer.decode(ids, skip_special_tokens=True)).strip())
                answers.truncated.append(not bool(end))
    return answers
