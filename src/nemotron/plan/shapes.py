"""Model shapes for the resource plan, read without torch: a checkpoint's config.json and safetensors headers when
the directory is readable here, a `model.*` group for a model built from a config, or a row of `KNOWN_MODELS` (the
published config.json of models people align) for a Hugging Face id or a `plan.models` hint.

The memory terms need the parameter count (weights, gradients, optimizer state) and the transformer's shape
(layers, hidden size, MLP width, key/value heads, vocabulary) for the activations and the KV cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from nemotron.config.stepconfig import kv_heads
from nemotron.models.layout import CheckpointError, parameter_count, read_config


class ModelShape(NamedTuple):
    """What the plan needs to know about one model."""

    name: str  # the path, HF id or "model.*" it was read from
    family: str  # config.json's model_type
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int  # MLP width
    vocab: int
    gated_mlp: bool  # Llama-style gate/up/down (3 matrices) vs GPT-2's fc/proj (2)
    tied: bool  # input embedding and output head share one matrix
    parameters: int
    source: str  # "safetensors headers", "config.json", "model.*" or "shape table"
    context: int = 0  # longest sequence in tokens (n_positions, max_position_embeddings); 0: unknown

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_width(self) -> int:
        """Elements of K (or of V) per token per layer."""
        return self.kv_heads * self.head_dim


def computed_parameters(s: ModelShape) -> int:
    """Parameters of a decoder-only transformer of this shape (norms and biases included; GPT-2's learned
    positions are not, they are a rounding error next to the rest)."""
    attention = s.hidden * s.hidden * 2 + 2 * s.hidden * s.kv_width  # q, o; k, v
    mlp = (3 if s.gated_mlp else 2) * s.hidden * s.intermediate
    norms = 2 * s.hidden if s.gated_mlp else 4 * s.hidden  # RMSNorm weights; LayerNorm weights and biases
    biases = 0 if s.gated_mlp else 3 * s.hidden + s.intermediate + 2 * s.hidden
    if s.family == "qwen2":
        biases = s.hidden + 2 * s.kv_width  # q, k and v projections have biases
    embeddings = s.vocab * s.hidden * (1 if s.tied else 2)
    return s.layers * (attention + mlp + norms + biases) + embeddings + s.hidden


def shape_from_config(config: dict[str, Any], name: str, parameters: int | None, source: str) -> ModelShape:
    """A ModelShape from a Hugging Face config.json (GPT-2 names or Llama/Qwen2/Mistral names)."""
    family = str(config.get("model_type", "unknown"))
    if "n_embd" in config:  # GPT-2's names
        hidden, heads = int(config["n_embd"]), int(config["n_head"])
        shape = ModelShape(
            name, family, int(config["n_layer"]), hidden, heads, heads, int(config.get("n_inner") or 4 * hidden),
            int(config["vocab_size"]), False, bool(config.get("tie_word_embeddings", True)), 0, source,
            int(config.get("n_positions") or 0),
        )  # fmt: skip
    else:
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        shape = ModelShape(
            name, family, int(config["num_hidden_layers"]), hidden, heads,
            int(config.get("num_key_value_heads") or heads), int(config["intermediate_size"]),
            int(config["vocab_size"]), True, bool(config.get("tie_word_embeddings", False)), 0, source,
            int(config.get("max_position_embeddings") or 0),
        )  # fmt: skip
    return shape._replace(parameters=parameters if parameters is not None else computed_parameters(shape))


def shape_from_checkpoint(path: Path) -> ModelShape | None:
    """The shape of a local checkpoint directory (config.json, parameters from the safetensors headers); None
    when it is not a readable checkpoint here (a path on the cluster, an HF id)."""
    if not path.is_dir():
        return None
    try:
        config = read_config(path)
        count = parameter_count(path)
    except CheckpointError:
        return None
    try:
        return shape_from_config(config, str(path), count, "safetensors headers")
    except (KeyError, TypeError, ValueError):
        return None


def shape_from_arch(arch: Any, vocab: int) -> ModelShape:
    """The shape `nemotron.models.tiny.build_model` builds from a `model.*` group (GPT-2 size terms, `kv_heads`,
    tied embeddings)."""
    family, heads = str(arch.family), int(arch.n_head)
    kv = kv_heads(family, heads)
    shape = ModelShape(
        "model.*", family, int(arch.n_layer), int(arch.n_embd), heads, kv, 4 * int(arch.n_embd), vocab,
        family != "gpt2", True, 0, "model.*", int(arch.n_positions),
    )  # fmt: skip
    return shape._replace(parameters=computed_parameters(shape))


def _known(
    name: str, family: str, layers: int, hidden: int, heads: int, kv: int, inter: int, vocab: int, tied: bool
) -> ModelShape:
    context = 131072 if family == "llama" else 32768
    shape = ModelShape(
        name, family, layers, hidden, heads, kv, inter, vocab, True, tied, 0, "shape table", context
    )
    return shape._replace(parameters=computed_parameters(shape))


# From each model's published config.json on the Hugging Face hub (num_hidden_layers, hidden_size,
# num_attention_heads, num_key_value_heads, intermediate_size, vocab_size, tie_word_embeddings).
KNOWN_MODELS: dict[str, ModelShape] = {
    s.name: s
    for s in (
        _known("meta-llama/Llama-3.2-1B-Instruct", "llama", 16, 2048, 32, 8, 8192, 128256, True),
        _known("meta-llama/Llama-3.2-3B-Instruct", "llama", 28, 3072, 24, 8, 8192, 128256, True),
        _known("meta-llama/Llama-3.1-8B-Instruct", "llama", 32, 4096, 32, 8, 14336, 128256, False),
        _known("meta-llama/Llama-3.3-70B-Instruct", "llama", 80, 8192, 64, 8, 28672, 128256, False),
        _known("Qwen/Qwen2.5-0.5B", "qwen2", 24, 896, 14, 2, 4864, 151936, True),
        _known("Qwen/Qwen2.5-1.5B", "qwen2", 28, 1536, 12, 2, 8960, 151936, True),
        _known("Qwen/Qwen2.5-7B", "qwen2", 28, 3584, 28, 4, 18944, 152064, False),
        _known("Qwen/Qwen2.5-32B", "qwen2", 64, 5120, 40, 8, 27648, 152064, False),
    )
}
# The -Instruct and base checkpoints share a shape.
KNOWN_MODELS.update({k.removesuffix("-Instruct"): v for k, v in list(KNOWN_MODELS.items())})
KNOWN_MODELS.update({f"{k}-Instruct": v for k, v in list(KNOWN_MODELS.items()) if k.startswith("Qwen/")})


def known_shape(name: str) -> ModelShape | None:
    """The shape-table row for a Hugging Face id (case-insensitive), or None."""
    lowered = {k.lower(): v for k, v in KNOWN_MODELS.items()}
    found = lowered.get(name.strip().lower())
    return found._replace(name=name) if found else None
