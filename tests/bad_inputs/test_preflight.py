"""Preflight (issue 29) beyond the corpus in cases.toml: NeMo-Aligner's parallel sizes read from the .nemo itself,
configurations that divide are accepted (so the refusals are not blanket), and a refusal is one line with the
numbers, the same in dry-run and submit, with $NEMOTRON_HOME left untouched."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml


def _nemo(path: Path, tensor: int, pipeline: int = 1) -> Path:
    """A .nemo as NeMo saves one, as far as the sizes go: a tar holding model_config.yaml."""
    config = path.with_suffix(".yaml")
    config.write_text(
        yaml.safe_dump({"tensor_model_parallel_size": tensor, "pipeline_model_parallel_size": pipeline})
    )
    with tarfile.open(path, "w") as tar:
        tar.add(config, arcname="./model_config.yaml")
    return path


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def _aligner_ppo(nemo: Path, *extra: str) -> tuple[str, ...]:
    ref = f"inputs.reward_model={nemo}"
    return (
        "steps",
        "run",
        "rl/ppo",
        "-c",
        "default",
        "backend=nemo_aligner",
        f"inputs.policy={nemo}",
        ref,
        *extra,
    )


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "submit"])
def test_nemo_aligner_sizes_come_from_the_nemo_and_must_divide_each_groups_gpus(
    home: Path, tmp_path: Path, run_cli: Any, dry_run: bool
) -> None:
    nemo = _nemo(tmp_path / "m.nemo", tensor=16)
    r = run_cli(*_aligner_ppo(nemo, "-b", "slurm_rlhf", *(["--dry-run"] if dry_run else [])))
    assert r.code == 2, r.err[-2000:]
    assert "Traceback" not in r.err
    where = "1 node × 8 GPUs of the profile's 2 nodes × 8 GPUs, profile slurm_rlhf"
    for group in ("actor (policy)", "reward model server", "critic server"):
        line = f"  - {group} ({nemo}'s model_config.yaml): tensor 16 × pipeline 1 × context 1 = 16 does not divide 8 GPUs ({where})"
        assert line in r.err.splitlines(), r.err
    assert _files(home) == []  # no job dir, no store, no external record


def test_parallel_sizes_that_divide_are_accepted(home: Path, tmp_path: Path, run_cli: Any) -> None:
    nemo = _nemo(tmp_path / "m.nemo", tensor=4, pipeline=2)
    r = run_cli(*_aligner_ppo(nemo, "-b", "slurm_rlhf", "--dry-run"))
    assert r.code == 0, r.err[-2000:]
    assert "trainer.devices=8" in r.out
    (tmp_path / "env.toml").write_text(
        "[two8]\nextends = 'slurm_rlhf'\nnodes = 2\n"
    )  # node 1: NeMo-Gym's judge
    megatron = (
        "nemo_rl.policy_backend=megatron",
        "nemo_rl.tensor_parallel_size=4",
        "nemo_rl.pipeline_parallel_size=2",
    )
    r = run_cli("steps", "run", "rl/rlhf", *megatron, "-b", "two8", "--dry-run")
    assert r.code == 0, r.err[-2000:]
    assert "tensor_model_parallel_size: 4" in r.out


def test_a_nemo_that_is_no_tar_cannot_load(home: Path, tmp_path: Path, run_cli: Any) -> None:
    broken = tmp_path / "broken.nemo"
    broken.write_bytes(b"not a tar at all" * 64)
    r = run_cli(*_aligner_ppo(broken, "-b", "slurm_rlhf", "--dry-run"))
    assert r.code == 2
    assert "input 'policy' (" in r.err and "cannot load: not a readable .nemo" in r.err, r.err
    assert "Traceback" not in r.err


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
def test_a_broken_checkpoint_is_one_line_and_leaves_no_record(
    home: Path, tmp_path: Path, run_cli: Any, dry_run: bool
) -> None:
    from nemotron.core.paths import shipped_root

    ck = tmp_path / "policy"
    ck.mkdir()
    for f in (shipped_root() / "tiny" / "sft_policy").iterdir():
        if f.name != "tokenizer.json":
            (ck / f.name).write_bytes(f.read_bytes())
    r = run_cli(
        "steps",
        "run",
        "rl/reinforce",
        "-c",
        "tiny",
        f"inputs.policy={ck}",
        *(["--dry-run"] if dry_run else []),
    )
    assert r.code == 2
    assert r.err == (
        f"error: input 'policy' ({ck}) cannot load: no tokenizer (tokenizer.json); the checkpoint was saved without it\n"
    )
    assert r.out == ""
    assert _files(home) == []


def _edited_copy(tmp: Path, shipped: str, name: str, **changes: Any) -> Path:
    """A copy of a shipped tiny checkpoint with config.json keys changed."""
    import json
    import shutil

    from nemotron.core.paths import shipped_root

    path = tmp / name
    shutil.copytree(shipped_root() / "tiny" / shipped, path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **changes}))
    return path


@pytest.mark.parametrize(("args", "expect"), [
    (("rl/reinforce", "inputs.policy={vocab}"),
     "input 'policy' ({vocab}) cannot load: tensor transformer.wte.weight has 476 rows (shape [476, 64]) but"
     " config.json says vocab_size 400"),
    (("rl/rlhf", "env.nemo_gym.genrm_model.responses_api_models.vllm_model.model={labels}"),
     "input 'judge' ({labels}) cannot load: a reward model gives one score, and config.json gives it 2 labels"
     " (num_labels)"),
    (("rl/ppo", "inputs.reward_model={labels}"), "input 'reward_model' ({labels}) cannot load: a reward model gives one"),
    (("rl/reinforce", "inputs.policy={layers}"),
     "input 'policy' ({layers}) cannot load: config.json says 4 layers (n_layer), and the weights hold no tensor of"
     " layers 2-3"),
])  # fmt: skip
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry_run", "submit"])
def test_a_checkpoint_whose_shapes_cannot_load_is_refused_from_its_headers(
    args: tuple[str, str], expect: str, dry_run: bool, home: Path, tmp_path: Path, run_cli: Any
) -> None:
    """config.json against the safetensors headers, before anything is written (issue 42: both ran, registered an
    input and failed with exit 2 or 3 later)."""
    paths = {"vocab": _edited_copy(tmp_path, "sft_policy", "vocab400", vocab_size=400),
             "labels": _edited_copy(tmp_path, "reward_model", "labels2", num_labels=2),
             "layers": _edited_copy(tmp_path, "sft_policy", "layers4", n_layer=4)}  # fmt: skip
    step, override = args
    r = run_cli(
        "steps", "run", step, "-c", "tiny", override.format(**paths), *(["--dry-run"] if dry_run else [])
    )
    assert r.code == 2 and expect.format(**paths) in r.err, r.err[-2000:]
    assert "Traceback" not in r.err and _files(home) == []


def test_a_global_batch_megatron_would_refuse_is_refused_at_compile(
    home: Path, tmp_path: Path, run_cli: Any
) -> None:
    """Megatron-Core's micro-batch calculator asserts global % (micro x data parallel) == 0 when the trainer
    starts: the actor and the critic (each 1 node x 8 GPUs at TP 2 of the .nemo: data parallel 4, micro 2) are
    refused for 36 prompts a step, and accepted for 64; sft's sizes are gpt_sft.yaml's (TP 1 whatever the .nemo
    says), so 100 records on 16 GPUs are refused and 128 are not."""
    nemo = _nemo(tmp_path / "m.nemo", tensor=2)
    r = run_cli(*_aligner_ppo(nemo, "-b", "slurm_rlhf", "trainer.num_prompts_per_step=36", "--dry-run"))
    assert r.code == 2, r.err[-2000:]
    for role in ("critic", "actor"):
        line = (
            f"  - NeMo-Aligner's {role}: global batch 36 (model.global_batch_size) is not a multiple of micro batch 2"
            f" (model.micro_batch_size) x data parallel 4 (8 GPUs over {nemo}'s TP 2 x PP 1 x CP 1); Megatron"
            " asserts it when the trainer starts"
        )
        assert line in r.err.splitlines(), r.err
    assert "Traceback" not in r.err and _files(home) == []
    assert run_cli(*_aligner_ppo(nemo, "-b", "slurm_rlhf", "--dry-run")).code == 0

    sft = (
        "steps",
        "run",
        "sft",
        "-c",
        "nemo_aligner",
        f"inputs.init_from={_nemo(tmp_path / 'big.nemo', tensor=8)}",
    )
    r = run_cli(
        *sft,
        "inputs.data=pkg://tiny/sft.jsonl",
        "-b",
        "slurm_rlhf",
        "trainer.global_batch_size=100",
        "--dry-run",
    )
    assert (
        r.code == 2
        and (
            "global batch 100 (model.data.train_ds.global_batch_size) is not a multiple of micro batch 1 (gpt_sft.yaml's"
            " model.micro_batch_size) x data parallel 16 (16 GPUs over gpt_sft.yaml's TP 1 x PP 1 x CP 1)"
        )
        in r.err
    ), r.err[-2000:]
    r = run_cli(*sft, "inputs.data=pkg://tiny/sft.jsonl", "-b", "slurm_rlhf", "--dry-run")
    assert r.code == 0, r.err[-2000:]
