"""Small defects a new user met: docgen's --help wrote a file named --help; `profiles show` printed JSON where every
other `show` prints a table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nemotron.catalog import load_schema
from nemotron.errors import UserError


def test_docgen_help_is_help_not_a_file_named_help(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "nemotron.docs.generate", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and "usage: python -m nemotron.docs.generate" in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_profiles_show_is_a_table_and_json_on_request(home: Path, run_cli: Any) -> None:
    table = run_cli("profiles", "show", "local_slurm")
    assert table.code == 0 and "┃ field" in table.out and "partition" in table.out
    shown = json.loads(run_cli("profiles", "show", "local_slurm", "--json").out)
    assert shown["executor"] == "slurm" and shown["partition"] == "debug"


def test_every_command_help_shows_an_example_and_the_exit_codes(home: Path, run_cli: Any) -> None:
    """Plain help (no rich panels), each command's example whole on one line as it is typed (click rewraps a
    paragraph, and cut `--dry-run` after `--dry-`), and each group's listing of its commands uncut (click ends a
    summary longer than the line with "...")."""
    import typer.main

    from nemotron.cli.app import with_groups
    from nemotron.cli.help import summary

    group = typer.main.get_command(with_groups())
    for name, sub in group.commands.items():  # type: ignore[attr-defined]
        listing = run_cli(name, "--help").out
        for cmd, command in getattr(sub, "commands", {name: sub}).items():
            args = [name, cmd, "--help"] if hasattr(sub, "commands") else [name, "--help"]
            shown = run_cli(*args)
            assert (
                shown.code == 0 and "Example: nemotron" in shown.out and "Exit codes: 0 done" in shown.out
            ), args
            assert len(shown.out.splitlines()) <= 40, f"{args}: help longer than a screen"
            (example,) = [line for line in command.epilog.splitlines() if line.startswith("Example: ")]
            assert f"  {example}" in shown.out.splitlines(), (args, shown.out)
            assert not {"╭", "│", "─"} & set(shown.out), (args, shown.out)
            (listed,) = [line for line in listing.splitlines() if line.startswith(f"  {cmd}  ")]
            assert not listed.endswith("..."), listed
            # registered through cli.help.command: the listing's summary is the docstring's first paragraph
            assert command.short_help == summary(command.callback), args


def test_the_help_is_the_same_on_a_terminal_and_in_a_pipe(home: Path, run_cli: Any) -> None:
    """Plain click help: nothing differs where rich would colour and box it ($FORCE_COLOR, $TTY_COMPATIBLE make rich
    treat a pipe as a terminal), and bare `nemotron` prints the same help as `nemotron --help`."""
    piped = run_cli("--help")
    assert piped.code == 0 and piped.out.startswith("Usage: nemotron [OPTIONS] COMMAND"), piped.out
    assert "  steps      Browse and run steps." in piped.out.splitlines(), piped.out
    for env in ({"FORCE_COLOR": "1"}, {"TTY_COMPATIBLE": "1"}):
        assert run_cli("--help", env=env).out == piped.out, env
    assert run_cli().out == piped.out
    step = run_cli("steps", "run", "--help")
    assert run_cli("steps", "run", "--help", env={"FORCE_COLOR": "1"}).out == step.out
    assert "`defaults: [tiny]`" in step.out, step.out  # rich markup would have taken [tiny] for a style


def test_steps_show_prints_manifest_text_as_written(home: Path, tmp_path: Path, run_cli: Any) -> None:
    """A manifest's text is no rich markup: `[...]` and `:name:` print as written, on a terminal (FORCE_COLOR) too,
    where the step id is still styled."""
    (tmp_path / "manifests" / "user").mkdir(parents=True)
    text = "keep [bold]this[/bold] and [x] and :smile: as written"
    (tmp_path / "manifests" / "user" / "s.toml").write_text(f"""[step]
id = "user/s"
name = "n [red]"
description = "{text}"
category = "test"

[[produces]]
name = "out"
type = "prompt_jsonl"
description = "{text}"

[[strategies]]
when = "w [dim]"
then = "{text}"

[[errors]]
name = "e [i]"
recovery = "{text}"
""")
    env = {"NEMOTRON_STEPS_PATH": str(tmp_path)}
    for extra in ({}, {"FORCE_COLOR": "1"}):
        r = run_cli("steps", "show", "user/s", env={**env, **extra})
        assert r.code == 0, r.err
        assert r.out.count(text) == 4, r.out  # description, artifact, strategy, known error
        assert "n [red]" in r.out and "w [dim]" in r.out and "e [i]" in r.out, r.out
    assert "\x1b[1;36muser/s\x1b[0m" in r.out, r.out


def test_tables_are_not_cut_when_piped(home: Path) -> None:
    """Piped (no terminal, no COLUMNS), rich would cut every table at 80 columns with "…"."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    done = subprocess.run([sys.executable, "-m", "nemotron", "steps", "list"], capture_output=True, text=True,
                          env=env, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) > 80  # the descriptions are whole


def test_a_dry_run_warns_about_absent_inputs_where_a_run_refuses_them(home: Path, run_cli: Any) -> None:
    r = run_cli("steps", "run", "rl/ppo", "-c", "default", "--dry-run")
    assert r.code == 0, r.err
    assert (
        "warning: input 'policy': /models/sft_policy does not exist here; running this job would refuse it"
        in r.out
    )
    r = run_cli("steps", "run", "rl/ppo", "-c", "default")
    assert r.code == 2 and "'/models/sft_policy' is neither an existing path nor an artifact" in r.err
    assert not (home / "jobs").exists() or not list((home / "jobs").iterdir())


def test_vllm_only_keys_are_refused_where_they_would_do_nothing(home: Path, run_cli: Any) -> None:
    r = run_cli("steps", "run", "rl/reinforce", "-c", "tiny", "generation.vllm_max_model_len=32", "--dry-run")
    assert r.code == 2 and "act only with backend: vllm" in r.err and "Traceback" not in r.err
    r = run_cli("steps", "run", "rl/rlhf", "-c", "tiny", "judge.kind=generative", "judge.server=vllm",
                "judge.url=http://127.0.0.1:9", "--dry-run")  # fmt: skip
    assert r.code == 2 and "set one of them" in r.err


def test_an_import_of_a_moved_module_is_one_clear_line(tmp_path: Path) -> None:
    """A user's step or schema written before the package root was regrouped: exit 2 naming the new module, no
    traceback; any other ImportError is left as it is."""
    step = tmp_path / "step.py"
    step.write_text("from nemotron.runtime import StepRun\n")
    env = {k: v for k, v in os.environ.items() if k != "NEMOTRON_WARM"}
    done = subprocess.run([sys.executable, "-m", "nemotron.run_step", str(step)], capture_output=True, text=True,
                          env=env, timeout=120)  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "`nemotron.runtime` is now `nemotron.runtime.step`" in done.stderr
    schema = tmp_path / "old" / "schema.py"
    schema.parent.mkdir()
    schema.write_text("from nemotron.stepconfig import Strict\n\nclass Config(Strict):\n    pass\n")
    with pytest.raises(UserError, match=r"`nemotron.stepconfig` is now `nemotron.config.stepconfig`"):
        load_schema(schema)
    other = tmp_path / "other" / "schema.py"
    other.parent.mkdir()
    other.write_text("import nemotron_no_such_module\n")
    with pytest.raises(ModuleNotFoundError):
        load_schema(other)


def test_steps_list_names_each_type_a_step_reads_once(home: Path, run_cli: Any) -> None:
    """rl/dpo reads a policy and a reference (checkpoint_hf), and training and validation preferences."""
    listed = run_cli("steps", "list", "--consumes", "preference_jsonl")
    (dpo,) = [line for line in listed.out.splitlines() if line.startswith("rl/dpo ")]
    assert "checkpoint_hf, preference_jsonl → checkpoint_hf" in dpo, dpo
