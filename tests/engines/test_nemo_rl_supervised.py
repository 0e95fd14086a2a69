"""sft and rm/train on NeMo-RL v0.7.0 (run_sft.py, run_rm.py), checked against what the tag reads
(tests/engines/nemo_rl_v070.py): the keys its code reads, the TypedDicts its MasterConfig validates, its loader's
merge rule, and the data loaders our files reach."""

from __future__ import annotations

import ast
import json
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.engines import nemo_rl_data_v070 as data_tag
from tests.engines import nemo_rl_v070 as tag
from tests.engines.mirrors import git_show
from tests.engines.nemo_rl_rules import has, load_config

from nemotron.catalog import Catalog
from nemotron.config.configtree import flatten, get_dotted, unflatten
from nemotron.engines import data_files
from nemotron.engines.nemo_rl.config import NemoRLRun, compile_run
from nemotron.engines.nemo_rl.supervised import adopt_reward_model
from nemotron.errors import UserError
from nemotron.plan.placement import Placement

JOB = "/jobs/run 1"
STEPS = {
    "sft": "sft",
    "rm/train": "rm",
}  # step -> the algorithm NeMo-RL runs (examples/run_<alg>.py, section <alg>:)
INPUTS = {"inputs.init_from": "/models/base", "inputs.data": "/data/train pairs.jsonl"}


def compiled(step_id: str, nodes: int = 1, **overrides: Any) -> NemoRLRun:
    schema = Catalog().get(step_id).config_schema()
    flat = dict(flatten(schema().model_dump(mode="json"))) | {"backend": "nemo_rl"} | INPUTS
    flat |= {k.replace("__", "."): v for k, v in overrides.items()}
    return compile_run(step_id, schema.model_validate(unflatten(flat)), Placement(JOB, nodes, 8))


def loaded(run: NemoRLRun, alg: str) -> dict[str, Any]:
    """The run's config as NeMo-RL's loader would merge it over the base keys we encoded (tag.BASE_KEYS)."""
    parent = run.config["defaults"]
    assert parent == f"/opt/nemo-rl/{tag.BASES[alg]}"
    return load_config(run.config, {parent: unflatten(tag.BASE_KEYS[alg])})


@pytest.mark.parametrize("backend", ["dtensor", "megatron"])
@pytest.mark.parametrize("step_id", list(STEPS))
def test_every_key_the_tag_reads_is_present(step_id: str, backend: str) -> None:
    if step_id == "rm/train" and backend == "megatron":
        pytest.skip("refused: test_inexpressible_settings_are_refused")
    alg = STEPS[step_id]
    run = compiled(step_id, nemo_rl__policy_backend=backend)
    assert run.entry in tag.ENTRIES and run.entry == f"examples/run_{alg}.py"
    cfg = loaded(run, alg)
    missing = [(k, f"{f}:{n}") for k, f, n in tag.REQUIRED[alg] if not has(cfg, k)]
    assert missing == []


@pytest.mark.parametrize("step_id", list(STEPS))
def test_sections_meet_the_typed_dicts_and_the_loaders(step_id: str) -> None:
    alg = STEPS[step_id]
    cfg = loaded(compiled(step_id), alg)
    data = cfg["data"]
    _, required, declared = data_tag.TYPED_DICTS["DataConfig"]
    assert required <= set(data) <= declared
    dataset_dict = "ResponseDatasetConfig" if alg == "sft" else "PreferenceDatasetConfig"
    for entry in (data["train"], data.get("validation"), data.get("default")):
        if entry is not None:
            assert set(entry) <= data_tag.TYPED_DICTS[dataset_dict][2]
    _, _, kwargs = data_tag.LOADERS[data["train"]["dataset_name"]]
    own = set(data["train"]) - {
        "dataset_name",
        "prompt_file",
        "system_prompt_file",
    }  # set_task_spec reads these
    assert own <= kwargs
    loop = "SFTConfig" if alg == "sft" else "RMConfig"
    assert set(cfg[alg]) == data_tag.TYPED_DICTS[loop][2]  # every field set: none left to a base default


@pytest.mark.parametrize("step_id", list(STEPS))
def test_user_data_survives_the_loader_and_no_base_dataset_leaks(step_id: str) -> None:
    alg = STEPS[step_id]
    cfg = loaded(compiled(step_id), alg)
    assert "squad" not in str(cfg["data"]) and "HelpSteer3" not in str(cfg["data"])
    assert "_override_" not in str(cfg)
    # the base's logger names interpolate ${data.train.dataset_name}: OmegaConf resolves it (run_*.py resolve=True)
    assert "${data.train.dataset_name}" in cfg["logger"]["wandb"]["name"]
    assert get_dotted(cfg, "data.train.dataset_name") in data_tag.LOADERS
    # our rows are rewritten and split into the job dir before the entry reads them
    kind = "messages" if alg == "sft" else "pairs"
    assert cfg["data"]["train"]["data_path"] == f"{JOB}/nemo_rl_{kind}_train.jsonl"
    assert cfg["data"]["validation"]["data_path"] == f"{JOB}/nemo_rl_{kind}_validation.jsonl"


def test_hand_checked_values() -> None:
    run = compiled(
        "sft",
        trainer__max_steps=40,
        trainer__global_batch_size=16,
        trainer__max_length=512,
        trainer__log_interval=10,
        runtime__precision="bf16-mixed",
        nemo_rl__tensor_parallel_size=2,
    )
    cfg = run.config
    assert cfg["sft"]["max_num_steps"] == 40 and cfg["sft"]["max_num_epochs"] == 40
    assert cfg["sft"]["val_period"] == 10 and cfg["sft"]["val_at_end"] is True
    pol = cfg["policy"]
    assert pol["model_name"] == "/models/base" and pol["tokenizer"]["chat_template"] is None
    assert pol["train_global_batch_size"] == 16 and pol["max_total_sequence_length"] == 512
    assert pol["precision"] == "bfloat16" and pol["dtensor_cfg"]["tensor_parallel_size"] == 2
    assert cfg["data"]["max_input_seq_length"] == 512
    assert cfg["checkpointing"]["save_period"] == 40 and cfg["cluster"] == {
        "num_nodes": 1,
        "gpus_per_node": 8,
    }
    assert run.outputs == {"policy": f"{JOB}/outputs/policy"}
    assert "convert_dcp_to_hf.py" in run.finalize
    assert "--megatron-ckpt-path" in compiled("sft", nemo_rl__policy_backend="megatron").finalize
    # no held-out share: no validation at all (sft.py:268 asserts val_period <= 0 without a validation set)
    unvalidated = compiled("sft", trainer__validation_fraction=0)
    assert unvalidated.config["sft"]["val_period"] == 0 and unvalidated.config["data"]["validation"] is None
    assert unvalidated.driver.split(" && ")[1].endswith(" 0")  # every record trains
    rm = compiled("rm/train").config
    assert rm["policy"]["reward_model_cfg"] == {"enabled": True, "reward_model_type": "bradley_terry"}
    assert compiled("rm/train").outputs == {"reward_model": f"{JOB}/outputs/reward_model"}


@pytest.mark.parametrize(
    ("step_id", "overrides", "key"),
    [
        ("sft", {"inputs__init_from": None}, "inputs.init_from"),
        ("sft", {"inputs__data": None}, "inputs.data"),
        ("sft", {"runtime__device": "cpu"}, "runtime.device"),
        ("sft", {"runtime__precision": "bf16"}, "runtime.precision"),
        ("sft", {"nemo_rl__pipeline_parallel_size": 2}, "nemo_rl.pipeline_parallel_size"),
        ("sft", {"runtime__sharding": "fsdp"}, "runtime.sharding"),
        ("rm/train", {"nemo_rl__policy_backend": "megatron"}, "nemo_rl.policy_backend"),
        ("rm/train", {"nemo_rl__sequence_packing": True}, "nemo_rl.sequence_packing"),
        ("rm/train", {"nemo_rl__context_parallel_size": 2}, "nemo_rl.context_parallel_size"),
    ],
)
def test_inexpressible_settings_are_refused(step_id: str, overrides: dict[str, Any], key: str) -> None:
    with pytest.raises(UserError) as err:
        compiled(step_id, **overrides)
    assert [p.split("=")[0] for p in err.value.problems] == [key]


@pytest.mark.parametrize(
    ("step_id", "nodes", "overrides", "ranks"),
    [
        # one node of 8 GPUs: 8 data-parallel ranks on DTensor at TP 1, 4 at TP 2, 2 on Megatron at TP 2 x PP 2
        ("sft", 1, {"trainer__global_batch_size": 12}, 8),
        ("sft", 1, {"trainer__global_batch_size": 13, "nemo_rl__tensor_parallel_size": 2}, 4),
        ("sft", 1, {"trainer__global_batch_size": 13, "nemo_rl__context_parallel_size": 2}, 4),
        (
            "sft",
            1,
            {
                "trainer__global_batch_size": 13,
                "nemo_rl__policy_backend": "megatron",
                "nemo_rl__tensor_parallel_size": 2,
                "nemo_rl__pipeline_parallel_size": 2,
            },
            2,
        ),
        ("sft", 2, {"trainer__global_batch_size": 24}, 16),
        ("rm/train", 1, {"trainer__global_batch_size": 20}, 8),
    ],
)
def test_a_batch_the_ranks_cannot_split_evenly_is_refused(
    step_id: str, nodes: int, overrides: dict[str, Any], ranks: int
) -> None:
    """NeMo-RL asserts that each training batch shards evenly over the data-parallel ranks: refused at compile,
    naming the multiple; the next multiple of the ranks (and a profile without GPUs) compiles."""
    with pytest.raises(UserError) as err:
        compiled(step_id, nodes, **overrides)
    (problem,) = err.value.problems
    assert problem.startswith("trainer.global_batch_size=") and problem.endswith(f"a multiple of {ranks}"), (
        problem
    )
    even = {**overrides, "trainer__global_batch_size": ranks * 3}
    assert compiled(step_id, nodes, **even).config["policy"]["train_global_batch_size"] == ranks * 3
    schema = Catalog().get(step_id).config_schema()
    flat = dict(flatten(schema().model_dump(mode="json"))) | {"backend": "nemo_rl"} | INPUTS
    flat |= {k.replace("__", "."): v for k, v in overrides.items()}
    cpu_ray = compile_run(step_id, schema.model_validate(unflatten(flat)), Placement(JOB, nodes, 0))
    assert cpu_ray.config["policy"]["train_global_batch_size"] == overrides["trainer__global_batch_size"]


@pytest.mark.parametrize("step_id", list(STEPS))
def test_the_batch_rule_is_the_tags(step_id: str) -> None:
    """What the rule above assumes of v0.7.0, from the encoded tag (and its sources where the mirror is here): the
    micro-batch is the base's 1 (we do not set it), a batch is sharded with the global batch size and no uneven
    shards, which shard_by_batch_size asserts; rm.py passes a pair's two rows as one micro-batch of two."""
    alg = STEPS[step_id]
    assert tag.BASE_KEYS[alg]["policy.train_micro_batch_size"] == 1
    assert "train_micro_batch_size" not in compiled(step_id).config["policy"]
    if not tag.MIRROR.exists():
        pytest.skip("the NeMo-RL mirror is not on this machine; the data-encoded checks ran")
    shard = git_show(tag.MIRROR, tag.TAG, "nemo_rl/distributed/batched_data_dict.py")
    assert "if not allow_uneven_shards:\n            assert batch_size % shards == 0" in shard
    policy = git_show(tag.MIRROR, tag.TAG, "nemo_rl/models/policy/lm_policy.py")
    for_train = policy.split("def _shard_for_train(")[1].split("\n    def ")[0]
    assert for_train.count("batch_size=batch_size,") == 3 and "allow_uneven_shards" not in for_train
    assert (
        yaml.safe_load(git_show(tag.MIRROR, tag.TAG, tag.BASES[alg]))["policy"]["train_micro_batch_size"] == 1
    )
    if alg == "rm":
        rm = git_show(tag.MIRROR, tag.TAG, "nemo_rl/algorithms/rm.py")
        assert 'gbs=master_config.policy["train_global_batch_size"] * 2' in rm
        assert 'mbs=master_config.policy["train_micro_batch_size"] * 2' in rm


@pytest.mark.parametrize("step_id", list(STEPS))
def test_the_data_step_runs_before_the_entry_and_writes_what_the_loaders_read(
    tmp_path: Path, step_id: str
) -> None:
    """The driver's first command, run for real (with `python` for NeMo-RL's `uv run python`), on rows in every form
    our types accept: a conversation prompt, chosen/rejected under their other names, blank lines."""
    run = compiled(step_id, trainer__validation_fraction=0.5)
    assert run.files["nemotron_data_files.py"] == Path(data_files.__file__).read_text()
    words = shlex.split(run.driver.split(" && ")[1])
    assert words[:3] == ["uv", "run", "python"] and words[3] == f"{JOB}/nemotron_data_files.py"
    kind, _data, train, val, every = words[4:]
    assert every == "2" and train.startswith(JOB) and val.startswith(JOB)
    data = tmp_path / "data.jsonl"
    convo = [{"role": "user", "content": "hi"}]
    rows = ([{"prompt": "p0", "response": "r0"}, {"prompt": convo, "response": "r1"}] if kind == "messages" else
            [{"prompt": "p0", "chosen": "a", "rejected": "b"}, {"prompt": convo, "chosen_response": "c", "rejected_response": "d"}])  # fmt: skip
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    out = [str(tmp_path / "t.jsonl"), str(tmp_path / "v.jsonl")]
    subprocess.run([sys.executable, data_files.__file__, kind, str(data), *out, every], check=True)
    (kept,), (held,) = ([json.loads(x) for x in Path(p).read_text().splitlines()] for p in out)
    if kind == "messages":  # ResponseDataset keeps a `messages` column as it is
        assert kept == {
            "messages": [{"role": "user", "content": "p0"}, {"role": "assistant", "content": "r0"}]
        }
        assert held == {"messages": [*convo, {"role": "assistant", "content": "r1"}]}
    else:  # BinaryPreferenceDataset's default keys; a conversation prompt is its context as it is
        assert kept == {"prompt": "p0", "chosen": "a", "rejected": "b"}
        assert held == {"prompt": convo, "chosen": "c", "rejected": "d"}
    failed = subprocess.run([sys.executable, data_files.__file__, kind, str(data), *out, "3"])
    assert (
        failed.returncode == 1
    )  # two records, none held out: the job fails before the entry, not in its validation


def test_adopted_reward_model_names_its_architecture(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 8})
    )
    adopt_reward_model(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"] and config["hidden_size"] == 8
    assert config["id2label"] == {"0": "LABEL_0"}
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    adopt_reward_model(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [
        "GPT2ForSequenceClassification"
    ]


def _fields(source: str, cls: str) -> set[str]:
    node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == cls)
    return {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}


def _required(source: str, cls: str) -> set[str]:
    node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == cls)
    return {
        s.target.id
        for s in node.body
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.value is None
        and "NotRequired" not in ast.unparse(s.annotation)
    }  # fmt: skip


def test_typed_dicts_and_loaders_match_the_tag() -> None:
    if not tag.MIRROR.exists():
        pytest.skip("no NeMo-RL mirror on this machine; the data-encoded tests above still ran")
    for cls, (path, required, declared) in data_tag.TYPED_DICTS.items():
        source = git_show(tag.MIRROR, tag.TAG, path)
        assert _fields(source, cls) == declared, cls
        assert _required(source, cls) == required, cls
    for path, cls, kwargs in data_tag.LOADERS.values():
        tree = ast.parse(git_show(tag.MIRROR, tag.TAG, path))
        node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
        init = next(f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
        assert {a.arg for a in init.args.args[1:]} == kwargs, cls
    # the bases' loggers name their runs after data.train.dataset_name, which our owned data keeps
    for alg in ("sft", "rm"):
        base = yaml.safe_load(git_show(tag.MIRROR, tag.TAG, tag.BASES[alg]))
        assert "${data.train.dataset_name}" in base["logger"]["wandb"]["name"]


@pytest.mark.parametrize("step_id", list(STEPS))
def test_every_schema_key_is_in_the_mapping_table(step_id: str) -> None:
    from nemotron.docs.generate import nemo_rl_mapping

    rows = set(nemo_rl_mapping()[step_id])
    keys = set(dict(flatten(Catalog().get(step_id).config_schema()().model_dump(mode="json"))))
    assert sorted(keys - rows) == [] and sorted(rows - keys) == []


@pytest.mark.parametrize("step_id", list(STEPS))
def test_cli_dry_run_prints_the_entry_and_writes_nothing(
    home: Path, run_cli: Callable[..., Any], step_id: str
) -> None:
    base = ["steps", "run", step_id, "-c", "nemo_rl", "-b", "slurm_rlhf"]
    result = run_cli(*base, "--dry-run")
    assert result.code == 0, result.err
    assert f"examples/run_{STEPS[step_id]}.py --config" in result.out and "convert_dcp_to_hf.py" in result.out
    refused = run_cli(*base, "runtime.device=cpu", "--dry-run")
    assert refused.code == 2 and "runtime.device='cpu': NeMo-RL trains on GPUs only" in refused.err
    assert not (home / "jobs").exists()


def test_the_algorithm_section_is_the_entrys_name() -> None:
    from nemotron.engines.nemo_rl.sections import GRPO_ENTRY, PPO_ENTRY, algorithm_section

    assert [algorithm_section(e) for e in ("examples/run_sft.py", "examples/run_rm.py", GRPO_ENTRY, PPO_ENTRY)] == [
        "sft", "rm", "grpo", "ppo"]  # fmt: skip
    with pytest.raises(ValueError, match="no NeMo-RL example entry"):
        algorithm_section("examples/nemo_gym/grpo_nemo_gym.py")
