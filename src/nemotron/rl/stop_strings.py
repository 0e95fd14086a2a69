"""Stop strings for the built-in sampler: which rows end because their newest token completed a stop string.

Semantics follow vLLM's token output (what NeMo-RL trains on): the row ends on the token that completes its first
match, that token stays in the response (it was sampled, so its logprob is trained on) and nothing after it is
generated. The response text decoded from those tokens therefore ends with the stop string.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def stop_window(stop_strings: Sequence[str]) -> int:
    """How many trailing tokens to decode to see every match that ends in the newest token.

    A match not seen at the previous token ends in the newest one. Every token decodes to at least one byte, so a
    match of ``b`` UTF-8 bytes lies within the last ``b`` tokens; one token more keeps decoders that drop their
    first token's leading space (SentencePiece) from hiding a match that starts at the window's edge.
    """
    if not stop_strings:
        return 0
    return max(len(s.encode("utf-8")) for s in stop_strings) + 1


def ends_in_stop_string(
    tails: torch.Tensor, decode: Callable[[list[int]], str], stop_strings: Sequence[str]
) -> torch.Tensor:
    """Which rows' decoded tail contains a stop string.

    Args:
        tails: ``(R, w)`` long, the last ``w <= stop_window(stop_strings)`` tokens of ``R`` live responses (all
            generated, none padding), the newest last.
        decode: token ids -> text.
        stop_strings: non-empty strings.

    Returns:
        ``(R,)`` bool on ``tails.device``.
    """
    hits = [any(s in decode(ids) for s in stop_strings) for ids in tails.tolist()]
    return torch.tensor(hits, dtype=torch.bool, device=tails.device)


def completes_stop_string(
    responses: torch.Tensor,
    live: torch.Tensor,
    active: torch.Tensor,
    t: int,
    decode: Callable[[list[int]], str],
    stop_strings: Sequence[str],
) -> torch.Tensor:
    """Which rows of the model's batch ended on token ``t`` because it completed a stop string.

    Only the last `stop_window` tokens of each active row are decoded, so a step costs the same at any length.

    Args:
        responses: ``(B, N)`` long, the rollout's responses so far (columns ``0..t`` written).
        live: ``(L,)`` long, the rollout row of each row of the model's batch.
        active: ``(L,)`` bool, the rows whose token ``t`` is a generated token (not padding after an end).
        t: the newest column.
        decode: token ids -> text.
        stop_strings: non-empty strings.

    Returns:
        ``(L,)`` bool, False where not ``active``.
    """
    window = stop_window(stop_strings)
    hits = torch.zeros_like(active)
    rows = active.nonzero().squeeze(1)
    if rows.numel():
        tails = responses[live[rows], max(0, t + 1 - window) : t + 1]
        hits[rows] = ends_in_stop_string(tails, decode, stop_strings)
    return hits
