"""The checkpoint's blocks read from its safetensors headers (models.layout.layer_problems), checked against what
transformers itself saves: a tiny model of each family, causal LM and reward model, saved with save_pretrained,
has no problem; each edit a hand or a broken conversion makes (config.json counting more or fewer layers than the
weights hold, one layer's tensor gone) is named."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from nemotron.models.layout import (
    layer_problems,
    read_config,
    safetensors_shapes,
    shape_problems,
    weight_files,
)
from nemotron.models.tiny import FAMILIES, tiny_model


@pytest.mark.parametrize("kind", ["policy", "reward_model"])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_saved_model_passes_and_each_edit_is_named(family: str, kind: str, tmp_path: Path) -> None:
    path = tmp_path / "model"
    tiny_model(64, kind, family=family, n_layer=3).save_pretrained(path)  # type: ignore[arg-type]
    config = read_config(path)
    (file,) = weight_files(path)
    shapes = safetensors_shapes(file)
    assert shape_problems(path, config, kind == "reward_model") == []
    key = "n_layer" if family == "gpt2" else "num_hidden_layers"
    assert config[key] == 3

    assert layer_problems(shapes, {**config, key: 5}) == [
        f"config.json says 5 layers ({key}), and the weights hold no tensor of layers 3-4"
    ]
    assert layer_problems(shapes, {**config, key: 2}) == [
        f"the weights hold layer 2, past the 2 layers config.json says ({key})"
    ]

    tensors = load_file(file)
    gone = sorted(name for name in tensors if ".1." in name and name.endswith(".weight"))[0]
    del tensors[gone]
    save_file(tensors, file, metadata={"format": "pt"})
    within = gone.split(".1.", 1)[1]
    assert shape_problems(path, config, kind == "reward_model") == [
        f"layer 1 has no {within}, which other layers have"
    ]
