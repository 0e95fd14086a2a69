"""engines/nemo_rl/to_safetensors.py, the script a NeMo-RL job runs after the tag's DCP converter (which writes its
weights as pytorch_model.bin, nemo_rl/utils/native_checkpoint.py convert_dcp_to_hf): run for real as the job runs
it, a separate Python on the converted folder. The weights come out as safetensors that transformers loads to the
same logits, tied tensors and DCP's {"model": ...} wrapping included; a pickle that would run code is refused and
nothing is written."""

from __future__ import annotations

import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tests.assertions import CodeRunningPickle

from nemotron.engines.nemo_rl import to_safetensors

SCRIPT = Path(to_safetensors.__file__)


def _run(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(folder)], capture_output=True, text=True, timeout=120
    )


def _logits(folder: Path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(torch.tensor([[3, 5, 7, 11]])).logits


@pytest.mark.parametrize("wrapped", [False, True], ids=["flat", "dtensor-v1-wrapped"])
def test_the_converters_pickle_becomes_safetensors_with_the_same_logits(
    tmp_path: Path, make_tiny_model: Callable[..., Path], wrapped: bool
) -> None:
    model = make_tiny_model(tmp_path / "model", "gpt2")  # GPT-2 ties lm_head to the embedding
    expected = _logits(model)
    state = {}
    for shard in sorted(model.glob("*.safetensors")):
        state.update(load_file(shard))
        shard.unlink()
    state["lm_head.weight"] = state["transformer.wte.weight"]  # one storage, as a DCP export keeps it
    torch.save({"model": state} if wrapped else state, model / "pytorch_model.bin")
    done = _run(model)
    assert done.returncode == 0, done.stderr
    assert not (model / "pytorch_model.bin").exists() and (model / "model.safetensors").exists()
    assert torch.equal(_logits(model), expected)


def test_a_pickle_that_would_run_code_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    (tmp_path / "pytorch_model.bin").write_bytes(pickle.dumps({"w": CodeRunningPickle(marker)}))
    done = _run(tmp_path)
    assert done.returncode != 0 and not marker.exists()
    assert (tmp_path / "pytorch_model.bin").exists() and not list(tmp_path.glob("*.safetensors"))


def test_a_folder_with_safetensors_already_passes_and_one_with_no_weights_fails(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    done = _run(empty)
    assert done.returncode == 1 and "neither pytorch_model.bin nor safetensors" in done.stderr
    (empty / "model.safetensors").write_bytes(b"")  # the Megatron converter's output: left as it is
    assert _run(empty).returncode == 0
