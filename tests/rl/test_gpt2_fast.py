"""The engine's lean GPT-2 forward computes what transformers computes: logits, gradients and cached decoding."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tests.rl.lean_forwards import VOCAB, assert_gradients_match_transformers, padded_batch
from transformers import GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from nemotron.models.tiny import tiny_model
from nemotron.rl import gpt2_fast


def gpt2(seed: int = 0, **overrides: Any) -> GPT2LMHeadModel:
    options: dict[str, Any] = {"n_layer": 3, "n_head": 4, "n_positions": 32, "attn_implementation": "sdpa"}
    return tiny_model(VOCAB, seed=seed, **(options | overrides))


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"activation_function": "gelu"},  # the erf GELU
        {"activation_function": "gelu_pytorch_tanh"},
        {"scale_attn_by_inverse_layer_idx": True},
        {"scale_attn_weights": False},
        {"attn_implementation": "eager"},
        {"tie_word_embeddings": False},
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default",
)
def test_logits_match_transformers_on_every_real_position(overrides: dict[str, Any]) -> None:
    model = gpt2(**overrides)
    assert gpt2_fast.supports(model)
    ids, mask, positions = padded_batch()
    expected = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    got = gpt2_fast.forward(model, ids, positions, gpt2_fast.causal_bias(mask, torch.float32))
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], atol=2e-5, rtol=0)
    # logits_to_keep: the same last positions, nothing else.
    kept = gpt2_fast.forward(
        model, ids, positions, gpt2_fast.causal_bias(mask, torch.float32), logits_to_keep=4
    )
    assert kept.shape == (6, 4, VOCAB)
    torch.testing.assert_close(kept, got[:, -4:], atol=1e-6, rtol=0)


def test_gradients_match_transformers_for_every_parameter() -> None:
    assert_gradients_match_transformers(
        lambda: gpt2(seed=5),
        lambda model, ids, positions, mask: gpt2_fast.forward(
            model, ids, positions, gpt2_fast.causal_bias(mask, torch.float32)
        ),
    )


def test_cached_decoding_equals_one_full_forward() -> None:
    model = gpt2(seed=2)
    ids, mask, positions = padded_batch()
    full = gpt2_fast.forward(model, ids, positions, gpt2_fast.causal_bias(mask, torch.float32))
    # Prefill 5 columns, then one column at a time; the key mask grows with each step.
    cache = gpt2_fast.KVCache(len(model.transformer.h))
    key_bias = torch.zeros(mask.shape, dtype=torch.float32).masked_fill_(
        ~mask.bool(), torch.finfo(torch.float32).min
    )
    steps = [gpt2_fast.forward(model, ids[:, :5], positions[:, :5], gpt2_fast.causal_bias(mask[:, :5], torch.float32),
                               cache=cache, capacity=12)]  # fmt: skip
    for t in range(5, 12):
        bias = key_bias[:, None, None, : t + 1]
        steps.append(gpt2_fast.forward(model, ids[:, t : t + 1], positions[:, t : t + 1], bias, cache=cache))
    assert cache.length == 12
    decoded = torch.cat(steps, dim=1)
    real = mask.bool()
    torch.testing.assert_close(decoded[real], full[real], atol=2e-5, rtol=0)
    with pytest.raises(ValueError, match="holds 12 positions"):
        gpt2_fast.forward(model, ids[:, :1], positions[:, :1], key_bias[:, None, None, :1], cache=cache)


def test_dropout_follows_train_mode() -> None:
    model = gpt2(seed=4, resid_pdrop=0.3, attn_pdrop=0.3, embd_pdrop=0.3)
    ids, mask, positions = padded_batch()
    bias = gpt2_fast.causal_bias(mask, torch.float32)
    eval_logits = gpt2_fast.forward(model, ids, positions, bias)
    torch.testing.assert_close(gpt2_fast.forward(model, ids, positions, bias), eval_logits, atol=0, rtol=0)
    model.train()
    first, second = (gpt2_fast.forward(model, ids, positions, bias) for _ in range(2))
    assert not torch.allclose(first, second) and not torch.allclose(first, eval_logits)


def test_padding_queries_never_produce_nan() -> None:
    model = gpt2(seed=6)
    ids, mask, positions = padded_batch()
    mask[0] = 0  # a row with no real token at all
    logits = gpt2_fast.forward(model, ids, positions, gpt2_fast.causal_bias(mask, torch.float32))
    assert torch.isfinite(logits).all()


def test_models_it_cannot_reproduce_exactly_go_to_transformers() -> None:
    class Custom(GPT2LMHeadModel):
        pass

    assert gpt2_fast.supports(gpt2())
    assert not gpt2_fast.supports(Custom(gpt2().config))  # a subclass may change the forward
    assert not gpt2_fast.supports(gpt2(activation_function="relu"))
    assert not gpt2_fast.supports(gpt2(reorder_and_upcast_attn=True))
    checkpointed = gpt2()
    checkpointed.activation_checkpointing_enable()
    assert not gpt2_fast.supports(checkpointed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4
    )
    llama = LlamaForCausalLM(config)
    assert not gpt2_fast.supports(llama)


def test_a_long_context_attends_through_sdpa_with_the_same_result() -> None:
    """Above SCORES_BYTES the score matrix is not built (its memory, not the plan's, would set the peak): the same
    function to float tolerance, causal mask included."""
    from nemotron.rl.gpt2_fast import SCORES_BYTES, attention

    q, k, v = (torch.randn(1, 2, 1500, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    assert 2 * 1500 * 1500 * 4 > SCORES_BYTES
    bias = torch.zeros(1, 1, 1500, 1500).masked_fill(
        torch.ones(1500, 1500, dtype=torch.bool).triu(1), float("-inf")
    )
    expected = torch.matmul((torch.matmul(q, k.transpose(-1, -2)) * 0.3 + bias).softmax(dim=-1), v)
    assert torch.allclose(attention(q, k, v, bias, 0.3, 0.0), expected, atol=1e-5)
