"""Losses of preference optimisation against a frozen reference: DPO (Rafailov et al. 2023) with conservative
label smoothing, and NeMo-Aligner's IPO and RPO variants, plus the SFT term on the chosen responses.

A response's implicit reward is its log-ratio to the reference, ``r = sum_t (log pi(t) - log pi_ref(t))`` over its
response tokens (the mean with ``average``), as NeMo-RL's DPOLossFn and NeMo-Aligner's MegatronGPTDPOModel compute
it; every loss here is a function of ``d = r_chosen - r_rejected``. Each returns one value per pair, ``(B,)``, so
a caller sums micro-batches and divides by the pairs of the global batch.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

PreferenceLoss = Literal["dpo", "ipo", "rpo_sq", "rpo_bwd_kl", "rpo_fwd_kl"]


def sequence_logratios(
    logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, average: bool = False
) -> torch.Tensor:
    """Each sequence's log-ratio to the reference over its masked (response) tokens.

    Args:
        logp: the policy's per-token log-probs, ``(B, T)``, differentiable.
        ref_logp: the reference's per-token log-probs, ``(B, T)``, constants.
        mask: 1 on response tokens, 0 on prompt and padding, ``(B, T)``.
        average: divide by each sequence's response tokens (at least 1) instead of summing.

    Returns:
        ``(B,)``: ``sum_t (logp - ref_logp) * mask`` (or that over ``sum_t mask``).
    """
    mask = mask.to(logp.dtype)
    ratios = ((logp - ref_logp) * mask).sum(-1)
    return ratios / mask.sum(-1).clamp(min=1) if average else ratios


def sequence_nll(logp: torch.Tensor, mask: torch.Tensor, average: bool = False) -> torch.Tensor:
    """Each sequence's negative log-likelihood over its masked tokens: the SFT term of DPO (NeMo-RL's NLLLossFn
    with dpo_loss=True), ``(B,)``; ``average`` divides by the sequence's tokens (at least 1)."""
    mask = mask.to(logp.dtype)
    nll = -(logp * mask).sum(-1)
    return nll / mask.sum(-1).clamp(min=1) if average else nll


def preference_loss(
    delta: torch.Tensor,
    beta: float,
    kind: PreferenceLoss = "dpo",
    gt_delta: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Per-pair preference loss of the reward margin ``d`` = ``delta``.

    - dpo: ``-(1 - e) log sigmoid(beta d) - e log sigmoid(-beta d)``, ``e`` = ``label_smoothing`` (conservative
      DPO; e = 0 is plain DPO).
    - ipo: ``(d - 1 / (2 beta))^2``.
    - rpo_sq: ``(beta d - g)^2``.
    - rpo_bwd_kl: ``KL(Bern(sigmoid(g)) || Bern(sigmoid(beta d)))``.
    - rpo_fwd_kl: ``KL(Bern(sigmoid(beta d)) || Bern(sigmoid(g)))``.

    Args:
        delta: ``r_chosen - r_rejected``, ``(B,)``, differentiable.
        beta: the KL strength (reference_policy_kl_penalty), > 0.
        kind: which loss.
        gt_delta: ``g``, the scaled ground-truth reward difference of each pair, ``(B,)``; the RPO losses need it.
        label_smoothing: ``e`` in [0, 0.5), dpo only.

    Returns:
        ``(B,)``, one loss per pair.
    """
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if label_smoothing and kind != "dpo":
        raise ValueError(f"label_smoothing acts only on the dpo loss, not {kind}")
    if kind == "dpo":
        z = beta * delta
        return -(1 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)
    if kind == "ipo":
        return (delta - 1 / (2 * beta)) ** 2
    if gt_delta is None:
        raise ValueError(f"the {kind} loss needs the pairs' ground-truth reward difference (gt_delta)")
    g = gt_delta.to(delta.dtype)
    if kind == "rpo_sq":
        return (beta * delta - g) ** 2
    log_b_chosen, log_b_rejected = F.logsigmoid(beta * delta), F.logsigmoid(-beta * delta)
    log_a_chosen, log_a_rejected = F.logsigmoid(g), F.logsigmoid(-g)
    if kind == "rpo_bwd_kl":
        return log_a_chosen.exp() * (log_a_chosen - log_b_chosen) + log_a_rejected.exp() * (
            log_a_rejected - log_b_rejected
        )
    if kind == "rpo_fwd_kl":
        return log_b_chosen.exp() * (log_b_chosen - log_a_chosen) + log_b_rejected.exp() * (
            log_b_rejected - log_a_rejected
        )
    raise ValueError(f"unknown preference loss {kind!r}")
