"""A reward model's folder as the compiler and the preflight read it, without weights: for the tests that render
jobs whose judge is a reward model."""

from __future__ import annotations

import json
from pathlib import Path


def reward_model_dir(d: Path, positions: int = 48) -> Path:
    """`d`, made what rl/rlhf's judge detection reads: config.json names a sequence classifier, weights exist."""
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps({"architectures": ["GPT2ForSequenceClassification"], "n_positions": positions})
    )
    (d / "model.safetensors").write_bytes(
        b"\x02\x00\x00\x00\x00\x00\x00\x00{}"
    )  # a safetensors header, no tensors
    (d / "tokenizer.json").write_text("{}")  # preflight asks for the tokenizer file
    return d
