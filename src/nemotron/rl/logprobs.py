"""Per-token log-probabilities and entropies from a causal LM's logits.

Convention (DESIGN.md): the logprob of token t+1 comes from the logits at position t, divided by the sampling
temperature, so every per-token tensor of the engine has length T-1 and index t means "the token at t+1".
"""

from __future__ import annotations

import torch


def _check_temperature(temperature: float) -> None:
    if not temperature > 0.0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probability of each next token under the temperature-scaled distribution.

    Args:
        logits: model output, shape ``(B, T, V)``, any float dtype (computed in float32 at least).
        input_ids: the token ids the logits were computed from, shape ``(B, T)``.
        temperature: the sampling temperature; the logits are divided by it, as the sampler did, so that
            the training logprobs match the rollout logprobs.

    Returns:
        Shape ``(B, T-1)``: ``out[:, t] = log softmax(logits[:, t] / temperature)[input_ids[:, t+1]]``.
        Differentiable with respect to ``logits``.
    """
    _check_temperature(temperature)
    if logits.dim() != 3 or input_ids.shape != logits.shape[:2]:
        raise ValueError(
            f"expected logits (B, T, V) and input_ids (B, T), got {logits.shape} and {input_ids.shape}"
        )
    # One float32 (B, T-1, V) copy at most: upcast (a no-op for float32) fused with the temperature division.
    # log p(x) = z_x - logsumexp(z) avoids materialising the whole log_softmax next to the scaled logits.
    scaled = logits[:, :-1].float()
    if temperature != 1.0:  # skip a full (B, T-1, V) pass, forward and backward, in the common case
        scaled = scaled / temperature
    targets = input_ids[:, 1:].unsqueeze(-1)
    picked = scaled.gather(-1, targets).squeeze(-1)
    return picked - torch.logsumexp(scaled, dim=-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy (nats) of the temperature-scaled categorical distribution at each position.

    This does not shift: to align with ``token_logprobs`` (the distribution that produced token t+1), pass
    ``logits[:, :-1]``.

    Args:
        logits: shape ``(..., V)``, e.g. ``(B, T-1, V)``.
        temperature: divides the logits first, > 0.

    Returns:
        Shape ``(...)``, each entry in ``[0, log V]``. Differentiable.
    """
    _check_temperature(temperature)
    scaled = logits.float() / temperature
    log_probs = torch.log_softmax(scaled, dim=-1)
    # Banned tokens (logit -inf) have p = 0 and log p = -inf; 0 * -inf is NaN in the value and the gradient,
    # so the log-probs are clamped to the most negative finite float first (its gradient there is 0).
    finite_log_probs = log_probs.clamp(min=torch.finfo(log_probs.dtype).min)
    return -(log_probs.exp() * finite_log_probs).sum(dim=-1)
