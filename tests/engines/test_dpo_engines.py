"""rl/dpo on NeMo-RL v0.7.0 (run_dpo.py over dpo.yaml) and NeMo-Aligner v0.7.0 (train_gpt_dpo.py with gpt_dpo.yaml),
checked against what the tags read (tests/engines/nemo_rl_v070.py, nemo_rl_data_v070.py, nemo_aligner_v070.py, each
re-read from the mirrors by the tests beside it): the keys their code reads, DPOConfig's fields, the loader's merge
rule, the override keys of the YAML, the data files their datasets read, and what each refuses."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.engines import nemo_aligner_v070 as aligner_tag
from tests.engines import nemo_rl_data_v070 as data_tag
from tests.engines import nemo_rl_v070 as tag
from tests.engines.mirrors import git_show
from tests.engines.nemo_rl_rules import has, load_config

from nemotron.catalog import Catalog
from nemotron.config.configtree import flatten, unflatten
from nemotron.engines import data_files
from nemotron.engines.nemo_aligner.config import compile_aligner
from nemotron.engines.nemo_aligner.scripts import AlignerRun
from nemotron.engines.nemo_rl.config import NemoRLRun, compile_run
from nemotron.errors import UserError
from nemotron.plan.placement import Placement

STEP = "rl/dpo"
JOB = "/jobs/run 1"
GIVEN = {"inputs.policy": "/models/sft", "inputs.preferences": "/data/pairs.jsonl"}
# what NeMo-Aligner validates like (after steps only, in batches of the training batch): its preset's keys
ALIGNER = {"inputs.policy": "/models/sft.nemo", "dpo.val_at_start": False, "dpo.val_at_end": True,
           "dpo.val_global_batch_size": 128}  # fmt: skip


def _config(backend: str, overrides: dict[str, Any]) -> Any:
    schema = Catalog().get(STEP).config_schema()
    flat = dict(flatten(schema().model_dump(mode="json"))) | {"backend": backend} | GIVEN | overrides
    return schema.model_validate(unflatten(flat))


def nemo_rl(**overrides: Any) -> NemoRLRun:
    flat = {k.replace("__", "."): v for k, v in overrides.items()}
    return compile_run(STEP, _config("nemo_rl", flat), Placement(JOB, 2, 8))


def nemo_aligner(**overrides: Any) -> AlignerRun:
    flat = ALIGNER | {k.replace("__", "."): v for k, v in overrides.items()}
    return compile_aligner(STEP, _config("nemo_aligner", flat), Placement(JOB, 2, 8))


def loaded(run: NemoRLRun) -> dict[str, Any]:
    """The run's config as NeMo-RL's loader merges it over the base keys we encoded (tag.BASE_KEYS)."""
    parent = run.config["defaults"]
    assert parent == f"/opt/nemo-rl/{tag.BASES['dpo']}"
    return load_config(run.config, {parent: unflatten(tag.BASE_KEYS["dpo"])})


def refused(compile_it: Callable[..., Any], **overrides: Any) -> list[str]:
    with pytest.raises(UserError) as err:
        compile_it(**overrides)
    return list(err.value.problems)


# ---- NeMo-RL ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["dtensor", "megatron"])
def test_nemo_rl_sets_every_key_the_tag_reads_and_every_dpo_field(backend: str) -> None:
    run = nemo_rl(nemo_rl__policy_backend=backend)
    assert run.entry == "examples/run_dpo.py" and run.entry in tag.ENTRIES
    cfg = loaded(run)
    missing = [(k, f"{f}:{n}") for k, f, n in tag.REQUIRED["dpo"] if not has(cfg, k)]
    assert missing == []
    assert set(cfg["dpo"]) == data_tag.TYPED_DICTS["DPOConfig"][2]  # none left to the base's values
    _, required, declared = data_tag.TYPED_DICTS["DataConfig"]
    assert required <= set(cfg["data"]) <= declared
    for entry in (cfg["data"]["train"], cfg["data"]["validation"]):
        assert set(entry) <= data_tag.TYPED_DICTS["PreferenceDatasetConfig"][2]
        assert entry["dataset_name"] == "BinaryPreferenceDataset"
        assert (
            set(entry) - {"dataset_name", "prompt_file", "system_prompt_file"}
            <= data_tag.LOADERS[entry["dataset_name"]][2]
        )
    # the base's dataset must not survive, nor its top-3 checkpoints by a validation metric (ours keep every step)
    assert "HelpSteer3" not in str(cfg["data"]) and "_override_" not in str(cfg)
    assert cfg["checkpointing"]["metric_name"] is None and cfg["checkpointing"]["keep_top_k"] is None
    assert cfg["policy"]["megatron_cfg"]["enabled"] is (backend == "megatron")


def test_nemo_rl_hand_checked_values() -> None:
    run = nemo_rl(dpo__max_num_steps=40, dpo__val_period=10, dpo__reference_policy_kl_penalty=0.3,
                  dpo__preference_average_log_probs=True, dpo__sft_loss_weight=0.5, trainer__global_batch_size=64,
                  trainer__micro_batch_size=4, trainer__max_length=512, checkpoint__save_interval=20)  # fmt: skip
    d, pol = run.config["dpo"], run.config["policy"]
    assert (d["max_num_steps"], d["max_num_epochs"], d["val_period"], d["seed"]) == (40, 40, 10, 1234)
    assert d["reference_policy_kl_penalty"] == 0.3 and d["sft_loss_weight"] == 0.5
    # sft_average_log_probs unset follows preference_average_log_probs, as the base's interpolation does
    assert d["preference_average_log_probs"] is True and d["sft_average_log_probs"] is True
    assert (pol["train_global_batch_size"], pol["train_micro_batch_size"], d["val_micro_batch_size"]) == (
        64,
        4,
        4,
    )
    assert pol["max_total_sequence_length"] == 512 == run.config["data"]["max_input_seq_length"]
    assert pol["model_name"] == "/models/sft" == pol["tokenizer"]["name"]
    assert run.config["checkpointing"]["save_period"] == 20
    assert run.outputs == {"policy": f"{JOB}/outputs/policy"} and "convert_dcp_to_hf.py" in run.finalize
    # 1 in 20 pairs held out (the schema's 0.05) into the validation file run_dpo.py reads
    kind, data, train, val, every = shlex.split(run.driver.split(" && ")[1])[4:]
    assert (kind, data, every) == ("pairs", "/data/pairs.jsonl", "20")
    assert (train, val) == (
        run.config["data"]["train"]["data_path"],
        run.config["data"]["validation"]["data_path"],
    )
    # the user's own validation file: every pair of it validates, none of the training file
    own = nemo_rl(inputs__validation_preferences="/data/held out.jsonl")
    assert shlex.split(own.driver.split(" && ")[1])[-2:] == ["0", "/data/held out.jsonl"]
    # no held-out pairs: NeMo-RL validates nothing (val_period 0, no validation set)
    none = nemo_rl(trainer__validation_fraction=0)
    assert none.config["dpo"]["val_period"] == 0 and none.config["dpo"]["val_at_start"] is False
    assert none.config["data"]["validation"] is None


@pytest.mark.parametrize(
    ("overrides", "key", "says"),
    [
        ({"dpo__preference_loss": "ipo"}, "dpo.preference_loss", "backend=nemo_aligner"),
        ({"dpo__label_smoothing": 0.1}, "dpo.label_smoothing", "backend=builtin"),
        ({"inputs__reference": "/models/other"}, "inputs.reference", "frozen copy of the policy"),
        ({"nemo_rl__sequence_packing": True}, "nemo_rl.sequence_packing", "packs no sequences"),
        ({"nemo_rl__pipeline_parallel_size": 2}, "nemo_rl.pipeline_parallel_size", "megatron"),
        ({"trainer__log_interval": 5}, "trainer.log_interval", "every step"),
        ({"runtime__device": "cpu"}, "runtime.device", "GPUs only"),
        ({"inputs__policy": None}, "inputs.policy", "needs it set"),
        # 2 nodes x 8 GPUs at TP 2: 8 data-parallel ranks, so a multiple of 8 x 2 pairs
        (
            {"nemo_rl__tensor_parallel_size": 2, "trainer__global_batch_size": 24},
            "trainer.global_batch_size",
            "= 16",
        ),
    ],
)
def test_nemo_rl_refuses_what_its_dpo_cannot_express(overrides: dict[str, Any], key: str, says: str) -> None:
    (problem,) = refused(nemo_rl, **overrides)
    assert problem.split("=")[0] == key and says in problem, problem


# ---- NeMo-Aligner -----------------------------------------------------------------------------------------------


def _overrides(run: AlignerRun) -> dict[str, Any]:
    (group,) = run.groups
    return dict(group.overrides)


@pytest.mark.parametrize("loss", ["dpo", "ipo", "rpo_sq", "rpo_bwd_kl", "rpo_fwd_kl"])
def test_nemo_aligner_overrides_are_the_yamls_keys_and_run_every_variant(loss: str) -> None:
    run = nemo_aligner(dpo__preference_loss=loss)
    (group,) = run.groups
    assert (
        group.script == "examples/nlp/gpt/train_gpt_dpo.py"
        and aligner_tag.SCRIPTS[group.script] == group.yaml
    )
    keys = aligner_tag.KEYS[group.yaml]
    added = {k for yaml_name, k in aligner_tag.ADDED if yaml_name == group.yaml}
    unknown = [k for k, _ in group.overrides if k not in keys and k.removeprefix("++") not in added]
    assert unknown == [] and len({k for k, _ in group.overrides}) == len(group.overrides)
    assert [k for k, _ in group.overrides if k.startswith("++")] == ["++model.data.append_eod"]
    o = dict(group.overrides)
    assert o["model.dpo.preference_loss"] == loss and loss in aligner_tag.PREFERENCE_LOSSES
    # the .nemo the run leaves: <log dir>/checkpoints/<exp_manager.name>.nemo, written on train end
    log_dir = o["exp_manager.explicit_log_dir"]
    assert run.outputs == {"policy": f"{log_dir}/checkpoints/{keys['exp_manager.name']}.nemo"}
    assert keys["exp_manager.checkpoint_callback_params.save_nemo_on_train_end"] is True


def test_nemo_aligner_hand_checked_values() -> None:
    o = _overrides(nemo_aligner(dpo__preference_loss="rpo_sq", dpo__gt_reward_scale=2.0,
                                dpo__reference_policy_kl_penalty=0.3, dpo__max_num_steps=40, dpo__val_period=10,
                                dpo__val_batches=3, dpo__sft_average_log_probs=True, trainer__micro_batch_size=4,
                                trainer__max_length=512))  # fmt: skip
    assert (o["model.dpo.gt_reward_scale"], o["model.dpo.ref_policy_kl_penalty"]) == (2.0, 0.3)
    assert (
        o["model.dpo.sft_average_log_probs"] is True and o["model.dpo.preference_average_log_probs"] is False
    )
    assert (o["trainer.dpo.max_steps"], o["trainer.dpo.max_epochs"], o["trainer.dpo.save_interval"]) == (
        40,
        40,
        40,
    )
    assert (o["trainer.dpo.val_check_interval"], o["trainer.dpo.limit_val_batches"]) == (10, 3)
    assert (o["model.micro_batch_size"], o["model.global_batch_size"], o["model.data.seq_length"]) == (
        4,
        128,
        512,
    )
    assert o["pretrained_checkpoint.restore_from_path"] == "/models/sft.nemo"
    # val_period 0: validation after the last step only; val_batches 0: every validation batch
    only_end = _overrides(nemo_aligner(dpo__val_period=0, dpo__val_batches=0, dpo__max_num_steps=30))
    assert (only_end["trainer.dpo.val_check_interval"], only_end["trainer.dpo.limit_val_batches"]) == (
        30,
        1.0,
    )
    prefix = o["model.data.data_prefix"]
    assert prefix["validation"] == prefix["test"] == [f"{JOB}/nemo_aligner_dpo_text_validation.jsonl"]
    held = nemo_aligner(inputs__validation_preferences="/data/val.jsonl").prepare
    assert held[:3] == ("-m", "nemotron.engines.data_files", "dpo_text") and held[-2:] == (
        "0",
        "/data/val.jsonl",
    )


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"dpo__label_smoothing": 0.1}, "dpo.label_smoothing"),
        ({"inputs__reference": "/models/other.nemo"}, "inputs.reference"),
        ({"dpo__val_at_start": True}, "dpo.val_at_start"),
        ({"dpo__val_at_end": False}, "dpo.val_at_end"),
        ({"dpo__val_global_batch_size": 8}, "dpo.val_global_batch_size"),
        ({"trainer__validation_fraction": 0}, "trainer.validation_fraction"),
        ({"checkpoint__save_interval": 30, "dpo__val_period": 25}, "dpo.val_period"),
        ({"trainer__log_interval": 5}, "trainer.log_interval"),
        ({"optim__min_lr_ratio": 0.1}, "optim.min_lr_ratio"),
        ({"nemo_rl__tensor_parallel_size": 2}, "nemo_rl.tensor_parallel_size"),
    ],
)
def test_nemo_aligner_refuses_what_its_dpo_cannot_express(overrides: dict[str, Any], key: str) -> None:
    assert [p.split("=")[0] for p in refused(nemo_aligner, **overrides)] == [key]


# ---- the data files both read ----------------------------------------------------------------------------------


def test_the_data_step_writes_what_both_datasets_read(tmp_path: Path) -> None:
    """data_files as the jobs run it, on rows in every form preference_jsonl accepts: NeMo-RL's pairs and
    NeMo-Aligner's dpo_text rows (a conversation prompt as text, the RPO rewards kept where given), the user's own
    validation file converted whole, and a step that fails before the trainer when it holds nothing out."""
    convo = [{"role": "user", "content": "hi"}]
    data, own = tmp_path / "pairs.jsonl", tmp_path / "own.jsonl"
    data.write_text(json.dumps({"prompt": "p0 ", "chosen": "a", "rejected": "b", "chosen_reward": 0.9}) + "\n\n"
                    + json.dumps({"prompt": convo, "chosen_response": "c", "rejected_response": "d"}) + "\n")  # fmt: skip
    own.write_text(json.dumps({"prompt": "v", "chosen": "e", "rejected": "f"}) + "\n")
    out = [str(tmp_path / "t.jsonl"), str(tmp_path / "v.jsonl")]

    def step(kind: str, *rest: str) -> tuple[int, list[dict[str, Any]], list[dict[str, Any]]]:
        done = subprocess.run([sys.executable, data_files.__file__, kind, str(data), *out, *rest])
        read = ([json.loads(x) for x in Path(p).read_text().splitlines()] for p in out)
        return done.returncode, *read  # type: ignore[return-value]

    code, train, val = step("dpo_text", "2")
    assert code == 0 and train == [
        {"prompt": "p0 ", "chosen_response": "a", "rejected_response": "b", "chosen_reward": 0.9}
    ]
    assert val == [{"prompt": "user: hi", "chosen_response": "c", "rejected_response": "d"}]
    assert set(train[0]) <= set(aligner_tag.DPO_ROW_KEYS)
    code, train, val = step("pairs", "0", str(own))  # NeMo-RL with inputs.validation_preferences
    assert code == 0 and [r["chosen"] for r in train] == ["a", "c"] and train[1]["prompt"] == convo
    assert val == [{"prompt": "v", "chosen": "e", "rejected": "f"}]
    own.write_text("\n")
    assert step("pairs", "0", str(own))[0] == 1  # an empty validation file fails the job before the trainer


def test_the_mirrors_say_what_the_mapping_assumes() -> None:
    """run_dpo.py reads its pairs through run_rm.py's loader (setup_preference_data); the keys we add to
    gpt_dpo.yaml are read by NeMo-Aligner's code with a default; DPOModelDataset reads the dpo_text keys; its model
    runs exactly the preference losses we map."""
    if not tag.MIRROR.exists() or not aligner_tag.MIRROR.exists():
        pytest.skip("the NeMo-RL or NeMo-Aligner mirror is not on this machine; the data-encoded tests ran")
    run_dpo = git_show(tag.MIRROR, tag.TAG, "examples/run_dpo.py")
    assert "setup_preference_data(tokenizer, config.data)" in run_dpo
    assert "init_reference_model=True" in git_show(tag.MIRROR, tag.TAG, "nemo_rl/algorithms/dpo.py")
    for (_, _key), (path, read) in aligner_tag.ADDED.items():
        assert read in git_show(aligner_tag.MIRROR, aligner_tag.TAG, path)
    datasets = git_show(aligner_tag.MIRROR, aligner_tag.TAG, "nemo_aligner/data/nlp/datasets.py")
    dpo_dataset = datasets.split("class DPOModelDataset")[1].split("\nclass ")[0]
    for key in aligner_tag.DPO_ROW_KEYS:
        assert f'payload["{key}"]' in dpo_dataset or f'payload.get("{key}"' in dpo_dataset, key
    model = git_show(
        aligner_tag.MIRROR, aligner_tag.TAG, "nemo_aligner/models/nlp/gpt/megatron_gpt_dpo_model.py"
    )
    assert tuple(re.findall(r'self\.preference_loss == "(\w+)"', model)) == aligner_tag.PREFERENCE_LOSSES
    conf = yaml.safe_load(git_show(aligner_tag.MIRROR, aligner_tag.TAG, f"{aligner_tag.CONF}/gpt_dpo.yaml"))
    assert "append_eod" not in conf["model"]["data"]  # so it is added (++), not overridden


# ---- the docs and the CLI ---------------------------------------------------------------------------------------


def test_the_engine_pages_map_every_schema_key() -> None:
    from tests.engines.test_nemo_aligner import test_the_docs_table_names_every_schema_key as aligner_check

    from nemotron.docs.generate import nemo_rl_mapping

    rows = set(nemo_rl_mapping()[STEP])
    keys = set(dict(flatten(Catalog().get(STEP).config_schema()().model_dump(mode="json"))))
    assert sorted(keys - rows) == [] and sorted(rows - keys) == []
    aligner_check(STEP)


@pytest.mark.parametrize("backend", ["nemo_rl", "nemo_aligner"])
def test_the_backend_presets_dry_run_and_a_variant_is_refused_with_its_engines(
    home: Path, run_cli: Callable[..., Any], backend: str
) -> None:
    base = ["steps", "run", STEP, "-c", backend, "-b", "slurm_rlhf", "--dry-run"]
    shown = run_cli(*base)
    assert shown.code == 0, shown.err
    assert ("examples/run_dpo.py --config" if backend == "nemo_rl" else "train_gpt_dpo.py") in shown.out
    if backend == "nemo_rl":
        no = run_cli(*base, "dpo.preference_loss=rpo_fwd_kl")
        assert no.code == 2 and "dpo.preference_loss='rpo_fwd_kl': NeMo-RL v0.7.0 runs dpo only" in no.err
    else:
        no = run_cli(*base, "dpo.label_smoothing=0.1")
        assert (
            no.code == 2
            and "dpo.label_smoothing=0.1: NeMo-Aligner's DPO losses have no label smoothing" in no.err
        )
    assert not (home / "jobs").exists()


def test_nemo_aligner_trains_dpo_on_every_node_of_the_profile(
    home: Path, tmp_path: Path, run_cli: Callable[..., Any]
) -> None:
    """No server beside the trainer: the .nemo's model parallelism divides all 2 x 8 GPUs (the preflight once gave
    a trainer with a reference one node less, as if a reward server took one)."""
    from tests.engines.test_nemo_aligner import _nemo_file

    base = ["steps", "run", STEP, "-c", "nemo_aligner", "-b", "slurm_rlhf", "--dry-run"]
    fits = run_cli(*base, f"inputs.policy={_nemo_file(tmp_path / 'tp16.nemo', tensor=16)}")
    assert fits.code == 0, fits.err[-2000:]
    assert "trainer.num_nodes=2" in fits.out
    (tmp_path / "big").mkdir()
    too_big = run_cli(*base, f"inputs.policy={_nemo_file(tmp_path / 'big' / 'tp32.nemo', tensor=32)}")
    assert too_big.code == 2 and "= 32 does not divide 16 GPUs (2 nodes × 8 GPUs" in too_big.err, too_big.err


@pytest.mark.parametrize("backend", ["nemo_rl", "nemo_aligner"])
def test_the_plan_sizes_a_micro_batch_of_pairs(run_cli: Callable[..., Any], backend: str) -> None:
    """Each engine's forward takes trainer.micro_batch_size pairs, chosen and rejected (NeMo-RL: mbs x 2 rows,
    algorithms/dpo.py), so the activations and logits of 4 pairs per micro-batch are 4 times those of 1."""
    terms = []
    for pairs in (1, 4):
        r = run_cli("steps", "run", STEP, "-c", backend, "-b", "slurm_rlhf", f"trainer.micro_batch_size={pairs}",
                    "plan.models.policy=meta-llama/Llama-3.2-1B-Instruct", "plan.on_no_fit=warn", "--dry-run",
                    "--json")  # fmt: skip
        assert r.code == 0, r.err
        (group,) = json.loads(r.out)["resource_plan"]["groups"]
        terms.append(group["terms_mb"])
    one, four = terms
    assert four["activations"] == 4 * one["activations"] and four["logits"] == 4 * one["logits"]
    assert four["weights"] == one["weights"]


def test_every_nemo_aligner_word_is_read_back_by_hydra_as_compiled() -> None:
    """Hydra's override grammar and OmegaConf read each word of the trainer's command back to the value we
    compiled: the job dir's space inside data_prefix's lists, the loss variant's name, ++ on the added key."""
    from tests.engines.test_nemo_aligner import read_back

    (group,) = nemo_aligner(dpo__preference_loss="rpo_bwd_kl", dpo__gt_reward_scale=0.5).groups
    for word, (key, value) in zip(group.words(), group.overrides, strict=True):
        assert read_back(word) == (key.removeprefix("++"), value), word
