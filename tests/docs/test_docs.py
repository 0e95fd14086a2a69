"""Docs stay true: the generated step reference matches the manifests, and documented commands are real."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from nemotron.catalog import Catalog
from nemotron.compile import compose_config
from nemotron.config.fields import schema_fields
from nemotron.core.paths import bundled_root
from nemotron.docs.blocks import parse_blocks
from nemotron.docs.generate import (
    BUILTIN_UNREAD,
    ENGINE_COLUMNS,
    config_reference,
    config_reference_path,
    engine_mapping,
    reference_path,
    step_reference,
    troubleshooting_path,
    with_known_errors,
)

ROOT = bundled_root()


def test_step_reference_is_not_stale() -> None:
    expected = step_reference(Catalog([ROOT]))
    assert reference_path().read_text() == expected, (
        "docs/reference/steps.md is stale: run `python -m nemotron.docs.generate`"
    )


def test_config_reference_is_not_stale() -> None:
    expected = config_reference(Catalog([ROOT]))
    assert config_reference_path().read_text() == expected, (
        "docs/reference/config.md is stale: run `python -m nemotron.docs.generate`"
    )


def test_the_known_errors_of_troubleshooting_md_are_not_stale() -> None:
    page = troubleshooting_path().read_text()
    assert page == with_known_errors(page, Catalog([ROOT])), (
        "docs/troubleshooting.md's known errors are stale: run `python -m nemotron.docs.generate`"
    )


def test_every_known_error_has_a_cause_a_fix_and_a_match_and_is_on_the_page() -> None:
    page = troubleshooting_path().read_text()
    for step in Catalog([ROOT]).steps.values():
        for e in step.manifest.errors:
            assert e.cause and e.recovery and e.match, (step.id, e.name)
            assert f"| `{step.id}` | {e.name} |" in page, (step.id, e.name)


@pytest.mark.parametrize("step_id", sorted(Catalog([ROOT]).steps))
def test_every_schema_field_has_a_description(step_id: str) -> None:
    """The config reference is generated from the descriptions: a key without one would be a blank row. A group
    may describe itself with its class docstring instead."""
    fields = list(schema_fields(Catalog([ROOT]).get(step_id).config_schema()))
    assert len(fields) > 5
    assert [f.key for f in fields if not f.description] == []


@pytest.mark.parametrize(
    ("page", "steps", "key", "cell"),
    [
        (
            "nemo-rl.md",
            ["eval/policy", "rl/dpo", "rl/ppo", "rl/reinforce", "rl/rlhf", "rm/train", "sft"],
            "trainer.log_interval",
            "NeMo-RL logs every step",
        ),
        (
            "nemo-aligner.md",
            ["rl/dpo", "rl/ppo", "rl/reinforce", "rm/serve", "rm/train", "sft"],
            "trainer.max_steps",
            "trainer.ppo.max_steps",
        ),
    ],
)
def test_the_config_reference_shows_each_engines_mapping_of_every_key(
    page: str, steps: list[str], key: str, cell: str
) -> None:
    """Each engine's key-by-key page (docs/nemo-rl.md, docs/nemo-aligner.md) is a column of the reference: every
    row of the page stands in the step's section, in a table whose header names the engine."""
    mapping = engine_mapping(page)
    assert sorted(mapping) == steps
    header = next(f"| {backend} ({runs}) |" for backend, runs, p in ENGINE_COLUMNS if p == page)
    text = config_reference_path().read_text()
    for step_id, rows in mapping.items():
        section = text.split(f"## `{step_id}`\n")[1].split("\n## ")[0]
        assert header in section, (step_id, header)
        for k, c in rows.items():  # a `group.*` row speaks for every key of the group
            assert f"| `{k.removesuffix('*')}" in section and c in section, (step_id, k)
    assert cell in mapping["rl/ppo"][key]


def test_keys_listed_as_unread_by_the_builtin_engine_are_still_unread() -> None:
    """Each entry of BUILTIN_UNREAD names a real key, and its probe is absent from the step's code: once a step
    reads the key, this fails until the entry goes (and the reference stops saying it has no effect)."""
    catalog = Catalog([ROOT])
    package = ROOT / "src" / "nemotron"
    # A key every step has may be read by the library too (not by the engines, which map it, nor the docs' own code).
    library = "".join(p.read_text() for p in sorted(package.rglob("*.py"))
                      if "engines" not in p.parts and p.name not in ("stepconfig.py", "rlgroups.py", "docgen.py"))  # fmt: skip
    for step_id, entries in BUILTIN_UNREAD.items():
        steps = [s for s in catalog.steps.values() if step_id in ("*", s.id)]
        for key, (_, probe) in entries.items():
            for step in steps:
                keys = {f.key for f in schema_fields(step.config_schema())}
                if step_id == "*" and key not in keys:
                    continue
                assert key in keys, (step.id, key)
                code = step.entry_path.read_text() + (library if step_id == "*" else "")
                assert not re.search(probe, code), (step.id, key)


def _documented_step_runs() -> list[tuple[str, str]]:
    """Every `nemotron steps run ID -c PRESET [k=v ...]` line in README.md and docs/ (not the generated reference)."""
    found = []
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = re.sub(r"\\\n\s*", " ", md.read_text())  # a command continued with a backslash is one line
        for row in text.splitlines():
            if '|| echo "exit' in row:  # shown failing on purpose (a runnable block checks that it runs)
                continue
            # each command of a pipe or an && / || chain on its own, without redirections or a closing $( )
            for line in re.split(r" (?:\|\|?|&&|;) ", row):
                line = re.sub(r"\s\d?>&?\S*", "", line).rstrip(")")
                m = re.search(r"nemotron steps run ([^`#$]\S*[^`#]*)", line)
                if m and "<" not in line and "..." not in line:
                    found.append((md.name, m.group(1).strip()))
    return found


@pytest.mark.parametrize(("doc", "command"), _documented_step_runs())
def test_documented_step_commands_compile(
    doc: str, command: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in re.findall(r"\$\{oc\.env:(\w+)\}", command):  # a variable the page sets before the command
        monkeypatch.setenv(name, "set-by-the-page")
    page = ROOT / "docs" / doc if doc != "README.md" else ROOT / "README.md"
    for block in parse_blocks(page):  # the files the page writes (a preset of the user's, an env.toml)
        if block.file is not None:  # a step's files sit in folders (writing-a-step.md's my-steps/...)
            (tmp_path / block.file).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / block.file).write_text(block.text)
    monkeypatch.chdir(tmp_path)
    args = shlex.split(command.split(" -- ")[0])
    step_id, rest = args[0], args[1:]
    catalog = Catalog([ROOT / "docs" / "examples" / "my-steps", ROOT])
    preset, overrides, i = "default", [], 0
    while i < len(rest):
        a = rest[i]
        if a in ("-c", "--config", "-r", "-b", "--run", "--batch"):
            preset = rest[i + 1] if a in ("-c", "--config") else preset
            i += 2
            continue
        if not a.startswith("-"):
            overrides.append(a)
        i += 1
    compose_config(catalog.get(step_id), preset, overrides)


def test_every_doc_page_is_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"docs/{page.name}" in readme, f"README does not link docs/{page.name}"


def test_readme_gives_the_two_fresh_machine_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "bash scripts/bootstrap.sh && .venv/bin/nemotron pipeline run tiny" in readme
    assert "bash scripts/bootstrap.sh && bash scripts/test.sh" in readme
    ci = (Path(ROOT) / ".ci" / "run").read_text()
    assert "scripts/bootstrap.sh" in ci and "scripts/test.sh" in ci


def test_the_documented_example_step_runs(home: Path, run_cli: object, tmp_path: Path) -> None:
    import json
    import os

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": " ".join(["w"] * n)}) + "\n" for n in (1, 3, 5, 9)))
    env = {"NEMOTRON_STEPS_PATH": str(ROOT / "docs" / "examples" / "my-steps")}
    r = run_cli(
        "steps", "run", "data/filter", "-c", "tiny", f"inputs.prompts={prompts}", env={**os.environ, **env}
    )  # type: ignore[operator]
    assert r.code == 0, r.err
    (out,) = (home / "jobs").glob("*/outputs/prompts.jsonl")
    assert [len(json.loads(x)["prompt"].split()) for x in out.read_text().splitlines()] == [
        1,
        3,
    ]  # max_words: 4
