"""Every shipped manifest loads and keeps its promises: unique ids, known types, no is_a cycles, parameters that
exist in the step's schema with the same defaults, entry files that exist."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from nemotron.catalog import Catalog, InvalidManifest, Manifest, validate
from nemotron.compile import compose_config
from nemotron.config.configtree import get_dotted
from nemotron.config.fields import model_at
from nemotron.core.paths import bundled_root

CATALOG = Catalog([bundled_root()])
MISSION_STEPS = {"rl/rlhf", "rl/reinforce", "rl/ppo", "rm/serve"}


def test_mission_steps_and_feeders_are_in_the_catalog() -> None:
    assert MISSION_STEPS | {"data/prep", "sft", "rm/train"} <= set(CATALOG.steps)


def test_manifest_ids_are_unique_across_files() -> None:
    steps = [m for m in (bundled_root() / "manifests").glob("**/*.toml") if m.parent.name != "pipelines"]
    ids = [m.relative_to(bundled_root() / "manifests").with_suffix("").as_posix() for m in steps]
    assert sorted(CATALOG.steps) == sorted(i for i in ids if i != "types")


def test_required_types_exist_with_their_is_a_edges() -> None:
    for t in ("prompt_jsonl", "sft_jsonl", "preference_jsonl"):
        assert CATALOG.is_a(t, "training_jsonl")
    assert CATALOG.is_a("reward_model_hf", "checkpoint_hf")
    assert "checkpoint_megatron" in CATALOG.types
    assert not CATALOG.is_a("checkpoint_hf", "reward_model_hf")  # is_a is directed


def test_every_type_named_anywhere_exists() -> None:
    for spec in CATALOG.types.values():
        assert set(spec.is_a) <= set(CATALOG.types)
        assert set(spec.convert_to) <= set(CATALOG.types)
    for step in CATALOG.steps.values():
        for t in [c.type for c in step.manifest.consumes] + [p.type for p in step.manifest.produces]:
            assert t in CATALOG.types, f"{step.id}: unknown type {t}"
        for c in step.manifest.consumes:  # a narrower type is a kind of the input's own
            assert all(CATALOG.is_a(w.type, c.type) and w.type in CATALOG.types for w in c.types_when), (
                step.id
            )


def test_no_is_a_cycles() -> None:
    def visit(t: str, path: tuple[str, ...]) -> None:
        assert t not in path, f"is_a cycle: {' -> '.join((*path, t))}"
        for parent in CATALOG.types[t].is_a:
            visit(parent, (*path, t))

    for t in CATALOG.types:
        visit(t, ())


@pytest.mark.parametrize("step_id", sorted(CATALOG.steps))
def test_entry_and_schema_files_exist(step_id: str) -> None:
    step = CATALOG.get(step_id)
    assert step.entry_path.is_file(), step.entry_path
    assert step.schema_path.is_file(), step.schema_path
    assert {"tiny", "default"} <= set(step.presets())


@pytest.mark.parametrize("step_id", sorted(CATALOG.steps))
def test_parameters_exist_in_schema_with_matching_defaults(step_id: str) -> None:
    step = CATALOG.get(step_id)
    schema = step.config_schema()
    defaults = schema().model_dump(mode="json")
    for p in step.manifest.parameters:
        *parent, leaf = p.key.split(".")
        owner = model_at(schema, parent)
        assert owner is not None and leaf in owner.model_fields, (
            f"{step_id}: parameter {p.key} not in the schema"
        )
        if p.default is not None:
            assert get_dotted(defaults, p.key) == p.default, (
                f"{step_id}: {p.key} manifest default {p.default} != schema"
            )


@pytest.mark.parametrize("step_id", sorted(CATALOG.steps))
def test_consumes_and_produces_keys_exist_in_schema(step_id: str) -> None:
    step = CATALOG.get(step_id)
    schema = step.config_schema()
    for key in [c.config_key for c in step.manifest.consumes] + [
        p.config_key for p in step.manifest.produces
    ]:
        *parent, leaf = key.split(".")
        owner = model_at(schema, parent)
        assert owner is not None and leaf in owner.model_fields, f"{step_id}: {key} not in the schema"


@pytest.mark.parametrize("step_id", sorted(CATALOG.steps))
def test_text_when_names_settings_the_schema_has(step_id: str) -> None:
    """A misspelt `text_when` key would never match, and the tokenizer check would refuse runs that send text."""
    step = CATALOG.get(step_id)
    schema = step.config_schema()
    for c in step.manifest.consumes:
        for key, value in c.text_when.items():
            *parent, leaf = key.split(".")
            owner = model_at(schema, parent)
            assert owner is not None and leaf in owner.model_fields, (
                f"{step_id}: text_when {key} not in the schema"
            )
            assert value in typing.get_args(owner.model_fields[leaf].annotation), (
                f"{step_id}: {key}={value!r}"
            )


def test_reads_token_ids_of_names_another_input() -> None:
    manifest = {
        "step": {"id": "x", "name": "x", "description": "x", "category": "x"},
        "consumes": [{"name": "reward_model", "type": "reward_model_hf", "reads_token_ids_of": "polcy"}],
    }
    with pytest.raises(InvalidManifest, match="reads_token_ids_of names no other input: 'polcy'"):
        validate(Manifest, manifest)


@pytest.mark.parametrize(
    ("model", "says"),
    [
        (
            {"role": "policy", "input": "polcy"},
            "models: Value error, policy: input names no [[consumes]] entry: 'polcy'",
        ),
        (
            {"role": "policy", "input": "policy", "trainable": True},
            "models.0.trainable: Extra inputs are not permitted",
        ),
        ({"role": "actor", "input": "policy"}, "models.0.role: Input should be"),
    ],
)
def test_a_models_entry_is_checked_strictly(model: dict[str, object], says: str) -> None:
    manifest = {
        "step": {"id": "x", "name": "x", "description": "x", "category": "x", "engines": {"nemo_rl": "grpo"}},
        "consumes": [{"name": "policy", "type": "checkpoint_hf"}],
        "models": [model],
    }
    with pytest.raises(InvalidManifest) as refused:
        validate(Manifest, manifest)
    assert any(says in problem for problem in refused.value.problems), refused.value.problems


@pytest.mark.parametrize(
    ("step_id", "preset"), [(s, p) for s in sorted(CATALOG.steps) for p in CATALOG.get(s).presets()]
)
def test_every_shipped_preset_validates(step_id: str, preset: str) -> None:
    config, sources = compose_config(CATALOG.get(step_id), preset, [])
    assert config and all(src.startswith("preset:") for src in sources.values())


def test_mission_defaults_follow_the_systems_users_know() -> None:
    rlhf, _ = compose_config(CATALOG.get("rl/rlhf"), "default", [])
    assert rlhf["grpo"]["num_generations_per_prompt"] == 8
    assert rlhf["loss_fn"]["reference_policy_kl_penalty"] == 0.01
    assert rlhf["loss_fn"]["kl_estimator"] == "k3"
    assert rlhf["loss_fn"]["ratio_clip_min"] == rlhf["loss_fn"]["ratio_clip_max"] == 0.2
    reinforce, _ = compose_config(CATALOG.get("rl/reinforce"), "default", [])
    assert reinforce["reinforce"]["initial_policy_kl_penalty"] == 0.01
    assert reinforce["reinforce"]["num_rollouts_per_prompt"] == 4
    ppo, _ = compose_config(CATALOG.get("rl/ppo"), "default", [])
    assert (ppo["ppo"]["discount_factor"], ppo["ppo"]["gae_lambda"], ppo["ppo"]["ratio_eps"]) == (
        1.0,
        0.95,
        0.2,
    )
    assert ppo["ppo"]["entropy_bonus"] == 0.0 and ppo["critic"]["loss_clip_val"] == 0.2


def test_rlhf_accepts_the_documented_nemo_rl_overrides() -> None:
    overrides = [
        "grpo.num_generations_per_prompt=16",
        "grpo.max_num_steps=1000",
        "grpo.num_prompts_per_step=32",
        "data.train.data_path=/lustre/rlhf/train.jsonl",
        "data.validation.data_path=/lustre/rlhf/val.jsonl",
        "env.nemo_gym.genrm_model.responses_api_models.vllm_model.model=nvidia/Nemotron-Reward-Model",
    ]
    config, sources = compose_config(CATALOG.get("rl/rlhf"), "default", overrides)
    assert config["grpo"]["num_generations_per_prompt"] == 16
    assert (
        config["env"]["nemo_gym"]["genrm_model"]["responses_api_models"]["vllm_model"]["model"]
        == "nvidia/Nemotron-Reward-Model"
    )
    assert sources["data.train.data_path"] == "cli"


def test_rlhf_default_judge_reads_RL_REWARD_MODEL(monkeypatch: pytest.MonkeyPatch) -> None:
    key = "env.nemo_gym.genrm_model.responses_api_models.vllm_model.model"
    monkeypatch.delenv("RL_REWARD_MODEL", raising=False)
    config, _ = compose_config(CATALOG.get("rl/rlhf"), "default", [])
    assert get_dotted(config, key) == "meta-llama/Llama-3.2-1B-Instruct"
    monkeypatch.setenv("RL_REWARD_MODEL", "/models/my-judge")
    config, _ = compose_config(CATALOG.get("rl/rlhf"), "default", [])
    assert get_dotted(config, key) == "/models/my-judge"


def test_preset_first_comment_is_the_command_that_runs_it() -> None:
    for step in CATALOG.steps.values():
        for preset in step.presets():
            first = (step.config_dir / f"{preset}.yaml").read_text().splitlines()[0]
            assert first.startswith(f"# nemotron steps run {step.id} -c {preset}"), (
                f"{step.id}/{preset}: {first}"
            )


def test_user_steps_on_the_search_path_are_found(monkeypatch: pytest.MonkeyPatch) -> None:
    root = Path(__file__).resolve().parent.parent / "fixtures" / "steproot"
    monkeypatch.setenv("NEMOTRON_STEPS_PATH", str(root))
    catalog = Catalog()
    assert "test/count" in catalog.steps and "rl/ppo" in catalog.steps
