"""The off-policy correction: importance weights pi_trainer / pi_generator per response token, optionally
truncated, as NeMo-RL v0.7.0 computes them (nemo_rl/algorithms/loss/loss_functions.py,
`ClippedPGLossFn.__call__`, the "Off-policy (actor) importance-sampling correction" and "Truncated Importance
Sampling" blocks, token-level ratios)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, NamedTuple

import torch

if TYPE_CHECKING:
    from nemotron.config.offpolicy import ImportanceSampling
    from nemotron.rl.distributed import World
    from nemotron.rl.experience import Experience

Truncation = Literal["tis", "icepop", "seq-mask-tis"]


class ImportanceWeights(NamedTuple):
    """The per-token weights of the policy loss and the share the truncation acted on."""

    weights: torch.Tensor
    """``(B, N)``, no gradient"""
    out_of_bounds: torch.Tensor
    """0-dim: the share of valid tokens (tis, icepop) or of responses (seq-mask-tis) whose weight lies outside
    the bounds; 0 untruncated (NeMo-RL's ``is_oob_ratio``)"""


def importance_weights(
    trainer_logp: torch.Tensor,
    generator_logp: torch.Tensor,
    mask: torch.Tensor,
    truncation: Truncation | None = None,
    ratio: float | None = None,
    ratio_min: float | None = None,
) -> ImportanceWeights:
    """``w = exp(trainer_logp - generator_logp)`` per token (nan and inf become 0), then truncated:

    - ``tis``: clamp to ``[ratio_min or 0, ratio]``;
    - ``icepop``: 0 where ``w`` is outside ``[ratio_min, ratio]``;
    - ``seq-mask-tis``: 0 for every token of a response whose geometric-mean weight
      ``exp(mean_t(trainer_logp - generator_logp))`` over its valid tokens is outside ``[ratio_min, ratio]``; the
      other responses keep their raw token weights.

    Args:
        trainer_logp: ``(B, N)`` the trainer's logprobs of the sampled tokens before this step's update (NeMo-RL's
            ``prev_logprobs``).
        generator_logp: ``(B, N)`` the logprobs the generating engine sampled them with (``generation_logprobs``).
        mask: ``(B, N)`` valid response tokens.
        truncation, ratio, ratio_min: NeMo-RL's ``truncated_importance_sampling_{type,ratio,ratio_min}``.

    Returns:
        ``ImportanceWeights(weights (B, N), out_of_bounds 0-dim)``.
    """
    log_w = (trainer_logp - generator_logp).detach().float()
    weights = torch.nan_to_num(torch.exp(log_w), nan=0.0, posinf=0.0, neginf=0.0)
    valid = mask.to(weights.dtype)
    tokens = valid.sum().clamp(min=1.0)
    none = torch.zeros((), dtype=weights.dtype, device=weights.device)
    if truncation is None:
        return ImportanceWeights(weights, none)
    if ratio is None:
        raise ValueError(f"truncation {truncation} needs a ratio")
    if truncation == "tis":
        low = 0.0 if ratio_min is None else ratio_min
        outside = (weights > ratio) | (weights < low)
        return ImportanceWeights(weights.clamp(min=low, max=ratio), (outside * valid).sum() / tokens)
    if ratio_min is None:
        raise ValueError(f"truncation {truncation} needs ratio_min")
    if truncation == "icepop":
        kept = (weights >= ratio_min) & (weights <= ratio)
        return ImportanceWeights(torch.where(kept, weights, 0.0), (~kept * valid).sum() / tokens)
    log_mean = (torch.nan_to_num(log_w, nan=0.0, posinf=0.0, neginf=0.0) * valid).sum(1) / valid.sum(1).clamp(
        min=1.0
    )
    geometric = torch.exp(log_mean)
    kept_rows = ((geometric >= ratio_min) & (geometric <= ratio)).to(weights.dtype)
    return ImportanceWeights(weights * kept_rows.unsqueeze(1), 1.0 - kept_rows.mean())


def step_correction(
    exp: Experience, keys: ImportanceSampling, world: World
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """One step's importance weights under the config's correction keys (None when it is off), and their
    metrics over the global batch: NeMo-RL's ``sampling_importance_ratio`` (the mean weight over valid tokens)
    and ``is_oob_ratio`` (the truncation's share; under seq-mask-tis each rank's share of responses, weighted by
    its tokens)."""
    if not keys.use_importance_sampling_correction:
        return None, {}
    from nemotron.rl.stats import global_means

    w = importance_weights(
        exp.logprobs,
        exp.generation_logprobs,
        exp.mask,
        keys.truncated_importance_sampling_type,
        keys.truncated_importance_sampling_ratio,
        keys.truncated_importance_sampling_ratio_min,
    )
    valid = exp.mask.to(w.weights.dtype)
    tokens = valid.sum()
    means = global_means(
        world,
        tokens,
        sampling_importance_ratio=(w.weights * valid).sum(),
        is_oob_ratio=w.out_of_bounds * tokens,
    )
    return w.weights, means
