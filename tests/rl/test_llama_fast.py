"""The engine's lean Llama forward computes what transformers' LlamaForCausalLM computes: logits, gradients and
cached decoding, with full and grouped-query attention, tied and untied heads, biases and a rotary base."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tests.rl.lean_forwards import VOCAB, assert_gradients_match_transformers, padded_batch
from transformers import LlamaForCausalLM

from nemotron.models.tiny import tiny_model
from nemotron.rl import gpt2_fast, llama_fast


def llama(seed: int = 0, **overrides: Any) -> LlamaForCausalLM:
    options: dict[str, Any] = {
        "family": "llama",
        "n_layer": 3,
        "n_head": 4,
        "n_positions": 32,
        "intermediate_size": 48,
        "attn_implementation": "sdpa",
    }
    model = tiny_model(VOCAB, seed=seed, **(options | overrides))
    assert isinstance(model, LlamaForCausalLM)
    return model


def perturb_norms(model: LlamaForCausalLM) -> LlamaForCausalLM:
    """RMSNorm weights start at 1, where a missed weight would go unnoticed: move them off it."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.3)
    return model


def bias_of(mask: torch.Tensor) -> torch.Tensor:
    return gpt2_fast.causal_bias(mask, torch.float32)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"num_key_value_heads": 2},  # grouped-query attention
        {"num_key_value_heads": 1, "attn_implementation": "eager"},
        {"tie_word_embeddings": False},
        {"attention_bias": True},
        {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0}},
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default",
)
def test_logits_match_transformers_on_every_real_position(overrides: dict[str, Any]) -> None:
    config_only = {k: v for k, v in overrides.items() if k != "attn_implementation"}
    model = perturb_norms(llama(attn_implementation=overrides.get("attn_implementation", "sdpa")))
    if config_only:  # rebuild with the config change (biases and heads change the parameters)
        model = perturb_norms(llama(**overrides))
    assert llama_fast.supports(model)
    ids, mask, positions = padded_batch()
    expected = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    got = llama_fast.forward(model, ids, positions, bias_of(mask))
    real = mask.bool()
    assert got.shape == expected.shape
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=0)
    kept = llama_fast.forward(model, ids, positions, bias_of(mask), logits_to_keep=4)
    assert kept.shape == (6, 4, VOCAB)
    torch.testing.assert_close(kept, got[:, -4:], atol=1e-6, rtol=0)


def test_gradients_match_transformers_for_every_parameter() -> None:
    assert_gradients_match_transformers(
        lambda: perturb_norms(llama(seed=5, num_key_value_heads=2)),
        lambda model, ids, positions, mask: llama_fast.forward(model, ids, positions, bias_of(mask)),
    )


def test_cached_decoding_equals_one_full_forward() -> None:
    model = perturb_norms(llama(seed=2, num_key_value_heads=2))
    ids, mask, positions = padded_batch()
    full = llama_fast.forward(model, ids, positions, bias_of(mask))
    cache = gpt2_fast.KVCache(len(model.model.layers))
    key_bias = torch.zeros(mask.shape).masked_fill_(~mask.bool(), torch.finfo(torch.float32).min)
    steps = [
        llama_fast.forward(
            model, ids[:, :5], positions[:, :5], bias_of(mask[:, :5]), cache=cache, capacity=12
        )
    ]
    for t in range(5, 12):
        bias = key_bias[:, None, None, : t + 1]
        steps.append(llama_fast.forward(model, ids[:, t : t + 1], positions[:, t : t + 1], bias, cache=cache))
    assert cache.length == 12 and cache.keys[0].shape == (6, 2, 12, 8)  # the key/value heads are cached
    decoded = torch.cat(steps, dim=1)
    real = mask.bool()
    torch.testing.assert_close(decoded[real], full[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "overrides",
    [
        {"hidden_act": "gelu"},
        {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
        {"attn_implementation": "flex_attention"},
    ],
    ids=["gelu", "linear-rope", "flex"],
)
def test_configs_it_does_not_compute_go_to_transformers(overrides: dict[str, Any]) -> None:
    model = llama()
    for key, value in overrides.items():
        setattr(model.config, "_attn_implementation" if key == "attn_implementation" else key, value)
    assert not llama_fast.supports(model)
    assert not llama_fast.supports(tiny_model(VOCAB, family="mistral", n_head=4, intermediate_size=48))


def test_activation_checkpointing_goes_to_transformers() -> None:
    model = llama()
    assert llama_fast.supports(model)
    model.activation_checkpointing_enable()  # the lean forward would not recompute the blocks
    assert not llama_fast.supports(model)
