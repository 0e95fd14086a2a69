"""The sampler's model paths as small decoders: each encodes the prompts once, then extends every row of its batch
by one token a step, keeping its KV cache and attention masks to itself.

Three paths: GPT-2 and Llama through a lean forward (`gpt2_fast`, `llama_fast`); other models through transformers' forward, with
additive masks built once per rollout and a cache that grows in place where every layer is plain causal attention
(`hf_cache.takes_prebuilt_masks`), else with 2D padding masks and transformers' own cache. All three compute the
same logits as a full forward pass over the same tokens (`tests/rl/test_decoders.py`).
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import Cache

from nemotron.rl import gpt2_fast, hf_cache, llama_fast


class Decoder(Protocol):
    """One model path of the sampler. The sampler calls `prefill` once, then `step` once a token; `keep` picks the
    rows of the batch (a prompt's copies after `prefill`, the rows still generating later)."""

    def prefill(self, input_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        """``(B, V)`` logits of each row's first response token after the left-padded prompts ``input_ids``
        ``(B, P)`` long, ``prompt_mask`` ``(B, P)`` long (1 on real tokens). Starts a new rollout."""
        ...

    def step(self, tokens: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """``(L, V)`` logits of the next token after ``tokens`` ``(L, 1)`` long, each row's newest token.

        ``real`` ``(L,)`` bool is False where the row had already finished: its token is padding, and no later
        token attends to it.
        """
        ...

    def keep(self, rows: torch.Tensor) -> None:
        """Keep rows ``rows`` (1-D long) of the batch, in that order; a repeated index copies a row."""
        ...


class LeanForward(Protocol):
    """`gpt2_fast.forward` and `llama_fast.forward`: logits straight from the model's parameters."""

    def __call__(
        self,
        model: Any,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        bias: torch.Tensor,
        *,
        cache: gpt2_fast.KVCache | None = None,
        capacity: int = 0,
        logits_to_keep: int = 0,
    ) -> torch.Tensor: ...


def lean_forward(model: PreTrainedModel) -> LeanForward | None:
    """The lean forward that computes exactly what ``model(...)`` would, or None (the model's own forward)."""
    if gpt2_fast.supports(model):
        return gpt2_fast.forward
    if llama_fast.supports(model):
        return llama_fast.forward
    return None


def decoder_for(model: PreTrainedModel, capacity: int) -> Decoder:
    """The fastest path that computes exactly what ``model(...)`` would, for rollouts of at most ``capacity``
    positions (prompt width + response width)."""
    lean = lean_forward(model)
    if lean is not None:
        return LeanDecoder(model, lean, capacity)
    if hf_cache.takes_prebuilt_masks(model):
        return PrebuiltMaskDecoder(model, capacity)
    return PaddingMaskDecoder(model, capacity)


class RolloutKeys:
    """Which positions each row of the batch attends to, and where its next token sits.

    The key mask covers the whole rollout (``capacity`` columns) and is filled in one column a step; each step
    reads a prefix. With a ``dtype`` the mask is also kept in additive form (0 where a row attends, the dtype's
    minimum elsewhere), which is what the prebuilt-mask paths hand the model.
    """

    def __init__(self, prompt_mask: torch.Tensor, capacity: int, dtype: torch.dtype | None) -> None:
        rows, self.width = prompt_mask.shape
        self.steps = 0
        response = torch.zeros((rows, capacity - self.width), dtype=torch.bool, device=prompt_mask.device)
        self.mask = torch.cat([prompt_mask.bool(), response], dim=1)
        self.bias: torch.Tensor | None = None
        if dtype is not None:
            blocked = torch.finfo(dtype).min
            self.bias = torch.zeros(self.mask.shape, dtype=dtype, device=prompt_mask.device)
            self.bias.masked_fill_(~self.mask, blocked)
        self.next_positions = prompt_mask.sum(dim=1).unsqueeze(1)

    def append(self, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add one column (attended where ``real``); returns the step's mask and ``(L, 1)`` positions.

        The mask is ``(L, 1, 1, K)`` additive with a dtype, else ``(L, K)`` long, ``K`` the columns so far.
        """
        column = self.width + self.steps
        self.mask[:, column] = real
        if self.bias is not None:
            self.bias[:, column].masked_fill_(real, 0.0)
            step_mask = self.bias[:, None, None, : column + 1]
        else:
            step_mask = self.mask[:, : column + 1].long()
        positions = self.next_positions + self.steps
        self.steps += 1
        return step_mask, positions

    def keep(self, rows: torch.Tensor) -> None:
        self.mask, self.next_positions = self.mask[rows], self.next_positions[rows]
        if self.bias is not None:
            self.bias = self.bias[rows]


def prompt_positions(prompt_mask: torch.Tensor) -> torch.Tensor:
    """``(B, P)`` long position ids of left-padded prompts: 0 at each row's first real token (and on padding)."""
    return (prompt_mask.cumsum(dim=1) - 1).clamp(min=0)


class RowCache(Protocol):
    """A KV cache that keeps a subset of its rows (`gpt2_fast.KVCache`, transformers' caches)."""

    def batch_select_indices(self, indices: torch.Tensor) -> None: ...


class CachedDecoder:
    """What every path shares: `prefill`, `step` and `keep` over a KV cache and the rollout's `RolloutKeys`.
    A path gives its cache, its mask form (``mask_dtype``: additive in that dtype; None: 2D long) and `forward`."""

    def __init__(self, capacity: int, cache: RowCache, mask_dtype: torch.dtype | None) -> None:
        self.capacity, self.cache, self.mask_dtype = capacity, cache, mask_dtype
        self.keys: RolloutKeys

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``(B, V)`` logits after ``ids`` ``(B, Q)``, extending the cache by ``Q`` positions."""
        raise NotImplementedError

    def prefill(self, input_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        self.keys = RolloutKeys(prompt_mask, self.capacity, self.mask_dtype)
        mask = prompt_mask if self.mask_dtype is None else gpt2_fast.causal_bias(prompt_mask, self.mask_dtype)
        return self.forward(input_ids, mask, prompt_positions(prompt_mask))

    def step(self, tokens: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        return self.forward(tokens, *self.keys.append(real))

    def keep(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.keys.keep(rows)


def _layers(model: PreTrainedModel) -> int:
    return int(model.config.get_text_config().num_hidden_layers)


def _dtype(model: PreTrainedModel) -> torch.dtype:
    dtype: torch.dtype = next(model.parameters()).dtype
    return dtype


class LeanDecoder(CachedDecoder):
    """A model through its lean forward (`lean_forward`), `gpt2_fast.KVCache` and additive masks."""

    def __init__(self, model: PreTrainedModel, lean: LeanForward, capacity: int) -> None:
        self.kv = gpt2_fast.KVCache(_layers(model))
        super().__init__(capacity, self.kv, _dtype(model))
        self.model, self.lean = model, lean

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        logits = self.lean(
            self.model, ids, positions, mask, cache=self.kv, capacity=self.capacity, logits_to_keep=1
        )
        return logits[:, -1, :]


class TransformersDecoder(CachedDecoder):
    """``model(...)`` with a transformers cache."""

    def __init__(
        self, model: PreTrainedModel, capacity: int, cache: Cache, mask_dtype: torch.dtype | None
    ) -> None:
        super().__init__(capacity, cache, mask_dtype)
        self.model = model
        # transformers 5.24 renamed `past_key_values` to `cache` (the old name warns, and goes in 5.40).
        self.cache_arg = (
            "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        )

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        out: Any = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{self.cache_arg: self.cache},
            logits_to_keep=1,
        )
        return out.logits[:, -1, :]  # type: ignore[no-any-return]


class PrebuiltMaskDecoder(TransformersDecoder):
    """transformers' forward with additive 4D masks built once per rollout and a cache of `hf_cache.GrowingLayer`s
    that grows in place (``hf_cache.takes_prebuilt_masks(model)`` must hold)."""

    def __init__(self, model: PreTrainedModel, capacity: int) -> None:
        cache = Cache(layers=[hf_cache.GrowingLayer(capacity) for _ in range(_layers(model))])
        super().__init__(model, capacity, cache, _dtype(model))


class PaddingMaskDecoder(TransformersDecoder):
    """transformers' forward with 2D padding masks and transformers' own cache: for any causal LM (sliding
    windows, attention implementations that build their own masks), slower but exact."""

    def __init__(self, model: PreTrainedModel, capacity: int) -> None:
        super().__init__(model, capacity, DynamicCache(config=model.config), None)
