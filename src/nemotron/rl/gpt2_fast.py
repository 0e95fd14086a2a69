"""A lean forward pass for GPT-2 policies: the same function as transformers' GPT-2, with less Python around it.

On a small model most of a transformers forward is framework overhead (mask construction, cache bookkeeping,
output objects, hooks): about 0.7 ms of a 0.9 ms decode step for the tiny policy. This module computes the
same logits straight from the model's own parameters (nothing is copied, so autograd, the optimizer and
checkpoints see the usual ``GPT2LMHeadModel``), with ``scaled_dot_product_attention`` and a KV cache in
preallocated buffers. The engine uses it when `supports(model)` is true and falls back to ``model(...)``
otherwise; `tests/rl/test_gpt2_fast.py` checks it against transformers, logits and gradients.

Masks are additive, ``(B, 1, Q, K)``: 0 where a query may attend, the dtype's minimum elsewhere.
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard

import torch
import torch.nn.functional as F
from transformers import GPT2LMHeadModel

# GPT-2's activation names that are exactly one of torch's GELUs. "gelu_new" and "gelu_fast" are the tanh
# approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) written differently; "gelu" is the erf GELU.
_GELU_APPROXIMATION = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh", "gelu": "none"}


def supports(model: Any) -> TypeGuard[GPT2LMHeadModel]:
    """Whether `forward` computes exactly what ``model(...)`` would (else the engine calls the model)."""
    if type(model) is not GPT2LMHeadModel:  # subclasses may change the forward
        return False
    config = model.config
    return (
        config.activation_function in _GELU_APPROXIMATION
        and not config.add_cross_attention
        and not config.reorder_and_upcast_attn
        and not getattr(model.transformer, "gradient_checkpointing", False)
        and getattr(config, "_attn_implementation", "eager") in ("eager", "sdpa")
    )


class KVCache:
    """Keys and values of every layer in buffers sized for the whole rollout, ``(B, H, capacity, D)`` each.

    Appending writes in place; `select` keeps a subset of the rows (the engine drops finished rows).
    """

    def __init__(self, layers: int) -> None:
        self.keys: list[torch.Tensor] = [torch.empty(0)] * layers
        self.values: list[torch.Tensor] = [torch.empty(0)] * layers
        self.length = 0
        self.capacity = 0

    def append(
        self, layer: int, key: torch.Tensor, value: torch.Tensor, capacity: int
    ) -> tuple[torch.Tensor, ...]:
        """Store ``key``/``value`` of shape ``(B, H, Q, D)`` after the cached ones; returns the full keys, values."""
        if self.keys[layer].numel() == 0:
            shape = (key.shape[0], key.shape[1], capacity, key.shape[3])
            self.keys[layer], self.values[layer] = key.new_empty(shape), value.new_empty(shape)
            self.capacity = capacity
        end = self.length + key.shape[2]
        if end > self.capacity:
            raise ValueError(f"the KV cache holds {self.capacity} positions; this step needs {end}")
        self.keys[layer][:, :, self.length : end] = key
        self.values[layer][:, :, self.length : end] = value
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def advance(self, count: int) -> None:
        self.length += count

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep rows ``indices`` (a 1-D long tensor) of every layer."""
        self.keys = [k[indices] for k in self.keys]
        self.values = [v[indices] for v in self.values]


def causal_bias(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive causal + padding mask ``(B, 1, T, T)`` for a full forward over ``attention_mask`` ``(B, T)``.

    A padding query attends to itself only: a fully masked row would make attention NaN, and NaN at a padding
    position poisons the gradient even where the loss masks it out.
    """
    width = attention_mask.shape[1]
    device = attention_mask.device
    allowed = (
        torch.ones((width, width), dtype=torch.bool, device=device).tril() & attention_mask.bool()[:, None, :]
    )
    allowed |= torch.eye(width, dtype=torch.bool, device=device)
    bias = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return bias.masked_fill_(~allowed, torch.finfo(dtype).min).unsqueeze(1)


def _dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Dropout in training mode with ``p > 0``; otherwise ``x`` itself, without a call into torch."""
    return F.dropout(x, p) if p else x


SCORES_BYTES = 16 * 2**20  # the largest score matrix `attention` computes with matmuls; above it, sdpa


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float, dropout: float
) -> torch.Tensor:
    """softmax(q k^T scale + bias) v, with ``q`` ``(B, H, Q, D)``, ``k``/``v`` ``(B, H, K, D)``, ``bias`` ``(B, 1, Q, K)``.

    One query (a decode step) goes to ``scaled_dot_product_attention``, and so does a batch whose score matrix
    would pass SCORES_BYTES: two matmuls and a softmax keep B x H x Q x K scores (and their softmax, for the
    backward), which at long contexts dwarfs the layer's other activations (B=8, H=4, Q=K=2,048: 1,545 MiB
    against sdpa's flash kernel's 31 MiB, and 2.8 s against 0.8 s forward + backward; the resource plan counts
    no such matrix). Below it, the matmuls were the faster on an Intel Xeon (1.0 vs 1.4 ms at B=64, H=4, Q=K=21,
    D=16; 20 vs 23 ms at Q=K=80, D=64, forward + backward, one thread).
    """
    if q.shape[2] == 1 or q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] * q.element_size() > SCORES_BYTES:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout, scale=scale)
    weights = (torch.matmul(q, k.transpose(-1, -2)) * scale + bias).softmax(dim=-1)
    return torch.matmul(_dropout(weights, dropout), v)


def forward(
    model: GPT2LMHeadModel,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    bias: torch.Tensor,
    *,
    cache: KVCache | None = None,
    capacity: int = 0,
    logits_to_keep: int = 0,
) -> torch.Tensor:
    """Logits of ``model`` (``supports(model)`` must hold), honouring its train/eval mode (dropout).

    Args:
        input_ids: ``(B, Q)`` long, the new tokens.
        position_ids: ``(B, Q)`` long.
        bias: ``(B, 1, Q, K)`` additive mask over the cached keys then the new ones (``K = cached + Q``).
        cache: the rollout's `KVCache`, extended by ``Q`` positions; None for a full forward without cache.
        capacity: positions to allocate when the cache is first written.
        logits_to_keep: only the last this many positions go through the LM head; 0 keeps all.

    Returns:
        ``(B, Q', V)`` logits, ``Q' = logits_to_keep or Q``.
    """
    config = model.config  # transformers' config attributes are slow to read: read each once
    core = model.transformer
    batch, width = input_ids.shape
    embd, heads, eps = config.n_embd, config.n_head, config.layer_norm_epsilon
    head_dim = embd // heads
    training = model.training
    resid_dropout = config.resid_pdrop if training else 0.0
    attn_dropout = config.attn_pdrop if training else 0.0
    approximate = _GELU_APPROXIMATION[config.activation_function]
    scale = 1.0 / math.sqrt(head_dim) if config.scale_attn_weights else 1.0
    by_layer = config.scale_attn_by_inverse_layer_idx
    hidden = F.embedding(input_ids, core.wte.weight) + F.embedding(position_ids, core.wpe.weight)
    hidden = _dropout(hidden, config.embd_pdrop if training else 0.0)
    blocks: list[Any] = list(core.h)  # GPT2Block, whose submodules transformers leaves untyped
    for index, block in enumerate(blocks):
        attn, mlp = block.attn, block.mlp
        x = F.layer_norm(hidden, (embd,), block.ln_1.weight, block.ln_1.bias, eps)
        qkv = torch.addmm(attn.c_attn.bias, x.view(-1, embd), attn.c_attn.weight)
        q, k, v = (
            qkv.view(batch, width, 3, heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        )  # each (B, H, Q, D)
        if cache is not None:
            k, v = cache.append(index, k, v, capacity)
        attended = attention(q, k, v, bias, scale / (index + 1) if by_layer else scale, attn_dropout)
        projected = torch.addmm(
            attn.c_proj.bias, attended.transpose(1, 2).reshape(-1, embd), attn.c_proj.weight
        )
        hidden = hidden + _dropout(projected.view(batch, width, embd), resid_dropout)
        x = F.layer_norm(hidden, (embd,), block.ln_2.weight, block.ln_2.bias, eps)
        inner = F.gelu(torch.addmm(mlp.c_fc.bias, x.view(-1, embd), mlp.c_fc.weight), approximate=approximate)
        out = torch.addmm(mlp.c_proj.bias, inner, mlp.c_proj.weight)
        hidden = hidden + _dropout(out.view(batch, width, embd), resid_dropout)
    if cache is not None:
        cache.advance(width)
    if logits_to_keep:
        hidden = hidden[:, -logits_to_keep:]
    hidden = F.layer_norm(hidden, (embd,), core.ln_f.weight, core.ln_f.bias, eps)
    return F.linear(hidden, model.lm_head.weight)
