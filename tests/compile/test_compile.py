"""Config precedence, strict validation with every error at once, and input binding with type checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemotron.artifacts.store import ArtifactStore
from nemotron.catalog import Catalog
from nemotron.compile import compile_job, compose_config
from nemotron.config.profiles import load_profile
from nemotron.errors import NotFound, UserError


@pytest.fixture
def catalog(fixture_steps: Path) -> Catalog:
    return Catalog()


@pytest.fixture
def env_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    f = tmp_path / "env.toml"
    f.write_text(
        '[base]\nexecutor = "local"\nconfig = { "trainer.max_steps" = 7, "trainer.sleep_s" = 0.5 }\n'
        '[child]\nextends = "base"\nconfig = { "trainer.sleep_s" = 0.25 }\nenv_vars = { API_TOKEN = "s3cr3t-value-123" }\n'
    )
    monkeypatch.setenv("NEMOTRON_ENV_FILE", str(f))
    return f


def test_precedence_defaults_preset_profile_cli(catalog: Catalog, env_file: Path) -> None:
    step = catalog.get("test/count")
    # schema default max_steps=5; preset tiny sets 3; profile base sets 7 (child inherits); CLI sets 9.
    config, sources = compose_config(step, "tiny", [], load_profile("child"))
    assert config["trainer"]["max_steps"] == 7 and sources["trainer.max_steps"] == "profile:child"
    assert config["trainer"]["sleep_s"] == 0.25  # the child's own value beats the parent's 0.5
    config, sources = compose_config(step, "tiny", ["trainer.max_steps=9"], load_profile("child"))
    assert config["trainer"]["max_steps"] == 9 and sources["trainer.max_steps"] == "cli"
    config, sources = compose_config(step, "tiny", [])
    assert config["trainer"]["max_steps"] == 3 and sources["trainer.max_steps"] == "preset:tiny"
    assert "trainer.fail_at" not in sources  # left at its schema default


def test_preset_chain_with_defaults(catalog: Catalog) -> None:
    config, sources = compose_config(catalog.get("test/count"), "chained", [])
    assert config["trainer"]["max_steps"] == 3 and sources["trainer.max_steps"] == "preset:tiny"
    assert config["trainer"]["sleep_s"] == 0.01 and sources["trainer.sleep_s"] == "preset:chained"


def test_every_error_reported_at_once_with_did_you_mean(catalog: Catalog) -> None:
    with pytest.raises(UserError) as e:
        compose_config(
            catalog.get("test/count"), "tiny", ["trainer.max_stepz=20", "trainer.sleep_s=slow", "trainr.x=1"]
        )
    problems = e.value.problems
    assert len(problems) == 3
    assert any(
        "trainer.max_stepz" in p and "did you mean 'trainer.max_steps'" in p and "[from cli]" in p
        for p in problems
    )
    assert any("trainer.sleep_s" in p and "'slow'" in p for p in problems)
    assert any(p.startswith("trainr: unknown key") and "did you mean 'trainer'" in p for p in problems)


def test_unknown_preset_and_step_suggest(catalog: Catalog) -> None:
    with pytest.raises(NotFound, match="did you mean 'tiny'"):
        compose_config(catalog.get("test/count"), "tinny", [])
    with pytest.raises(NotFound, match="did you mean 'rl/reinforce'"):
        catalog.get("rl/reinforc")


def test_malformed_yaml_names_file_and_line(catalog: Catalog, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  max_steps: 3\n   sleep_s: [\n")
    with pytest.raises(UserError, match=r"bad\.yaml:3:\d+: malformed YAML"):
        compose_config(catalog.get("test/count"), str(bad), [])


def _store_with(tmp_path: Path, name: str, type_: str, content: str) -> ArtifactStore:
    store = ArtifactStore(tmp_path / "artifacts")
    f = tmp_path / f"{name}.jsonl"
    f.write_text(content)
    store.register([(name, type_, f, {})], job_id=None)
    return store


def test_binding_resolves_store_refs_and_checks_is_a(catalog: Catalog, tmp_path: Path) -> None:
    store = _store_with(tmp_path, "nums", "prompt_jsonl", '{"prompt": "1"}\n')
    job = compile_job(catalog, "test/count", "tiny", ["inputs.numbers=nums:latest"], store=store)
    (b,) = job.bindings
    assert (b.kind, b.artifact, b.actual_type) == ("store", "nums:v1", "prompt_jsonl")
    assert job.step_config["inputs"]["numbers"] == b.path  # the step reads the resolved path


def test_wrong_artifact_type_says_expected_and_got(catalog: Catalog, tmp_path: Path) -> None:
    store = _store_with(
        tmp_path, "prefs", "preference_jsonl", '{"prompt": "a", "chosen": "b", "rejected": "c"}\n'
    )
    # preference_jsonl is_a training_jsonl, not prompt_jsonl
    with pytest.raises(UserError) as e:
        compile_job(catalog, "test/count", "tiny", ["inputs.numbers=prefs:v1"], store=store)
    assert "expected type prompt_jsonl, got preference_jsonl" in e.value.render()


def test_path_input_type_detected_from_content(catalog: Catalog, tmp_path: Path) -> None:
    sft = tmp_path / "sft.jsonl"
    sft.write_text(json.dumps({"prompt": "p", "response": "x"}) + "\n")
    with pytest.raises(UserError, match="expected type prompt_jsonl, got sft_jsonl"):
        compile_job(
            catalog, "test/count", "tiny", [f"inputs.numbers={sft}"], store=ArtifactStore(tmp_path / "a")
        )


def test_missing_artifact_names_the_producer(catalog: Catalog, tmp_path: Path) -> None:
    with pytest.raises(UserError) as e:
        compile_job(
            catalog,
            "rl/reinforce",
            "tiny",
            ["inputs.policy=nope:latest"],
            store=ArtifactStore(tmp_path / "a"),
        )
    assert "no artifact named 'nope'" in e.value.render()


def test_secrets_are_masked_in_the_job(catalog: Catalog, tmp_path: Path) -> None:
    job = compile_job(
        catalog, "test/count", "tiny", ["server.token=hunter2-secret"], store=ArtifactStore(tmp_path / "a")
    )
    from nemotron.launch.submit import dry_run

    text = dry_run(job)
    assert "hunter2-secret" not in text and "token: '***'" in text


def test_every_shipped_preset_reads_the_same_with_libyaml(catalog: Catalog) -> None:
    """Presets are parsed by libyaml where PyYAML has it (compile._yaml_file): each must read as PyYAML's own parser
    reads it, and a malformed one must still get PyYAML's message (test_cli's malformed preset)."""
    import yaml

    from nemotron.compile import _FAST_LOADER, _yaml_file

    assert _FAST_LOADER is yaml.CSafeLoader  # the check is real: libyaml is in this environment
    files = [p for s in catalog.steps.values() for p in sorted(s.config_dir.glob("*.yaml"))]
    assert len(files) >= 14
    for path in files:
        assert _yaml_file(path) == (yaml.safe_load(path.read_text()) or {}), path


def test_a_dry_run_validates_the_step_config_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    """The Job carries the config object compile validated: preflight, the resource plan and the engine read it
    instead of validating the config again. A copy of test/count whose Config counts its validations shows it."""
    import shutil
    import sys

    from nemotron.launch import submit

    root = tmp_path / "steproot"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "steproot", root)
    schema = root / "steps" / "test" / "count" / "schema.py"
    source = schema.read_text().replace(
        "from pydantic import Field", "from pydantic import Field, model_validator"
    )
    schema.write_text(
        source.replace(
            "class Config(Strict):\n",
            "VALIDATED: list[int] = []\n\n\nclass Config(Strict):\n"
            "    @model_validator(mode='after')\n"
            "    def _count(self) -> 'Config':\n"
            "        VALIDATED.append(1)\n"
            "        return self\n\n",
        )
    )
    monkeypatch.setenv("NEMOTRON_STEPS_PATH", str(root))
    catalog = Catalog()
    counted = sys.modules[catalog.get("test/count").config_schema().__module__].VALIDATED
    job = compile_job(catalog, "test/count", "tiny", ["trainer.max_steps=4"], dry_run=True)
    assert len(counted) == 2  # the schema's defaults, then the composed config
    assert job.config.trainer.max_steps == 4  # type: ignore[attr-defined]
    text = submit.dry_run(job)
    assert "max_steps: 4  # cli" in text  # the dry run did its work: preflight, plan, engine, render
    assert len(counted) == 2
