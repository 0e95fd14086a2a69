"""Hugging Face-format checkpoints (safetensors weights, config, tokenizer), written atomically, for any
transformers causal LM (GPT-2, Llama, Qwen2, Mistral, ...).

`save_checkpoint` writes into a temporary sibling directory and renames it into place, so a crash never leaves a
half-written checkpoint at the final path; big models are written as shards with a `model.safetensors.index.json`.
The loaders read safetensors only (one file or shards), never pickles, work offline, and raise `CheckpointError`
naming the path when it is not the expected kind of model. Layouts (docs/rl-engine.md):

- a policy: the family's `*ForCausalLM` (`GPT2LMHeadModel` for GPT-2);
- a reward model: the family's `*ForSequenceClassification` with one label (the score read at the last real token);
- a PPO critic: the family's `*ForTokenClassification` with one label (a value at every token).
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import SafetensorError
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
)

from nemotron.errors import disk_full, disk_full_while
from nemotron.models.layout import (
    INDEX_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    read_config,
    require_dir,
    weight_files,
)
from nemotron.models.reward import Critic

log = logging.getLogger(__name__)

PathArg = str | os.PathLike[str]
Device = torch.device | str | None  # where a loaded model goes (None: the CPU)

TOKENIZER_FILE = "tokenizer.json"
DEFAULT_SHARD_SIZE = "5GB"  # transformers' default: the 2B-8B policies of the default presets come in shards

# What each kind of checkpoint is, by the transformers auto class that loads it and the class names it accepts.
_KINDS: dict[str, tuple[Any, dict[str, Any]]] = {
    "policy (causal LM)": (AutoModelForCausalLM, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES),
    "reward model (one-label sequence classification)": (
        AutoModelForSequenceClassification,
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    ),
    "critic (one-label token classification)": (
        AutoModelForTokenClassification,
        MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
    ),
}


__all__ = [
    "CheckpointError",
    "load_critic",
    "load_policy",
    "load_reward_model",
    "load_tokenizer",
    "save_checkpoint",
]


def save_checkpoint(
    model: PreTrainedModel,
    path: PathArg,
    tokenizer: PreTrainedTokenizerFast | None = None,
    *,
    max_shard_size: int | str = DEFAULT_SHARD_SIZE,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Save `model` (and `tokenizer`) as a Hugging Face checkpoint directory at `path`.

    Everything is written to `.<name>.tmp-<random>` beside `path`, flushed to disk, then renamed to
    `path`. Weights over `max_shard_size` are split into shards with an index, as transformers does. The weights
    are saved as they are held (a bf16 model writes bf16). An existing checkpoint at `path` is replaced: it is moved aside, the new one renamed in,
    and the old one deleted, so `path` is always either the old or the new complete checkpoint
    except for the instant between the two renames. `state_dict`: the weights to write instead of the model's own
    (a sharded model's, gathered: `rl.sharding.full_state_dict`).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")
    try:
        model.save_pretrained(tmp, max_shard_size=max_shard_size, state_dict=state_dict)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if not (tmp / WEIGHTS_FILE).is_file() and not (tmp / INDEX_FILE).is_file():
            raise CheckpointError(
                f"{path}: saving wrote no {WEIGHTS_FILE}; is the model a transformers model?"
            )
        _fsync_tree(tmp)
        if path.exists():
            old = path.with_name(f".{path.name}.old-{uuid.uuid4().hex}")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if disk_full(err, path.parent) is not None:
            raise disk_full_while(
                "the checkpoint", path, _state_bytes(state_dict or model.state_dict())
            ) from err
        raise
    log.info("saved checkpoint %s", path)
    return path


def _state_bytes(state: dict[str, torch.Tensor]) -> int:
    """The bytes of a state dict's tensors (a tied weight once): about what its safetensors take."""
    seen: dict[int, int] = {}
    for tensor in state.values():
        seen[tensor.data_ptr()] = tensor.numel() * tensor.element_size()
    return sum(seen.values())


def load_policy(path: PathArg, *, device: Device = None, dtype: torch.dtype | None = None) -> PreTrainedModel:
    """Load a causal LM policy of any transformers family (config.json + safetensors, sharded or not)."""
    return _load(path, "policy (causal LM)", device, dtype)


def load_reward_model(
    path: PathArg, *, device: Device = None, dtype: torch.dtype | None = None
) -> PreTrainedModel:
    """Load a reward model: a `*ForSequenceClassification` with one label and a pad token id to pool with."""
    model = _load(path, "reward model (one-label sequence classification)", device, dtype)
    if model.config.num_labels != 1:
        raise CheckpointError(
            f"{path}: a reward model has one score, this one has {model.config.num_labels} labels"
        )
    if model.config.pad_token_id is None:
        raise CheckpointError(
            f"{path}: the reward model's config has no pad_token_id, so it cannot pool batches"
        )
    return model


def load_critic(path: PathArg, *, device: Device = None, dtype: torch.dtype | None = None) -> Critic:
    """Load a PPO critic saved with `save_checkpoint(critic.model, path)` (a `*ForTokenClassification`)."""
    return Critic(_load(path, "critic (one-label token classification)", device, dtype))


def load_tokenizer(path: PathArg) -> PreTrainedTokenizerFast:
    """Load the tokenizer saved in a checkpoint directory."""
    path = Path(path)
    require_dir(path)
    if not (path / TOKENIZER_FILE).is_file():
        raise CheckpointError(f"{path}: no {TOKENIZER_FILE}; the checkpoint was saved without its tokenizer")
    tokenizer: PreTrainedTokenizerFast = PreTrainedTokenizerFast.from_pretrained(
        str(path), local_files_only=True
    )
    if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
        raise CheckpointError(f"{path}: the tokenizer needs both a pad and an EOS token")
    return tokenizer


def _load(path: PathArg, kind: str, device: Device, dtype: torch.dtype | None) -> PreTrainedModel:
    path = Path(path)
    require_dir(path)
    config = read_config(path)
    weight_files(path)  # refuses pickles and missing shards with the reason
    auto_class, names = _KINDS[kind]
    family = config.get("model_type")
    expected = names.get(family) if isinstance(family, str) else None
    architectures = config.get("architectures") or []
    if expected is None or expected not in architectures:
        found = ", ".join(architectures) or f"model_type={family!r}"
        wanted = expected or f"{kind} class transformers knows for model_type={family!r}"
        raise CheckpointError(f"{path}: expected a {wanted} checkpoint, a {kind}; found {found}")
    try:
        # With output_loading_info the result is (model, info), which transformers' annotation omits.
        model, info = cast(
            tuple[PreTrainedModel, dict[str, Any]],
            auto_class.from_pretrained(
                str(path),
                use_safetensors=True,
                local_files_only=True,
                output_loading_info=True,
                dtype=dtype or torch.float32,
            ),
        )
    except (OSError, ValueError, RuntimeError, SafetensorError) as err:
        raise CheckpointError(f"{path}: cannot load the {expected} weights: {err}") from err
    # transformers fills missing or misshapen weights with random values and only warns.
    bad = sorted(info["missing_keys"]) + sorted(str(k[0]) for k in info["mismatched_keys"])
    if bad:
        raise CheckpointError(
            f"{path}: the weights do not fit a {expected}: missing or misshapen {', '.join(bad[:5])}"
        )
    if device is not None:
        torch.nn.Module.to(model, device)
    return model  # from_pretrained returns it in eval mode


def _fsync_tree(root: Path) -> None:
    for file in root.rglob("*"):
        if file.is_file():
            with file.open("rb") as handle:
                os.fsync(handle.fileno())
    _fsync_dir(root)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
