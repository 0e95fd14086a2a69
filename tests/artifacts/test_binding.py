"""Binding inputs by source (nemotron.artifacts.binding): what each kind of reference checks, and where records are
read. The expected lines are written out here; tests/bad_inputs checks the same messages through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemotron.artifacts.binding import (
    Binding,
    Problem,
    Wanted,
    bind_hub,
    bind_inputs,
    bind_package,
    bind_path,
    bind_store,
    expected_type,
)
from nemotron.artifacts.refs import parse_ref
from nemotron.artifacts.store import ArtifactStore
from nemotron.catalog import Catalog, Consumes, TypeWhen
from nemotron.errors import UserError

PROMPTS = Wanted("prompts", "prompt_jsonl")
POLICY = Wanted("policy", "checkpoint_hf")


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog()


def _jsonl(path: Path, *records: object) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_bad_line_is_named_when_the_file_is_not_recognisably_another_type(
    catalog: Catalog, tmp_path: Path
) -> None:
    path = _jsonl(tmp_path / "p.jsonl", {"prompt": "a"}, {"prompt": 3})
    got = bind_path(catalog, PROMPTS, parse_ref(str(path)), remote=False)
    assert isinstance(got, Problem)
    assert got.line.startswith(f"input 'prompts': {path}: 1 invalid line")
    assert f"{path}:2: field 'prompt': Input should be a valid string, got int" in got.line


def test_a_file_of_another_type_is_refused_by_type_without_reading_its_lines(
    catalog: Catalog, tmp_path: Path
) -> None:
    # SFT pairs where prompts go; line 2 is bad too, but the type, read from line 1, is what is wrong
    path = _jsonl(tmp_path / "s.jsonl", {"prompt": "a", "response": "b"}, {"prompt": "a", "response": 5})
    got = bind_path(catalog, PROMPTS, parse_ref(str(path)), remote=False)
    assert got == Problem(
        f"input 'prompts' ({path}): expected type prompt_jsonl, got sft_jsonl: its content is that of a sft_jsonl"
    )


def test_a_path_that_is_not_here_is_bound_unchecked_only_for_a_remote_executor(catalog: Catalog) -> None:
    ref = parse_ref("/data/on/the/cluster/p.jsonl")
    assert bind_path(catalog, PROMPTS, ref, remote=True) == Binding(
        "prompts", "prompt_jsonl", ref.text, "path", ref.text, None
    )
    got = bind_path(catalog, PROMPTS, ref, remote=False)
    assert isinstance(got, Problem) and "is neither an existing path nor an artifact" in got.line


def test_a_package_artifact_is_always_here_so_a_missing_one_is_refused(catalog: Catalog) -> None:
    ref = parse_ref("pkg://tiny/nope.jsonl")
    assert ref.kind == "package"
    got = bind_package(catalog, PROMPTS, ref)
    assert isinstance(got, Problem) and got.line.startswith(
        "input 'prompts': 'pkg://tiny/nope.jsonl' is neither"
    )
    shipped = bind_package(catalog, POLICY, parse_ref("pkg://tiny/sft_policy"))
    assert isinstance(shipped, Binding) and shipped.kind == "path"
    assert shipped.model is not None and "gpt2" in shipped.model.lower()  # a local checkpoint is described


def test_a_store_artifact_of_another_type_is_refused_with_its_converter(
    catalog: Catalog, tmp_path: Path
) -> None:
    store = ArtifactStore(tmp_path / "store")
    (tmp_path / "mega").mkdir()
    (tmp_path / "mega" / "weights").write_text("x")
    store.register([("mega", "checkpoint_megatron", tmp_path / "mega", {})], job_id=None)
    convert = catalog.types["checkpoint_megatron"].convert_to["checkpoint_hf"]
    assert bind_store(catalog, store, POLICY, parse_ref("mega:v1")) == Problem(
        f"input 'policy' (mega:v1): expected type checkpoint_hf, got checkpoint_megatron (convert it with: {convert})"
    )
    assert bind_store(catalog, store, POLICY, parse_ref("mega:v2")) == Problem(
        "input 'policy': artifact 'mega' has no version v2"
    )


def test_a_hub_id_is_bound_as_written(catalog: Catalog) -> None:
    assert bind_hub(catalog, POLICY, parse_ref("hf://org/model"), remote=False) == Binding(
        "policy", "checkpoint_hf", "hf://org/model", "hub"
    )


def test_a_file_type_is_never_a_hub_repository(catalog: Catalog) -> None:
    # `data/none.jsonl` reads as org/name too: a missing prompts file was bound as a hub id, unchecked
    prompts = Wanted("prompts", "prompt_jsonl")
    missing = bind_hub(catalog, prompts, parse_ref("data/none.jsonl"), remote=False)
    assert isinstance(missing, Problem) and "is neither an existing path nor an artifact" in missing.line
    on_cluster = bind_hub(catalog, prompts, parse_ref("data/none.jsonl"), remote=True)
    assert on_cluster == Binding("prompts", "prompt_jsonl", "data/none.jsonl", "path", "data/none.jsonl")
    nemo = Wanted("policy", "checkpoint_nemo")
    assert bind_hub(catalog, nemo, parse_ref("hf://nvidia/model"), remote=True) == Problem(
        "input 'policy' (hf://nvidia/model): a checkpoint_nemo is a file whose name ends in .nemo, "
        "not a Hugging Face repository; give its path"
    )
    assert isinstance(bind_hub(catalog, nemo, parse_ref("nvidia/model"), remote=True), Problem)


def test_every_problem_of_a_step_is_reported_at_once(catalog: Catalog, tmp_path: Path) -> None:
    config = {"inputs": {"prompts": str(tmp_path / "none.jsonl"), "policy": "nope:v1"}}
    with pytest.raises(UserError) as e:
        bind_inputs(catalog, catalog.get("rl/reinforce"), config, ArtifactStore(tmp_path / "store"))
    assert e.value.message == "cannot bind the inputs of 'rl/reinforce':"
    assert [p.split(":")[0] for p in e.value.problems] == [
        "input 'prompts'",
        "input 'policy'",
        "input 'reward_model' (reward_model_hf) is not set",
    ]


def test_a_megatron_checkpoint_is_told_by_its_metadata_and_a_config_alone_is_none(tmp_path: Path) -> None:
    """Megatron-Core's dist_checkpointing writes metadata.json in every checkpoint (at the path, or in a save dir's
    iter_NNNNNNN/); a directory holding only an HF config.json was taken for one (issue 43)."""
    from nemotron.artifacts.typecheck import detect_type
    from nemotron.catalog import Catalog

    catalog = Catalog()
    save = tmp_path / "save" / "iter_0000010"
    save.mkdir(parents=True)
    (save / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    (save / "__0_0.distcp").write_bytes(b"")
    assert detect_type(tmp_path / "save", catalog) == "checkpoint_megatron"
    assert detect_type(save, catalog) == "checkpoint_megatron"
    config_only = tmp_path / "config_only"
    config_only.mkdir()
    (config_only / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    assert detect_type(config_only, catalog) is None


def test_an_inputs_type_narrows_where_its_settings_hold() -> None:
    """rl/rlhf's judge is any checkpoint_hf for a generative judge and a reward_model_hf for judge.kind=reward_model;
    an engine that reads another type (NeMo-Aligner's .nemo) is not narrowed; a narrower type that is no kind of
    the input's own is the manifest's error."""
    catalog = Catalog()
    narrowing = [TypeWhen("reward_model_hf", {"judge.kind": "reward_model"})]
    judge = Consumes(
        "judge", "checkpoint_hf", backend_types={"nemo_aligner": "checkpoint_nemo"}, types_when=narrowing
    )
    as_reward_model, generative = {"judge": {"kind": "reward_model"}}, {"judge": {"kind": "generative"}}
    assert expected_type(catalog, judge, "builtin", as_reward_model) == "reward_model_hf"
    assert expected_type(catalog, judge, "builtin", generative) == "checkpoint_hf"
    assert expected_type(catalog, judge, "nemo_aligner", as_reward_model) == "checkpoint_nemo"
    for wrong in ("prompt_jsonl", "reward_model_hff"):
        bad = judge._replace(types_when=[TypeWhen(wrong, {})])
        with pytest.raises(
            UserError, match=f"types_when names '{wrong}', which is no kind of its type 'checkpoint_hf'"
        ):
            expected_type(catalog, bad, "builtin", generative)
