"""Policy and value losses of the RL steps: PPO clipped surrogate, clipped value loss, REINFORCE, KL-in-loss.

Each takes per-token tensors ``(B, T)`` plus a mask and reduces with ``masks.global_mean``; pass the global
``normaliser`` (``masks.mean_denominator`` summed over the whole batch) when the batch is split.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from nemotron.rl.kl import KLEstimator, kl_penalty
from nemotron.rl.masks import LossLevel, global_mean


class ClippedLoss(NamedTuple):
    """A loss and the fraction of valid tokens the clip acted on (reduced like the loss, no gradient)."""

    loss: torch.Tensor
    clipfrac: torch.Tensor


def _per_token(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Sequence advantages ``(B,)`` broadcast over tokens; token advantages ``(B, T)`` pass through."""
    if advantages.dim() == 1:
        return advantages.unsqueeze(1).expand_as(like)
    if advantages.shape != like.shape:
        raise ValueError(f"advantages must be (B,) or {tuple(like.shape)}, got {tuple(advantages.shape)}")
    return advantages


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
    level: LossLevel = "token",
    normaliser: torch.Tensor | float | None = None,
    weights: torch.Tensor | None = None,
) -> ClippedLoss:
    """PPO clipped surrogate, ``-min(ratio * A, clip(ratio, 1 - eps, 1 + eps_high) * A)`` per token.

    With ``dual_clip = c > 1`` (Ye et al. 2020, as in NeMo-Aligner and NeMo-RL), tokens with ``A < 0`` are
    further capped at ``-c * A``: a huge ratio on a bad token cannot produce an unbounded loss.

    ``clipfrac`` is the share of valid tokens whose ratio lies outside ``[1 - eps, 1 + eps_high]``.

    Args:
        logp: current policy log-probs, ``(B, T)``, differentiable.
        old_logp: log-probs of the policy that sampled (or of the previous epoch), ``(B, T)``.
        advantages: ``(B,)`` per sequence or ``(B, T)`` per token; treated as constants.
        mask: ``(B, T)``.
        clip_eps: lower (and, by default, upper) clip range.
        clip_eps_high: upper clip range if different (asymmetric "clip-higher").
        dual_clip: the constant c > 1, or None for no dual clip.
        level, normaliser: see ``masks.global_mean``.
        weights: ``(B, T)`` importance weights multiplying each token's (clipped) loss, no gradient
            (``importance.importance_weights``; NeMo-RL applies them after the dual clip); None: 1.

    Returns:
        ``ClippedLoss(loss, clipfrac)``, both 0-dim.
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    high = clip_eps if clip_eps_high is None else clip_eps_high
    adv = _per_token(advantages, logp).detach().to(logp.dtype)
    ratio = torch.exp(logp - old_logp.detach())
    clipped_ratio = ratio.clamp(min=1.0 - clip_eps, max=1.0 + high)
    per_token = torch.maximum(-ratio * adv, -clipped_ratio * adv)
    if dual_clip is not None:
        per_token = torch.where(adv < 0, torch.minimum(per_token, -dual_clip * adv), per_token)
    if weights is not None:
        per_token = weights.detach().to(per_token.dtype) * per_token
    loss = global_mean(per_token, mask, level, normaliser)
    clipped = (ratio != clipped_ratio).to(logp.dtype).detach()
    return ClippedLoss(loss=loss, clipfrac=global_mean(clipped, mask, level, normaliser))


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float | None = 0.2,
    level: LossLevel = "token",
    normaliser: torch.Tensor | float | None = None,
) -> ClippedLoss:
    """Clipped critic loss ``0.5 * max((v - R)**2, (v_clipped - R)**2)``, ``v_clipped = old_v + clip(v - old_v, -c, c)``.

    ``clip=None`` gives the plain ``0.5 * (v - R)**2``. ``clipfrac`` is the share of valid tokens where the
    clipped term is the larger one (the critic's step was cut).

    Args:
        values: current critic values, ``(B, T)``, differentiable.
        old_values: values at rollout time, ``(B, T)``.
        returns: GAE returns, ``(B, T)``.
        mask: ``(B, T)``.
        clip: c, in the units of the values.
        level, normaliser: see ``masks.global_mean``.

    Returns:
        ``ClippedLoss(loss, clipfrac)``, both 0-dim.
    """
    old = old_values.detach()
    target = returns.detach()
    unclipped = (values - target).square()
    if clip is None:
        per_token = 0.5 * unclipped
        clipped = torch.zeros_like(unclipped)
    else:
        values_clipped = old + (values - old).clamp(min=-clip, max=clip)
        clipped_sq = (values_clipped - target).square()
        per_token = 0.5 * torch.maximum(unclipped, clipped_sq)
        clipped = (clipped_sq > unclipped).to(values.dtype).detach()
    loss = global_mean(per_token, mask, level, normaliser)
    return ClippedLoss(loss=loss, clipfrac=global_mean(clipped, mask, level, normaliser))


def reinforce_loss(
    logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    level: LossLevel = "token",
    normaliser: torch.Tensor | float | None = None,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """REINFORCE policy-gradient loss ``-logp * A`` per token (times its importance weight), reduced as
    configured.

    ``level="sequence_sum"`` is the textbook ``-A * sum_t logp`` averaged over sequences; ``token`` and
    ``sequence`` average over tokens instead.

    Args:
        logp: policy log-probs, ``(B, T)``, differentiable.
        advantages: ``(B,)`` or ``(B, T)``; treated as constants.
        mask: ``(B, T)``.
        level, normaliser: see ``masks.global_mean``.
        weights: ``(B, T)`` importance weights, no gradient (NeMo-RL weights its REINFORCE-style loss,
            ``disable_ppo_ratio``, the same way); None: 1.

    Returns:
        0-dim loss.
    """
    adv = _per_token(advantages, logp).detach().to(logp.dtype)
    per_token = -logp * adv
    if weights is not None:
        per_token = weights.detach().to(per_token.dtype) * per_token
    return global_mean(per_token, mask, level, normaliser)


def kl_loss(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float,
    estimator: KLEstimator = "k3",
    input_clamp: float | None = 20.0,
    output_clamp: float | None = 10.0,
    level: LossLevel = "token",
    normaliser: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """KL penalty as a loss term, ``kl_coef * mean KL`` (NeMo-RL GRPO: k3, added to the policy loss).

    Args:
        logp: policy log-probs, ``(B, T)``, differentiable.
        ref_logp: reference log-probs, ``(B, T)``.
        mask: ``(B, T)``.
        kl_coef: beta.
        estimator, input_clamp, output_clamp: see ``kl.kl_penalty``.
        level, normaliser: see ``masks.global_mean``.

    Returns:
        0-dim loss.
    """
    kl = kl_penalty(logp, ref_logp.detach(), estimator, input_clamp, output_clamp)
    return kl_coef * global_mean(kl, mask, level, normaliser)
