"""The sampler's model paths: each decoder's logits are a full forward pass's over the same tokens, through prompt
copies, padding after a row's end, dropped and reordered rows; `decoder_for` picks the fastest exact path."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import PreTrainedModel

from nemotron.models.tiny import tiny_model
from nemotron.rl.decoders import (
    Decoder,
    LeanDecoder,
    PaddingMaskDecoder,
    PrebuiltMaskDecoder,
    decoder_for,
    lean_forward,
    prompt_positions,
)
from nemotron.rl.rollout import left_pad

VOCAB = 97


def model_of(kind: str) -> PreTrainedModel:
    if kind == "gpt2":
        return tiny_model(VOCAB, seed=2, n_embd=32, n_head=4, attn_implementation="sdpa")
    llama: dict[str, Any] = {
        "family": "llama",
        "n_head": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 64,
    }
    if kind == "mistral-window-3":
        return tiny_model(VOCAB, seed=2, **{**llama, "family": "mistral"}, sliding_window=3)
    return tiny_model(VOCAB, seed=2, **llama)


def lean_decoder(model: PreTrainedModel, capacity: int) -> LeanDecoder:
    lean = lean_forward(model)
    assert lean is not None
    return LeanDecoder(model, lean, capacity)


def test_decoder_for_picks_the_fastest_exact_path() -> None:
    for kind in ("gpt2", "llama"):
        assert isinstance(decoder_for(model_of(kind), 16), LeanDecoder)
    # Llama with a rotary scaling the lean forward does not compute: transformers' forward, prebuilt masks.
    scaled = model_of("llama")
    scaled.config.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    assert lean_forward(scaled) is None
    assert isinstance(decoder_for(scaled, 16), PrebuiltMaskDecoder)
    # A sliding window needs transformers' own masks.
    assert isinstance(decoder_for(model_of("mistral-window-3"), 16), PaddingMaskDecoder)


class FullForward:
    """The expected logits: the model over every token so far, without a cache."""

    def __init__(self, model: PreTrainedModel, input_ids: torch.Tensor, prompt_mask: torch.Tensor) -> None:
        self.model = model
        self.ids, self.mask = input_ids, prompt_mask
        self.positions = prompt_positions(prompt_mask)
        self.next_position = prompt_mask.sum(dim=1, keepdim=True)

    def keep(self, rows: torch.Tensor) -> None:
        self.ids, self.mask = self.ids[rows], self.mask[rows]
        self.positions, self.next_position = self.positions[rows], self.next_position[rows]

    def append(self, tokens: torch.Tensor, real: torch.Tensor) -> None:
        self.ids = torch.cat([self.ids, tokens], dim=1)
        self.mask = torch.cat([self.mask, real.long().unsqueeze(1)], dim=1)
        self.positions = torch.cat([self.positions, self.next_position], dim=1)
        self.next_position = self.next_position + 1

    def logits(self) -> torch.Tensor:
        out: Any = self.model(input_ids=self.ids, attention_mask=self.mask, position_ids=self.positions)
        return out.logits[:, -1, :]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("kind", "decoder_class"),
    [
        ("gpt2", lean_decoder),
        ("gpt2", PrebuiltMaskDecoder),
        ("gpt2", PaddingMaskDecoder),
        ("llama", lean_decoder),
        ("llama", PrebuiltMaskDecoder),
        ("llama", PaddingMaskDecoder),
        ("mistral-window-3", PaddingMaskDecoder),
    ],
)
def test_a_decoder_gives_the_logits_of_a_full_forward_pass(kind: str, decoder_class: Any) -> None:
    model = model_of(kind)  # tiny_model returns it in eval mode
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12], [13]]
    input_ids, prompt_mask = left_pad(prompts, 0)
    steps = 5
    decoder: Decoder = decoder_class(model, input_ids.shape[1] + steps)
    expected = FullForward(model, input_ids, prompt_mask)
    tokens = torch.randint(1, VOCAB, (4, steps), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = decoder.prefill(input_ids, prompt_mask)
        torch.testing.assert_close(logits, expected.logits(), atol=1e-5, rtol=0)
        # Four rows: prompt 1 twice, as RLOO's copies of a prompt.
        copies = torch.tensor([0, 1, 1, 2])
        rows_seen = 4
        for t in range(steps):
            if t == 0:
                decoder.keep(copies)
                expected.keep(copies)
            if t == 3:  # row 2 ended at step 2: drop it, and reorder the rest
                decoder.keep(torch.tensor([3, 0, 1]))
                expected.keep(torch.tensor([3, 0, 1]))
                rows_seen = 3
            real = torch.ones(rows_seen, dtype=torch.bool)
            if t == 2:
                real[1] = False  # row 1 ended at step 1: its token here is padding, attended by nothing
            step_tokens = tokens[:rows_seen, t : t + 1]
            logits = decoder.step(step_tokens, real)
            expected.append(step_tokens, real)
            assert logits.shape == (rows_seen, VOCAB)
            torch.testing.assert_close(logits, expected.logits(), atol=1e-5, rtol=0)
