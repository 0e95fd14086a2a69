"""What the lean-forward tests (test_gpt2_fast, test_llama_fast) share: a padded batch, and the check that a lean
forward's gradients are transformers'."""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from nemotron.rl.logprobs import token_logprobs

VOCAB = 97

# (model, input_ids, position_ids, attention_mask) -> logits (B, T, V)
Logits = Callable[[PreTrainedModel, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def padded_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows 0-1 left-padded by 3, rows 4-5 right-padded after 9 tokens: ids, mask, positions, each (6, 12)."""
    ids = torch.randint(1, VOCAB, (6, 12), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[:2, :3] = 0
    mask[4:, 9:] = 0
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    return ids, mask, positions


def assert_gradients_match_transformers(build: Callable[[], PreTrainedModel], lean: Logits) -> None:
    """Every parameter's gradient of a token-logprob loss is the same through ``lean`` as through ``model(...)``,
    each on a fresh ``build()`` in train mode."""
    ids, mask, positions = padded_batch()
    grads = []
    for logits_of in (None, lean):
        model = build().train()
        if logits_of is None:
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        else:
            logits = logits_of(model, ids, positions, mask)
        # The loss the trainers take: logprobs of real tokens read at real positions (a padding query's output
        # is never used, and the two implementations let it attend differently).
        logprobs = token_logprobs(logits, ids)
        (-(logprobs * mask[:, 1:] * mask[:, :-1]).sum()).backward()
        grads.append({name: p.grad for name, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name, expected in grads[0].items():
        assert expected is not None and expected.abs().sum() > 0, name
        torch.testing.assert_close(grads[1][name], expected, atol=1e-5, rtol=1e-4, msg=name)
