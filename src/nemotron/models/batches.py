"""Turn SFT and preference records into padded tensor batches for the supervised and preference steps.

Both build each sequence as `encode_prompt(prompt) + encode_response(response)` (response + EOS), the
same token layout the RL steps sample and score, and pad on the right with the tokenizer's pad id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerFast

from nemotron.data.records import PreferenceRecord, Prompt, SFTRecord, prompt_text
from nemotron.models.tokenizer import encode_prompt, encode_response

# What transformers' causal-LM loss ignores.
IGNORE_INDEX = -100


class SFTBatch(NamedTuple):
    """input_ids, attention_mask and labels, each of shape ``(b, t)``."""

    input_ids: Tensor
    attention_mask: Tensor
    labels: Tensor


class PreferenceBatch(NamedTuple):
    """Chosen and rejected sequences stacked for one forward pass: rows ``[:b]`` are the chosen
    responses and rows ``[b:]`` the rejected ones, both tensors of shape ``(2b, t)``."""

    input_ids: Tensor
    attention_mask: Tensor


def sft_batch(tokenizer: PreTrainedTokenizerFast, records: Sequence[SFTRecord], max_length: int) -> SFTBatch:
    """Tokenise SFT records; the loss falls only on the response tokens and the EOS after them.

    `labels` equal `input_ids` on response and EOS positions and IGNORE_INDEX on prompt and padding
    (transformers shifts them by one inside the model). A sequence longer than `max_length` loses
    the end of its response, EOS included.

    Returns:
        SFTBatch of tensors shaped ``(b, t)``, t = the longest sequence (at most `max_length`).
    """
    rows: list[tuple[list[int], int]] = []
    for record in records:
        prompt = encode_prompt(tokenizer, record.prompt)
        if len(prompt) >= max_length:
            raise ValueError(
                f"prompt {prompt_text(record.prompt)!r} has {len(prompt)} tokens, max_length is {max_length}"
            )
        ids = (prompt + encode_response(tokenizer, record.response))[:max_length]
        rows.append((ids, len(prompt)))
    input_ids, attention_mask = _pad_right([ids for ids, _ in rows], pad_id(tokenizer))
    labels = input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)
    for i, (_, n_prompt) in enumerate(rows):
        labels[i, :n_prompt] = IGNORE_INDEX
    return SFTBatch(input_ids, attention_mask, labels)


def preference_batch(
    tokenizer: PreTrainedTokenizerFast, records: Sequence[PreferenceRecord], max_length: int
) -> PreferenceBatch:
    """Tokenise preference pairs as prompt + response + EOS, chosen rows first, then rejected rows.

    Score them with `sequence_rewards` and split with ``scores.chunk(2)``. Sequences longer than
    `max_length` are cut from the end.

    Returns:
        PreferenceBatch of tensors shaped ``(2b, t)``.
    """
    chosen = [_prompt_response(tokenizer, r.prompt, r.chosen)[:max_length] for r in records]
    rejected = [_prompt_response(tokenizer, r.prompt, r.rejected)[:max_length] for r in records]
    input_ids, attention_mask = _pad_right(chosen + rejected, pad_id(tokenizer))
    return PreferenceBatch(input_ids, attention_mask)


class EncodedPair(NamedTuple):
    """One preference pair as token ids: prompt + response + EOS of each response, cut to the step's max_length,
    and how many leading tokens are the prompt's (the same in both)."""

    chosen: list[int]
    rejected: list[int]
    prompt_tokens: int

    @property
    def has_responses(self) -> bool:
        """Whether both responses keep at least one token after the cut."""
        return min(len(self.chosen), len(self.rejected)) > self.prompt_tokens


class PairBatch(NamedTuple):
    """Pairs stacked for one forward pass, chosen rows ``[:b]`` then rejected rows ``[b:]``: input_ids and
    attention_mask ``(2b, t)``, and response_mask ``(2b, t - 1)``, aligned with ``token_logprobs`` (index j is
    the token at j + 1): 1 on response tokens and EOS, 0 on prompt and padding."""

    input_ids: Tensor
    attention_mask: Tensor
    response_mask: Tensor


def encode_pair(tokenizer: PreTrainedTokenizerFast, record: PreferenceRecord, max_length: int) -> EncodedPair:
    """Tokenise a pair as prompt + response + EOS (the layout sft trains and the RL steps sample), each sequence
    cut to `max_length` from the end."""
    prompt = encode_prompt(tokenizer, record.prompt)
    return EncodedPair(
        (prompt + encode_response(tokenizer, record.chosen))[:max_length],
        (prompt + encode_response(tokenizer, record.rejected))[:max_length],
        len(prompt),
    )


def pair_batch(pairs: Sequence[EncodedPair], pad_id: int) -> PairBatch:
    """Pad encoded pairs on the right into one batch, chosen rows first (see PairBatch)."""
    rows = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    input_ids, attention_mask = _pad_right(rows, pad_id)
    prompts = torch.tensor([p.prompt_tokens for p in pairs] * 2).unsqueeze(1)
    positions = torch.arange(1, input_ids.shape[1]).unsqueeze(0)  # the token each logprob is of
    response_mask = (positions >= prompts) & (attention_mask[:, 1:] == 1)
    return PairBatch(input_ids, attention_mask, response_mask.long())


def _prompt_response(tokenizer: PreTrainedTokenizerFast, prompt: Prompt, response: str) -> list[int]:
    return encode_prompt(tokenizer, prompt) + encode_response(tokenizer, response)


def _pad_right(rows: Sequence[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Pad rows of ids on the right; returns input_ids and attention_mask, shape ``(b, t)``."""
    if not rows:
        raise ValueError("cannot build a batch from no records")
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, ids in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[i, : len(ids)] = 1
    return input_ids, attention_mask


def pad_id(tokenizer: PreTrainedTokenizerFast) -> int:
    pad = tokenizer.pad_token_id
    if not isinstance(pad, int):
        raise ValueError("the tokenizer has no pad token")
    return pad
