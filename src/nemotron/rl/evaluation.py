"""Before/after evaluation of a policy: reward-model score, ground-truth score (when the task has one) and
distinct-word ratio on a fixed set of prompts with a fixed sampling seed."""

from __future__ import annotations

from typing import Any

import torch

from nemotron.rl.experience import PromptBatch, ScoreFn, distinct_ratio
from nemotron.rl.generation_backends import GenerationBackend
from nemotron.rl.rollout import SamplingParams


def evaluate(
    backend: GenerationBackend,
    policy: torch.nn.Module,
    tokenizer: Any,
    prompts: PromptBatch,
    params: SamplingParams,
    seed: int,
    score: ScoreFn,
    task: Any | None,
) -> dict[str, float]:
    """{"rm": mean reward-model score, "distinct": distinct-word ratio, and with a task "gt": mean ground-truth
    score and "well_formed": the share of responses the task's grammar accepts}."""
    generator = torch.Generator(device=next(policy.parameters()).device).manual_seed(seed)
    rollout = backend.generate(policy, list(prompts.ids), params, generator)
    ids = [r[m].tolist() for r, m in zip(rollout.responses, rollout.response_mask, strict=True)]
    responses = [tokenizer.decode(x, skip_special_tokens=True).strip() for x in ids]
    rm = list(score([p + r for p, r in zip(prompts.ids, ids, strict=True)], list(prompts.texts), responses))
    out = {"rm": sum(rm) / len(rm), "distinct": distinct_ratio(responses)}
    if task is not None:
        gt = task.score(list(prompts.texts), responses)
        out["gt"] = sum(gt) / len(gt)
        out["well_formed"] = sum(task.is_well_formed(r) for r in responses) / len(responses)
    return out


def parameter_checksum(model: torch.nn.Module) -> float:
    """Sum of every parameter in float64: a cheap fingerprint to prove a frozen model stayed frozen."""
    with torch.no_grad():
        return float(sum(p.detach().double().sum() for p in model.parameters()))
