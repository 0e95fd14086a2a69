"""sft and rm/train on NeMo-Aligner v0.7.0 (train_gpt_sft.py, train_reward_model.py): every override key is in the
tag's YAML (tests/engines/nemo_aligner_v070.py, re-read from the mirror by test_nemo_aligner.py), the data files
are what its datasets read, and the .nemo they leave is what rl/reinforce and rl/ppo on NeMo-Aligner take."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.engines import nemo_aligner_v070 as tag

from nemotron.catalog import Catalog
from nemotron.compile import compile_job
from nemotron.engines.nemo_aligner.config import compile_aligner
from nemotron.engines.nemo_aligner.scripts import AlignerRun
from nemotron.errors import UserError
from nemotron.plan.placement import Placement

STEPS = {"sft": ("train_gpt_sft.py", "policy"), "rm/train": ("train_reward_model.py", "reward_model")}
GIVEN = ["inputs.init_from=/models/base.nemo"]  # over the step's nemo_aligner preset


def compiled(step_id: str, *extra: str, nodes: int = 2) -> AlignerRun:
    job = compile_job(Catalog(), step_id, "nemo_aligner", [*GIVEN, *extra], profile_name="slurm_rlhf", mode="batch",
                      dry_run=True)  # fmt: skip
    return compile_aligner(job.step_id, job.step_model, Placement("/j", nodes, 8))


@pytest.mark.parametrize("extra", [(), ("runtime.precision=fp32", "trainer.validation_fraction=0.5")])
@pytest.mark.parametrize("step_id", list(STEPS))
def test_every_override_key_is_in_the_tags_yaml(home: Path, step_id: str, extra: tuple[str, ...]) -> None:
    run = compiled(step_id, *extra)
    (group,) = run.groups
    assert group.script == f"examples/nlp/gpt/{STEPS[step_id][0]}" and tag.SCRIPTS[group.script] == group.yaml
    unknown = [key for key, _ in group.overrides if key not in tag.KEYS[group.yaml]]
    assert unknown == [] and len({k for k, _ in group.overrides}) == len(group.overrides)
    # the registered .nemo is where NeMo's checkpoint callback leaves it: <log dir>/checkpoints/<exp_manager.name>.nemo
    keys = tag.KEYS[group.yaml]
    name = keys["name"] if keys["exp_manager.name"] == "${name}" else keys["exp_manager.name"]
    log_dir = dict(group.overrides)["exp_manager.explicit_log_dir"]
    assert run.outputs == {STEPS[step_id][1]: f"{log_dir}/checkpoints/{name}.nemo"}
    on_end = dict(group.overrides).get("exp_manager.checkpoint_callback_params.save_nemo_on_train_end")
    assert (
        on_end
        if on_end is not None
        else keys["exp_manager.checkpoint_callback_params.save_nemo_on_train_end"]
    )


def test_hand_checked_values(home: Path) -> None:
    sft = dict(
        # 96 records: a multiple of the 24 GPUs' data parallel at gpt_sft.yaml's TP 1 (Megatron's batch rule)
        compiled(
            "sft", "trainer.max_steps=40", "trainer.log_interval=10", "trainer.global_batch_size=96", nodes=3
        )
        .groups[0]
        .overrides
    )
    assert sft["model.restore_from_path"] == "/models/base.nemo" and sft["trainer.sft.max_steps"] == 40
    assert sft["trainer.sft.val_check_interval"] == 10 and sft["trainer.sft.save_interval"] == 40
    assert sft["model.data.train_ds.prompt_template"] == "{prompt}{response}"
    assert sft["model.data.train_ds.label_key"] == "response" and sft["model.data.sample"] is True
    assert (sft["trainer.num_nodes"], sft["trainer.devices"]) == (3, 8)
    rm = compiled("rm/train", "trainer.global_batch_size=32", "trainer.max_steps=300")
    r = dict(rm.groups[0].overrides)
    # max_steps ends the run: training_rm.yaml's one epoch would stop it after one pass over the pairs
    assert (r["trainer.rm.max_steps"], r["trainer.rm.max_epochs"]) == (300, 300)
    assert (
        r["pretrained_checkpoint.restore_from_path"] == "/models/base.nemo"
        and r["model.global_batch_size"] == 32
    )
    assert r["model.data.data_prefix"] == {
        "train": ["/j/nemo_aligner_rm_text_train.jsonl"],
        "validation": ["/j/nemo_aligner_rm_text_validation.jsonl"],
        "test": ["/j/nemo_aligner_rm_text_validation.jsonl"],
    }
    # the nemo_aligner preset: trainer.validation_fraction 0.05 -> every 20th pair held out
    assert rm.prepare[:3] == ("-m", "nemotron.engines.data_files", "rm_text") and rm.prepare[-1] == "20"


@pytest.mark.parametrize(
    ("step_id", "extra", "key"),
    [
        ("sft", ("inputs.init_from=null",), "inputs.init_from"),
        ("sft", ("trainer.validation_fraction=0",), "trainer.validation_fraction"),
        ("sft", ("optim.min_lr_ratio=0.1",), "optim.min_lr_ratio"),
        ("rm/train", ("runtime.gradient_checkpointing=true",), "runtime.gradient_checkpointing"),
        ("rm/train", ("nemo_rl.tensor_parallel_size=2",), "nemo_rl.tensor_parallel_size"),
        ("sft", ("runtime.sharding=fsdp",), "runtime.sharding"),
    ],
)
def test_inexpressible_settings_are_refused(
    home: Path, step_id: str, extra: tuple[str, ...], key: str
) -> None:
    with pytest.raises(UserError) as err:
        compiled(step_id, *extra)
    assert [p.split("=")[0] for p in err.value.problems] == [key]


def test_data_files_are_what_the_datasets_read(tmp_path: Path) -> None:
    """The prepare step as the job runs it: every 2nd record held out; the reward model's pairs as chosen/rejected
    text lines (RewardModelDataset reads line 2i as chosen, 2i+1 as rejected); a conversation prompt as text."""
    pairs = tmp_path / "pairs.jsonl"
    rows = [{"prompt": f"p{i} ", "chosen": "good", "rejected": "bad"} for i in range(4)]
    rows[1]["prompt"] = [{"role": "user", "content": "hi"}]
    pairs.write_text("".join(json.dumps(r) + "\n\n" for r in rows))
    train, val = tmp_path / "t.jsonl", tmp_path / "v.jsonl"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    args = [sys.executable, "-m", "nemotron.engines.data_files"]
    subprocess.run([*args, "rm_text", str(pairs), str(train), str(val), "2"], check=True, env=env)
    lines = [json.loads(x)["text"] for x in train.read_text().splitlines()]
    assert lines == ["p0 good", "p0 bad", "p2 good", "p2 bad"]
    assert [json.loads(x)["text"] for x in val.read_text().splitlines()] == ["user: higood", "user: hibad", "p3 good",
                                                                               "p3 bad"]  # fmt: skip
    sft = tmp_path / "sft.jsonl"
    sft.write_text(json.dumps({"prompt": "q", "response": "a"}) + "\n")
    failed = subprocess.run([*args, "sft_text", str(sft), str(train), str(val), "2"], env=env)
    assert failed.returncode == 1  # one record: none held out, so the job fails before the trainer
    assert json.loads(train.read_text()) == {"prompt": "q", "response": "a"}


@pytest.mark.parametrize("step_id", list(STEPS))
def test_cli_dry_run_shows_the_script_and_its_data_step(
    home: Path, run_cli: Callable[..., Any], step_id: str
) -> None:
    result = run_cli("steps", "run", step_id, "-c", "nemo_aligner", "-b", "slurm_rlhf", *GIVEN, "--dry-run")
    assert result.code == 0, result.err
    assert STEPS[step_id][0] in result.out and "-m nemotron.engines.data_files" in result.out
    assert ".prepared.$SLURM_JOB_ID" in result.out  # the other tasks wait for the first task's data files
    refused = run_cli("steps", "run", step_id, "-c", "nemo_aligner", "-b", "slurm_rlhf", *GIVEN, "optim.min_lr_ratio=0.1",
                      "--dry-run")  # fmt: skip
    assert refused.code == 2 and "optim.min_lr_ratio=0.1" in refused.err
    assert not (home / "jobs").exists()


@pytest.mark.parametrize("step_id", list(STEPS))
def test_the_docs_table_names_every_schema_key(step_id: str) -> None:
    from tests.engines.test_nemo_aligner import test_the_docs_table_names_every_schema_key as check

    check(step_id)


@pytest.mark.parametrize("step_id", list(STEPS))
def test_trackers_reach_the_trainer_through_keys_its_yaml_has(home: Path, step_id: str) -> None:
    """tracking.* on the one trainer group: each override is a key of the tag's YAML, or `++`-added where the YAML
    lacks it (the keys test_remote_tracking.py checks against NeMo's own exp_manager)."""
    extra = (
        "tracking.wandb.enabled=true",
        "tracking.mlflow.enabled=true",
        "tracking.mlflow.tracking_uri=http://m:5000",
    )
    (group,) = compiled(step_id, *extra).groups
    keys = dict(group.overrides)
    assert keys["exp_manager.create_wandb_logger"] is True and "++exp_manager.create_mlflow_logger" in keys
    unknown = [k for k in keys if not k.startswith("++") and k not in tag.KEYS[group.yaml]]
    assert unknown == []
