"""Build causal LMs of the GPT-2, Llama, Qwen2 and Mistral families from a config, with random weights: no hub
downloads anywhere.

The tiny preset (GPT-2, 2 layers, 64 wide, ~0.13M parameters with the tiny task's tokenizer) trains on two CPU
cores in seconds. The other families get the same sizes in their own terms (hidden_size, num_hidden_layers, ...),
grouped-query attention where the family uses it, and tied embeddings. Dropout is off: RL compares logprobs of the
same tokens computed at rollout and at training time, and dropout would make them differ for no reason.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Literal

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
)

from nemotron.config.stepconfig import kv_heads

FAMILIES = ("gpt2", "llama", "qwen2", "mistral")


def build_model(
    kind: Literal["policy", "reward_model"],
    vocab_size: int,
    n_layer: int,
    n_embd: int,
    n_head: int,
    n_positions: int,
    seed: int,
    *,
    pad_token_id: int | None = None,
    eos_token_id: int | None = None,
    family: str = "gpt2",
    attn_implementation: str | None = None,
    **config_overrides: Any,
) -> PreTrainedModel:
    """A randomly initialised causal LM (`policy`) or reward model (a scalar score head) of `family` ("gpt2",
    "llama", "qwen2" or "mistral") in GPT-2's size terms, with the tokenizer's special-token ids recorded and no
    dropout; the same seed gives the same weights. `config_overrides` set further config attributes (e.g.
    `resid_pdrop=0.1`).

    Key/value heads follow `kv_heads`, and Mistral keeps its sliding window (as long as the context), so the tiny
    models take the same code paths as the real ones. The global torch RNG is left as it was, so building a model
    does not shift later sampling.
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}: expected one of {', '.join(FAMILIES)}")
    if n_embd % n_head:
        raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")
    ids: dict[str, Any] = dict(
        pad_token_id=pad_token_id, eos_token_id=eos_token_id, bos_token_id=eos_token_id
    )
    config: PretrainedConfig
    if family == "gpt2":
        config = GPT2Config(
            vocab_size=vocab_size, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_positions=n_positions,
            n_inner=4 * n_embd, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, summary_first_dropout=0.0,
            **ids,
        )  # fmt: skip
    else:
        common: dict[str, Any] = dict(
            vocab_size=vocab_size, hidden_size=n_embd, intermediate_size=4 * n_embd,
            num_hidden_layers=n_layer, num_attention_heads=n_head, num_key_value_heads=kv_heads(family, n_head),
            max_position_embeddings=n_positions, attention_dropout=0.0, tie_word_embeddings=True, **ids,
        )  # fmt: skip
        if family == "llama":
            config = LlamaConfig(**common)
        elif family == "qwen2":
            config = Qwen2Config(**common)
        else:
            config = MistralConfig(**common, sliding_window=n_positions)
    # Not a config argument, but the token-classification head (PPO's critic) reads it, else drops out 10%.
    config.classifier_dropout = 0.0
    for key, value in config_overrides.items():
        setattr(config, key, value)
    auto_class: Any = AutoModelForCausalLM
    if kind == "reward_model":
        if pad_token_id is None:  # it pools the last token that is not padding; transformers needs the id
            raise ValueError("a reward model needs a pad_token_id")
        config.num_labels = 1
        auto_class = AutoModelForSequenceClassification
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return from_config(auto_class, config, attn_implementation)


build_policy = partial(build_model, "policy")
"""A randomly initialised causal LM: `build_model("policy", ...)`."""


def tiny_model(
    vocab_size: int,
    kind: Literal["policy", "reward_model"] = "policy",
    *,
    seed: int = 0,
    n_layer: int = 2,
    n_embd: int = 32,
    n_head: int = 2,
    n_positions: int = 64,
    pad_token_id: int | None = 0,
    eos_token_id: int | None = None,
    **options: Any,
) -> PreTrainedModel:
    """The model tests and benchmarks build: `build_model` with small defaults, in eval mode. No EOS by
    default, so generation stops only where the caller says; `options` are `build_model`'s (family,
    attn_implementation, config attributes)."""
    model = build_model(
        kind, vocab_size, n_layer, n_embd, n_head, n_positions, seed, pad_token_id=pad_token_id,
        eos_token_id=eos_token_id, **options,
    )  # fmt: skip
    model.train(False)
    return model


def from_config(
    auto_class: Any, config: PretrainedConfig, attn_implementation: str | None = None
) -> PreTrainedModel:
    """`auto_class.from_config(config)`, typed (transformers leaves the auto classes unannotated)."""
    options = {"attn_implementation": attn_implementation} if attn_implementation else {}
    model: PreTrainedModel = auto_class.from_config(config, **options)
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
