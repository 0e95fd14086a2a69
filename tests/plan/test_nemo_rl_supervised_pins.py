"""sft's plan on NeMo-RL v0.7.0 pinned against the tag's own SFT recipes (examples/configs/recipes/llm/, file and
line cited), on the H100-80GB its benchmarks run on: a recipe NeMo-RL ships must fit; the 70B without its model
parallelism must be refused, naming what would fit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nemotron.catalog import Catalog
from nemotron.compile import compile_job
from nemotron.errors import UserError
from nemotron.launch import submit

PROFILES = """
[h100_1x8]
extends = "slurm_rlhf"
nodes = 1
[h100_8x8]
extends = "slurm_rlhf"
nodes = 8
"""
# sft.yaml: policy.precision bfloat16 (:43), train_micro_batch_size 1 (:41), the passthrough of our keys
BASE = ("backend=nemo_rl", "runtime.precision=bf16-mixed")
# sft-llama3.1-70b-8n8g-tp4pp2-long-megatron.yaml: meta-llama/Llama-3.1-70B (:12; its shape is Llama 3.3 70B's),
# train_global_batch_size 512 (:16), max_total_sequence_length 4096 (:17), Megatron (:18-21) TP 4 (:22) PP 2 (:23),
# 8 nodes of 8 GPUs (its name)
LLAMA_70B = ("inputs.init_from=meta-llama/Llama-3.1-70B", "plan.models={policy: meta-llama/Llama-3.3-70B-Instruct}",
             "trainer.global_batch_size=512", "trainer.max_length=4096")  # fmt: skip
MEGATRON_TP4_PP2 = (
    "nemo_rl.policy_backend=megatron",
    "nemo_rl.tensor_parallel_size=4",
    "nemo_rl.pipeline_parallel_size=2",
)
# sft-llama3.1-8b-1n8g-fsdp2tp1-long.yaml: meta-llama/Llama-3.1-8B (:13), train_global_batch_size 512 (:17),
# max_total_sequence_length 4096 (:19), DTensor TP 1 (sft.yaml's), 1 node of 8 GPUs
LLAMA_8B = ("inputs.init_from=meta-llama/Llama-3.1-8B-Instruct", "trainer.global_batch_size=512",
            "trainer.max_length=4096")  # fmt: skip


def plan(profile: str, *overrides: str, tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "env.toml").write_text(PROFILES)
    job = compile_job(Catalog(), "sft", "nemo_rl", overrides=[*BASE, *overrides], profile_name=profile,
                      mode="batch", dry_run=True)  # fmt: skip
    return {g["name"]: g for g in submit.dry_run_json(job)["resource_plan"]["groups"]}


@pytest.mark.parametrize(
    ("profile", "overrides", "parallelism"),
    [
        (
            "h100_8x8",
            (*LLAMA_70B, *MEGATRON_TP4_PP2),
            "Megatron TP 4 x PP 2 x CP 1, distributed optimizer over 64",
        ),
        ("h100_1x8", LLAMA_8B, "DTensor FSDP over 8 GPUs, TP 1"),
    ],
)
def test_nemo_rls_own_sft_recipes_fit(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profile: str, overrides: tuple[str, ...],
    parallelism: str,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    (group,) = plan(profile, *overrides, tmp_path=tmp_path).values()
    assert group["fits"] and group["parallelism"].startswith(parallelism), group
    assert group["peak_mb"] < group["available_mb"]


def test_the_70b_on_one_node_without_model_parallelism_is_refused(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as refused:
        plan("h100_1x8", *LLAMA_70B, tmp_path=tmp_path)
    line = str(refused.value)
    assert "policy training (node 0) needs" in line and "more GPUs" in line
