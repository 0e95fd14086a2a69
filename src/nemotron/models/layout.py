"""What a Hugging Face checkpoint directory holds, read without torch or transformers (the dry-run's start-up path):
its config, its safetensors files (one, or shards named by `model.safetensors.index.json`), its parameter count
from the safetensors headers, and a one-line description.

A safetensors file starts with an 8-byte little-endian header length and a JSON header mapping each tensor name
to its dtype, shape and byte offsets; the parameter count is the sum of the shapes' products, read in microseconds
without loading a weight.
"""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path
from typing import Any

from nemotron.errors import UserError

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
PICKLED = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.ckpt", "model.pt")
_MAX_HEADER = 100 * 2**20


class CheckpointError(UserError):
    """A checkpoint path that is missing, is not a checkpoint, or holds a different kind of model."""


def require_dir(path: Path) -> None:
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a checkpoint directory (it is a file)")


def read_config(path: Path) -> dict[str, Any]:
    """The checkpoint's config.json as a dict."""
    file = path / CONFIG_FILE
    if not file.is_file():
        raise CheckpointError(f"{path}: not a checkpoint (no {CONFIG_FILE})")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: unreadable {CONFIG_FILE}: {err}") from err
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: {CONFIG_FILE} is not a JSON object")
    return config


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint: `model.safetensors`, or the shards its index names.

    Pickled weights (`pytorch_model.bin`) are refused with the way out: loading a pickle runs code.
    """
    if (path / WEIGHTS_FILE).is_file():
        return [path / WEIGHTS_FILE]
    index = path / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            shards = sorted({str(name) for name in weight_map.values()})
        except (
            OSError,
            UnicodeDecodeError,
            json.JSONDecodeError,
            KeyError,
            TypeError,
            AttributeError,
        ) as err:
            raise CheckpointError(f"{path}: unreadable {INDEX_FILE}: {err!r}") from err
        missing = [name for name in shards if not (path / name).is_file()]
        if missing:
            raise CheckpointError(
                f"{path}: {INDEX_FILE} names shards that are not there: {', '.join(missing[:3])}"
            )
        return [path / name for name in shards]
    pickled = [name for name in PICKLED if (path / name).exists()]
    if pickled:
        raise CheckpointError(
            f"{path}: has only pickled weights ({pickled[0]}), which nemotron never loads (a pickle can run code): "
            "convert them to safetensors, e.g. model.save_pretrained(dir, safe_serialization=True)"
        )
    raise CheckpointError(f"{path}: not a checkpoint (no {WEIGHTS_FILE} or {INDEX_FILE})")


def safetensors_shapes(file: Path) -> dict[str, list[int]]:
    """Tensor name -> shape, from a safetensors file's header alone."""
    return {name: list(meta["shape"]) for name, meta in _header(file).items()}


def safetensors_dtypes(file: Path) -> dict[str, str]:
    """Tensor name -> safetensors dtype ("F32", "BF16", ...), from the header alone."""
    return {name: str(meta["dtype"]) for name, meta in _header(file).items()}


def _header(file: Path) -> dict[str, Any]:
    try:
        with file.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > _MAX_HEADER:
                raise CheckpointError(f"{file}: not a safetensors file (header of {length} bytes)")
            header = json.loads(handle.read(length))
    except (OSError, struct.error, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{file}: unreadable safetensors header: {err}") from err
    return {name: meta for name, meta in header.items() if name != "__metadata__"}


# Tensor names (their ends) of an input embedding and of a sequence classifier's score head, across the families
_EMBEDDINGS = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight")
_SCORE_HEADS = ("score.weight", "classifier.weight")


# A transformer block's tensors, across the families: `model.layers.3.self_attn.q_proj.weight` (Llama, Qwen2,
# Mistral), `transformer.h.3.attn.c_attn.weight` (GPT-2); (prefix, layer, the tensor's name within the layer)
_LAYER = re.compile(r"^(.*?\.(?:layers|h))\.(\d+)\.(.+)$")
_LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer")


def layer_problems(shapes: dict[str, list[int]], config: dict[str, Any]) -> list[str]:
    """Blocks config.json and the weights disagree on: layers config.json counts that hold no tensor (missing),
    layers past its count (extra), and a tensor most layers hold that one lacks. transformers would start the
    missing ones from random weights with a warning in a log, and drop the extra ones."""
    key = next((k for k in _LAYER_COUNT_KEYS if type(config.get(k)) is int), None)
    layers: dict[int, set[str]] = {}
    for name in shapes:
        m = _LAYER.match(name)
        if m:
            layers.setdefault(int(m[2]), set()).add(m[3])
    if key is None or not layers:
        return []
    count: int = config[key]
    problems = []
    missing = [i for i in range(count) if i not in layers]
    if missing:
        problems.append(
            f"config.json says {count} layers ({key}), and the weights hold no tensor of {_layers(missing)}"
        )
    extra = [i for i in sorted(layers) if i >= count]
    if extra:
        problems.append(
            f"the weights hold {_layers(extra)}, past the {count} layers config.json says ({key})"
        )
    every = set().union(*layers.values())
    for i in sorted(layers):
        lacking = sorted(every - layers[i])
        if lacking and i < count:
            shown = ", ".join(lacking[:3]) + (f" and {len(lacking) - 3} more" if len(lacking) > 3 else "")
            problems.append(f"layer {i} has no {shown}, which other layers have")
    return problems


def _layers(indices: list[int]) -> str:
    """[2, 3, 4, 7] -> "layers 2-4, 7"."""
    spans: list[list[int]] = []
    for i in indices:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return ("layer " if len(indices) == 1 else "layers ") + text


def shape_problems(path: Path, config: dict[str, Any], reward_model: bool) -> list[str]:
    """What would stop the checkpoint loading, read from config.json and the safetensors headers (no weight is
    read): an embedding whose rows are not config.json's vocab_size; blocks missing, extra or lacking a tensor
    (layer_problems); for a reward model, more than one label or a score head of more than one row. Each names the
    tensor and both shapes, or the layers."""
    shapes = {name: shape for file in weight_files(path) for name, shape in safetensors_shapes(file).items()}
    vocab = config.get("vocab_size", (config.get("text_config") or {}).get("vocab_size"))
    problems = [
        f"tensor {name} has {shape[0]} rows (shape {shape}) but config.json says vocab_size {vocab}"
        for name, shape in sorted(shapes.items())
        if name.endswith(_EMBEDDINGS) and type(vocab) is int and shape and shape[0] != vocab
    ]
    problems += layer_problems(shapes, config)
    if reward_model:
        labels = config.get("num_labels") or len(config.get("id2label") or {}) or 1
        if labels != 1:
            problems.append(
                f"a reward model gives one score, and config.json gives it {labels} labels (num_labels)"
            )
        problems += [
            f"tensor {name} has shape {shape}, a reward model's score head has shape [1, {shape[-1]}]"
            for name, shape in sorted(shapes.items())
            if name.endswith(_SCORE_HEADS) and shape and shape[0] != 1
        ]
    return problems


def parameter_count(path: Path) -> int:
    """Parameters stored in the checkpoint (a tied embedding is stored, and counted, once)."""
    return sum(math.prod(shape) for file in weight_files(path) for shape in safetensors_shapes(file).values())


def describe(path: Path) -> str | None:
    """ "llama (LlamaForCausalLM), 1.24B parameters in 2 safetensors shards" for a local checkpoint directory;
    None when `path` is not a local directory. A directory that is not a loadable checkpoint says why."""
    if not path.is_dir():
        return None
    try:
        config = read_config(path)
        files = weight_files(path)
        count = parameter_count(path)
    except CheckpointError as err:
        return f"not a loadable checkpoint: {str(err).removeprefix(f'{path}: ')}"
    architectures = ", ".join(config.get("architectures") or []) or "no architectures in config.json"
    stored = "one safetensors file" if len(files) == 1 else f"{len(files)} safetensors shards"
    return f"{config.get('model_type', 'unknown family')} ({architectures}), {human_count(count)} parameters in {stored}"


def human_count(n: int) -> str:
    """1234 -> "1.23K", 8030261248 -> "8.03B"."""
    for size, unit in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)
