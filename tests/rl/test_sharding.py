"""rl/sharding (FSDP2) on 2 real torchrun ranks with gloo: what the steps rely on, checked on the library itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.processes import two_ranks

SCRIPT = Path(__file__).resolve().parent.parent / "fixtures" / "fsdp_sharding.py"


@pytest.mark.slow
@pytest.mark.parametrize("offload", [False, True], ids=["in_place", "cpu_offload"])
def test_fsdp_gathers_saves_and_restores_on_two_ranks(tmp_path: Path, offload: bool) -> None:
    """With `offload` (runtime.fsdp_cpu_offload: FSDP2's CPUOffloadPolicy, unpinned on the CPU) every check holds
    the same, and a training step gives the weights of a twin whose shards stay in place."""
    out = tmp_path / "found.json"
    two_ranks(
        SCRIPT, str(out), str(tmp_path), *(["offload"] if offload else []), timeout=120
    )  # uneven passes outside full_weights would hang until this
    found = json.loads(out.read_text())
    assert found["offloading_units"] == (3 if offload else 0)  # two decoder layers and the root
    assert ("max_diff_to_unoffloaded" in found) == offload
    assert found.get("max_diff_to_unoffloaded", 0.0) < 1e-6
    assert found["sharded"] and not found["whole_sharded"]
    # full_weights: the gathered model computes what the unsharded one does, however many passes each rank makes
    assert found["max_logit_diff"] < 1e-5
    # the gathered state dict: every weight once (GPT-2's lm_head is its tied token embedding), each one trained
    assert "lm_head.weight" not in found["keys"] and "transformer.wte.weight" in found["keys"]
    assert found["moved"] == len(found["keys"]) == 28
    # the sharded resume state brings back the weights and the AdamW moments of when it was saved
    assert found["changed_by_step_2"] and found["restored"] and found["moments_restored"]
