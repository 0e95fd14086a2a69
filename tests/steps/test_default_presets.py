"""sft -c default and rm/train -c default, the fine-tunes sized like NeMo-RL v0.7.0's sft.yaml and rm.yaml, run on the
built-in engine as shipped (FSDP2, bf16-mixed; rm/train with activation checkpointing) but for the model, the data
and the size: a tiny Llama checkpoint, the tiny data, 3 steps of 32 tokens, on CPU. The chain registers a policy
fine-tuned from the checkpoint, then a reward model started from that policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SMALL = ("trainer.max_steps=3", "trainer.max_length=32", "trainer.log_interval=1", "runtime.num_threads=1",
         "plan.models={}", "-r", "local")  # fmt: skip
SHARDED = "FSDP2 over 1 rank(s): 2 LlamaDecoderLayer layers and the root sharded, compute in bf16"


def test_the_default_presets_fine_tune_a_checkpoint_under_fsdp(
    make_tiny_model: Any, home: Path, tmp_path: Path, run_cli: Any
) -> None:
    llama = make_tiny_model(tmp_path / "llama", "llama")
    sft = run_cli("steps", "run", "sft", "-c", "default", f"inputs.init_from={llama}",
                  "inputs.data=pkg://tiny/sft.jsonl", *SMALL, timeout=300)  # fmt: skip
    assert sft.code == 0, sft.err[-3000:]
    assert SHARDED in sft.err and "registered sft_policy:v1 (checkpoint_hf)" in sft.err, sft.err[-3000:]
    rm = run_cli("steps", "run", "rm/train", "-c", "default", "inputs.init_from=sft_policy:v1",
                 "inputs.data=pkg://tiny/preferences.jsonl", *SMALL, timeout=300)  # fmt: skip
    assert rm.code == 0, rm.err[-3000:]
    assert SHARDED in rm.err and "registered reward_model:v1 (reward_model_hf)" in rm.err, rm.err[-3000:]
    shown = json.loads(run_cli("artifacts", "show", "reward_model:v1", "--json").out)
    assert shown["inputs"]["init_from"] == "sft_policy:v1" and shown["metadata"]["preset"] == "default", shown
