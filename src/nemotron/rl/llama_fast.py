"""A lean forward pass for Llama policies: the same function as transformers' ``LlamaForCausalLM``, with less
Python around it.

As `gpt2_fast` does for GPT-2, this computes the logits straight from the model's own parameters (RMSNorm,
rotary position embeddings, grouped-query attention, SwiGLU), so autograd, the optimizer and checkpoints see
the usual model. It shares `gpt2_fast`'s KV cache, additive masks and attention. The engine uses it when
`supports(model)` is true; `tests/rl/test_llama_fast.py` checks it against transformers, logits and gradients.
"""

from __future__ import annotations

from typing import Any, TypeGuard

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM

from nemotron.rl.gpt2_fast import KVCache, attention


def supports(model: Any) -> TypeGuard[LlamaForCausalLM]:
    """Whether `forward` computes exactly what ``model(...)`` would (else the engine calls the model)."""
    if type(model) is not LlamaForCausalLM:  # subclasses may change the forward
        return False
    config = model.config
    rope = getattr(config, "rope_parameters", None) or {}
    return (
        config.hidden_act == "silu"
        and rope.get("rope_type", "default") == "default"
        and getattr(config, "pretraining_tp", 1) in (None, 1)
        and not getattr(model.model, "gradient_checkpointing", False)
        and getattr(config, "_attn_implementation", "eager") in ("eager", "sdpa")
    )


def rotary_tables(model: LlamaForCausalLM, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)``, each ``(B, 1, Q, D)``: transformers' default rotary embedding at ``position_ids`` ``(B, Q)``."""
    rotary = model.model.rotary_emb
    freqs = position_ids[..., None].float() * rotary.inv_freq.float()
    angles = torch.cat((freqs, freqs), dim=-1)
    scaling = rotary.attention_scaling
    cos, sin = angles.cos(), angles.sin()
    if scaling != 1.0:
        cos, sin = cos * scaling, sin * scaling
    dtype = model.model.embed_tokens.weight.dtype
    return cos.to(dtype).unsqueeze(1), sin.to(dtype).unsqueeze(1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x cos + rotate_half(x) sin``, with ``rotate_half(x) = cat(-x2, x1)`` over the last dimension."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _kv_heads(x: torch.Tensor, groups: int) -> torch.Tensor:
    """``(B, KVH, K, D)`` -> ``(B, KVH * groups, K, D)``, each key/value head repeated for its query heads."""
    if groups == 1:
        return x
    batch, heads, length, dim = x.shape
    return x[:, :, None].expand(batch, heads, groups, length, dim).reshape(batch, heads * groups, length, dim)


def forward(
    model: LlamaForCausalLM,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    bias: torch.Tensor,
    *,
    cache: KVCache | None = None,
    capacity: int = 0,
    logits_to_keep: int = 0,
) -> torch.Tensor:
    """Logits of ``model`` (``supports(model)`` must hold), honouring its train/eval mode (attention dropout).

    Arguments and result as `gpt2_fast.forward`: ``input_ids``/``position_ids`` ``(B, Q)`` long, ``bias``
    ``(B, 1, Q, K)`` additive over the cached keys then the new ones; returns ``(B, Q', V)`` logits,
    ``Q' = logits_to_keep or Q``. The cache holds the key/value heads after the rotary embedding.
    """
    config = model.config  # transformers' config attributes are slow to read: read each once
    core = model.model
    batch, width = input_ids.shape
    embd, heads, eps = config.hidden_size, config.num_attention_heads, config.rms_norm_eps
    head_dim = getattr(config, "head_dim", None) or embd // heads
    kv_heads = config.num_key_value_heads
    groups = heads // kv_heads
    scale = head_dim**-0.5
    attn_dropout = config.attention_dropout if model.training else 0.0
    cos, sin = rotary_tables(model, position_ids)
    hidden = F.embedding(input_ids, core.embed_tokens.weight)
    layers: list[Any] = list(core.layers)  # LlamaDecoderLayer, whose submodules transformers leaves untyped
    for index, layer in enumerate(layers):
        attn, mlp = layer.self_attn, layer.mlp
        x = F.rms_norm(hidden, (embd,), layer.input_layernorm.weight, eps)
        q = F.linear(x, attn.q_proj.weight, attn.q_proj.bias).view(batch, width, heads, head_dim)
        k = F.linear(x, attn.k_proj.weight, attn.k_proj.bias).view(batch, width, kv_heads, head_dim)
        v = F.linear(x, attn.v_proj.weight, attn.v_proj.bias).view(batch, width, kv_heads, head_dim)
        q, k = _rotate(q.transpose(1, 2), cos, sin), _rotate(k.transpose(1, 2), cos, sin)
        v = v.transpose(1, 2)  # each (B, heads, Q, D)
        if cache is not None:
            k, v = cache.append(index, k, v, capacity)
        attended = attention(q, _kv_heads(k, groups), _kv_heads(v, groups), bias, scale, attn_dropout)
        merged = attended.transpose(1, 2).reshape(batch, width, heads * head_dim)
        hidden = hidden + F.linear(merged, attn.o_proj.weight, attn.o_proj.bias)
        x = F.rms_norm(hidden, (embd,), layer.post_attention_layernorm.weight, eps)
        gate = F.silu(F.linear(x, mlp.gate_proj.weight, mlp.gate_proj.bias))
        up = F.linear(x, mlp.up_proj.weight, mlp.up_proj.bias)
        hidden = hidden + F.linear(gate * up, mlp.down_proj.weight, mlp.down_proj.bias)
    if cache is not None:
        cache.advance(width)
    if logits_to_keep:
        hidden = hidden[:, -logits_to_keep:]
    hidden = F.rms_norm(hidden, (embd,), core.norm.weight, eps)
    return F.linear(hidden, model.lm_head.weight, model.lm_head.bias)
