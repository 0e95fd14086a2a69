"""Which rows the sampler's model batch holds: each distinct prompt is encoded once and copied to the rows that
repeat it, and finished rows leave the batch once few enough are still generating."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Finished rows leave the model's batch once at most this fraction of it is still generating: one copy of the
# KV cache, paid back by every smaller step after it.
COMPACT_WHEN_LIVE_AT_MOST = 0.5


@dataclass(frozen=True)
class DistinctPrompts:
    """The prompts to encode, and how the rollout's rows map onto them."""

    input_ids: torch.Tensor
    """``(D, P)`` long, left-padded; ``D <= B``."""
    mask: torch.Tensor
    """``(D, P)`` long, 1 on real tokens."""
    copies: torch.Tensor | None
    """``(B,)`` long: the row of ``input_ids`` each rollout row repeats; None when every prompt is distinct
    (then ``input_ids`` and ``mask`` are the rollout's own, in its order)."""


def distinct_prompts(input_ids: torch.Tensor, prompt_mask: torch.Tensor) -> DistinctPrompts:
    """RLOO and GRPO sample several responses per prompt: find the distinct prompts of a left-padded batch.

    Rows count as the same prompt when both their ids and their masks agree (a padding id may equal a real
    token's).

    Args:
        input_ids: ``(B, P)`` long, left-padded.
        prompt_mask: ``(B, P)`` long, 1 on real tokens.
    """
    width = input_ids.shape[1]
    distinct, copies = torch.unique(torch.cat([input_ids, prompt_mask], dim=1), dim=0, return_inverse=True)
    if distinct.shape[0] == input_ids.shape[0]:
        return DistinctPrompts(input_ids, prompt_mask, None)
    return DistinctPrompts(distinct[:, :width], distinct[:, width:], copies)


def rows_to_keep(still_going: torch.Tensor, going: int) -> torch.Tensor | None:
    """The rows of the model's batch to keep after a step, or None to keep them all.

    Args:
        still_going: ``(L,)`` bool, the rows that have not finished.
        going: ``int(still_going.sum())``, which the caller has read already (one host sync a step).

    Returns:
        ``(K,)`` long, the indices of the rows still going, once at most ``COMPACT_WHEN_LIVE_AT_MOST`` of the
        batch is; else None (a smaller batch would not repay the copy of the cache).
    """
    if going > COMPACT_WHEN_LIVE_AT_MOST * still_going.shape[0]:
        return None
    return still_going.nonzero().squeeze(1)
