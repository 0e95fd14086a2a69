"""The rollout's helpers for models that run through transformers' own forward (every model but GPT-2, which
runs `gpt2_fast`): which masks they take, and a KV cache that grows in place."""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import DynamicLayer

# Attention implementations that take a ready-made additive 4D mask (batch, 1, query, key); for these the
# masks are built once per rollout instead of once per token inside the model (see takes_prebuilt_masks).
ADDITIVE_MASK_ATTENTION = ("sdpa", "eager")


def takes_prebuilt_masks(model: PreTrainedModel) -> bool:
    """Whether the decode loop may give the model additive 4D masks and a ``GrowingLayer`` cache.

    True for plain causal attention in every layer (no sliding windows or linear attention) computed by sdpa or
    eager; other models get 2D padding masks and transformers' own cache, slower but exact.
    """
    if getattr(model.config, "_attn_implementation", None) not in ADDITIVE_MASK_ATTENTION:
        return False
    text_config = model.config.get_text_config()
    layer_types = getattr(text_config, "layer_types", None)
    if layer_types is not None:
        return all(kind == "full_attention" for kind in layer_types)
    return getattr(text_config, "sliding_window", None) is None


class GrowingLayer(DynamicLayer):  # type: ignore[misc]  # transformers is Any to mypy (pyproject)
    """One layer's KV cache in buffers sized for the whole rollout.

    Appending a token writes in place; ``DynamicLayer`` concatenates, copying the whole cache every token,
    a large share of a small model's decode step.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self.key_buffer = torch.empty(0)
        self.value_buffer = torch.empty(0)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        batch, heads = key_states.shape[:2]
        self.key_buffer = key_states.new_empty((batch, heads, self.capacity, key_states.shape[-1]))
        self.value_buffer = value_states.new_empty((batch, heads, self.capacity, value_states.shape[-1]))
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        self.key_buffer[:, :, self.length : end] = key_states
        self.value_buffer[:, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self.key_buffer[:, :, :end], self.value_buffer[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.key_buffer, self.value_buffer = self.key_buffer[indices], self.value_buffer[indices]
        self.keys, self.values = self.key_buffer[:, :, : self.length], self.value_buffer[:, :, : self.length]
