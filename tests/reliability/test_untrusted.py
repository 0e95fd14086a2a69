"""Untrusted files never run code: weights load from safetensors only, torch.load is weights_only, YAML is safe."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.assertions import CodeRunningPickle

from nemotron.errors import UserError
from nemotron.models.tiny import build_policy
from nemotron.rl import trainstate


def test_a_planted_malicious_pickle_in_a_checkpoint_is_refused(tmp_path: Path) -> None:
    policy = build_policy(40, 1, 16, 2, 16, seed=0, pad_token_id=0, eos_token_id=1)
    opt = torch.optim.AdamW(policy.parameters())
    gen = torch.Generator().manual_seed(0)
    ckpt = trainstate.save(
        tmp_path / "ck", 1, {"policy": policy}, {"policy": opt}, {"g": gen}, 0, {"config": "c"}
    )
    marker = tmp_path / "pwned"
    (ckpt / "optimizers.pt").write_bytes(pickle.dumps({"policy": CodeRunningPickle(marker)}))
    with pytest.raises(UserError, match="refusing to unpickle"):
        trainstate.load(ckpt, {"policy": policy}, {"policy": opt}, {"g": gen}, {"config": "c"})
    assert not marker.exists(), "the pickle payload ran"


def test_weights_load_only_from_safetensors(tmp_path: Path) -> None:
    from nemotron.models.checkpoint import CheckpointError, load_policy, save_checkpoint

    policy = build_policy(40, 1, 16, 2, 16, seed=0, pad_token_id=0, eos_token_id=1)
    path = save_checkpoint(policy, tmp_path / "m")
    (path / "model.safetensors").unlink()
    marker = tmp_path / "pwned"
    (path / "pytorch_model.bin").write_bytes(
        pickle.dumps(CodeRunningPickle(marker))
    )  # a .bin beside config.json
    with pytest.raises(CheckpointError):
        load_policy(path)
    assert not marker.exists()


def test_yaml_presets_are_loaded_safely(home: Path, tmp_path: Path, run_cli: Any) -> None:
    marker = tmp_path / "pwned"
    preset = tmp_path / "evil.yaml"
    preset.write_text(f"trainer: !!python/object/apply:os.system ['touch {marker}']\n")
    r = run_cli("steps", "run", "rl/reinforce", "-c", str(preset), "--dry-run")
    assert r.code == 2 and "evil.yaml" in r.err and "Traceback" not in r.err
    assert not marker.exists()
