"""Data parallel: 2 torchrun ranks (gloo on CPU) and 1 process, same global batch and seed, make the same update."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tests.processes import two_ranks

SCRIPT = Path(__file__).resolve().parent.parent / "fixtures" / "ddp_update.py"


@pytest.mark.slow
def test_two_ranks_and_one_make_the_same_update(tmp_path: Path) -> None:
    one, two = tmp_path / "one.safetensors", tmp_path / "two.safetensors"
    subprocess.run([sys.executable, str(SCRIPT), str(one)], check=True, timeout=300)
    two_ranks(SCRIPT, str(two), timeout=300)
    a, b = load_file(str(one)), load_file(str(two))
    assert a.keys() == b.keys()
    initial = None
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)
    # the update is not a no-op: the weights moved from their initial values
    from nemotron.models.tiny import build_policy

    initial = build_policy(40, 2, 32, 4, 32, seed=3, pad_token_id=0, eos_token_id=1).state_dict()
    moved = sum(not torch.equal(initial[k], a[k]) for k in a)
    assert moved == len(a)
