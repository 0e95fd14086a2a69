"""backend=nemo: convert/hf_to_nemo and convert/nemo_to_hf compiled into NeMo v2.1.0's converter scripts. Every
command line is parsed by a parser built from the scripts' own argparse declarations (nemo_converters_v210.py,
re-read from the real files at the tag when the mirror is here), so a word the script would refuse, or read as
something else than we mean, fails here; families and settings NeMo cannot convert are refused with exit 2."""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.engines import nemo_converters_v210 as tag
from tests.engines.mirrors import git_show

from nemotron.catalog import Catalog
from nemotron.compile import compile_job
from nemotron.engines.base import HetJob
from nemotron.errors import UserError
from nemotron.launch import submit


def _declared(source: str) -> dict[str, dict[str, Any]]:
    """A script's `add_argument` calls as the data file encodes them."""
    found: dict[str, dict[str, Any]] = {}
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            names = [ast.literal_eval(a) for a in node.args]
            keep = ("type", "default", "required", "action")
            spec = {k.arg: ast.unparse(k.value) for k in node.keywords if k.arg in keep}
            found[names[0]] = {"names": names, **spec}
    return found


def _parser(script: str) -> argparse.ArgumentParser:
    """The script's own parser, rebuilt from its declarations (the script itself needs NeMo to import)."""
    parser = argparse.ArgumentParser(prog=script, exit_on_error=False)
    types = {"str": str, "bool": bool}
    for decl in tag.ARGS[script].values():
        kwargs: dict[str, Any] = {}
        if "type" in decl:
            kwargs["type"] = types[decl["type"]]
        if "action" in decl:
            kwargs["action"] = ast.literal_eval(decl["action"])
        if "required" in decl:
            kwargs["required"] = ast.literal_eval(decl["required"])
        try:
            kwargs["default"] = ast.literal_eval(decl.get("default", "None"))
        except ValueError:  # an expression (hparams_file's path beside the script): not ours to check
            pass
        parser.add_argument(*decl["names"], **kwargs)
    return parser


def _launch(step: str, *overrides: str) -> HetJob:
    job = compile_job(
        Catalog(), step, "default", list(overrides), profile_name="local_slurm", mode="batch", dry_run=True
    )
    launch = submit.plan(job)[2]
    assert isinstance(launch, HetJob)
    return launch


def _parsed(launch: HetJob) -> tuple[str, argparse.Namespace]:
    (group,) = launch.groups
    _python, script_path, *args = group.argv
    script = Path(script_path).name
    assert script_path == f"/opt/NeMo/{tag.DIR}/{script}"
    return script, _parser(script).parse_args(args)


@pytest.fixture
def llama(tmp_path: Path, make_tiny_model: Callable[..., Path]) -> Path:
    return make_tiny_model(tmp_path / "llama", "llama")


@pytest.mark.skipif(not tag.MIRROR.is_dir(), reason="the NeMo mirror is not on this machine")
def test_data_matches_the_tag() -> None:
    # the pin: NeMo-Aligner v0.7.0's Dockerfile builds on this NeMo commit, which is the tag v2.1.0
    if tag.ALIGNER_MIRROR.is_dir():
        dockerfile = git_show(tag.ALIGNER_MIRROR, tag.ALIGNER_TAG, "Dockerfile")
        assert re.search(rf"^ARG NEMO_TAG={tag.PINNED_COMMIT}\b", dockerfile, re.M)
    commit = subprocess.run(
        ["git", "-C", str(tag.MIRROR), "rev-parse", f"{tag.TAG}^{{commit}}"], capture_output=True, text=True
    )
    assert commit.stdout.strip() == tag.PINNED_COMMIT
    for script, args in tag.ARGS.items():
        assert _declared(git_show(tag.MIRROR, tag.TAG, f"{tag.DIR}/{script}")) == args, script
        # the image's NeMo (2.2 line) declares every one of them the same way (it may add others)
        later = _declared(git_show(tag.MIRROR, tag.IMAGE_TAG, f"{tag.DIR}/{script}"))
        assert {k: later.get(k) for k in args} == args, (script, tag.IMAGE_TAG)


def test_hf_to_nemo_words_parse_as_meant_by_the_scripts(home: Path, llama: Path) -> None:
    script, args = _parsed(
        _launch("convert/hf_to_nemo", f"inputs.checkpoint={llama}", "convert.llama31=null")
    )
    assert script == "convert_llama_hf_to_nemo.py"
    assert args.input_name_or_path == str(llama) and args.output_path.endswith("/checkpoint.nemo")
    assert args.precision == "bf16"
    # the tiny llama has no RoPE scaling: NeMo's `type=bool` flag must read false, though its default is true
    assert args.llama31 is False
    config = json.loads((llama / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0}
    (llama / "config.json").write_text(json.dumps(config))
    _, args = _parsed(_launch("convert/hf_to_nemo", f"inputs.checkpoint={llama}", "convert.llama31=null"))
    assert args.llama31 is True


@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_each_family_gets_its_script(
    home: Path, tmp_path: Path, make_tiny_model: Callable[..., Path], family: str
) -> None:
    model = make_tiny_model(tmp_path / family, family)
    over = (
        f"inputs.checkpoint={model}",
        "convert.family=null",
        "convert.llama31=null",
        "convert.precision=32",
    )
    script, args = _parsed(_launch("convert/hf_to_nemo", *over))
    assert script == f"convert_{'mistral_7b' if family == 'mistral' else family}_hf_to_nemo.py"
    assert args.precision == "32" and args.input_name_or_path == str(model)
    script, args = _parsed(
        _launch(
            "convert/nemo_to_hf",
            f"inputs.hf_template={model}",
            "convert.family=null",
            "convert.precision=bf16",
        )
    )
    assert script == f"convert_{'mistral_7b' if family == 'mistral' else family}_nemo_to_hf.py"
    if family == "mistral":  # writes the whole directory, tokenizer included, from the template it reads
        assert args.hf_model_name == str(model) and args.output_path.endswith("/checkpoint_hf")
    else:
        assert args.hf_input_path == str(model) and args.hf_output_path.endswith("/checkpoint_hf")


def test_nemo_to_hf_makes_a_whole_directory_with_the_templates_tokenizer(home: Path, llama: Path) -> None:
    launch = _launch("convert/nemo_to_hf", f"inputs.hf_template={llama}", "convert.cpu_only=true")
    script, args = _parsed(launch)
    assert script == "convert_llama_nemo_to_hf.py"
    assert args.input_name_or_path == "/models/ppo_actor.nemo" and args.cpu_only is True
    assert args.precision is None  # the .nemo's own
    # without --hf_input_path and --hf_output_path the script writes bare weights, not a checkpoint directory
    assert args.hf_input_path == str(llama)
    out = dict(launch.outputs)["checkpoint"]
    assert args.hf_output_path == out
    # and no tokenizer (its --input_tokenizer reads sentencepiece only): the template's is copied in after
    shipped = {p.name for p in llama.iterdir() if "token" in p.name or p.name in ("vocab.json", "merges.txt")}
    assert shipped
    for name in shipped:
        assert name in launch.finalize
    home.mkdir(exist_ok=True)
    done = subprocess.run(
        ["bash", "-c", launch.finalize.replace(out, str(home))], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert {p.name for p in home.iterdir()} >= shipped


@pytest.mark.parametrize(
    ("step", "overrides", "says"),
    [
        # the tiny policy is GPT-2: no NeMo converter in either direction
        (
            "convert/hf_to_nemo",
            ["inputs.checkpoint=pkg://tiny/sft_policy", "convert.family=null"],
            "gpt2 checkpoint",
        ),
        (
            "convert/nemo_to_hf",
            ["inputs.hf_template=pkg://tiny/sft_policy", "convert.family=null"],
            "gpt2 checkpoint",
        ),
        # a path on the cluster: the script cannot be picked without the family
        ("convert/hf_to_nemo", ["convert.family=null"], "set convert.family"),
        ("convert/hf_to_nemo", ["convert.llama31=null"], "set convert.llama31"),
        ("convert/hf_to_nemo", ["convert.family=qwen2"], "convert.llama31 acts on family llama only"),
        ("convert/nemo_to_hf", ["convert.family=mistral", "convert.cpu_only=true"], "has no --cpu-only"),
    ],
)
def test_what_nemo_cannot_convert_is_refused(home: Path, step: str, overrides: list[str], says: str) -> None:
    with pytest.raises(UserError, match=re.escape(says)):
        _launch(step, *overrides)


def test_a_readable_checkpoint_must_agree_with_the_keys(home: Path, llama: Path) -> None:
    with pytest.raises(
        UserError, match=r"convert.family=qwen2, but inputs.checkpoint's config.json says llama"
    ):
        _launch(
            "convert/hf_to_nemo", f"inputs.checkpoint={llama}", "convert.family=qwen2", "convert.llama31=null"
        )
    with pytest.raises(UserError, match=r"convert.llama31=true, but .* has no Llama 3.1 RoPE scaling"):
        _launch("convert/hf_to_nemo", f"inputs.checkpoint={llama}")  # the default preset says llama31: true


@pytest.mark.parametrize("preset", ["tiny", "default"])
def test_no_cpu_path_exit_2_nothing_written(
    home: Path, llama: Path, run_cli: Callable[..., Any], preset: str
) -> None:
    given = [] if preset == "tiny" else [f"inputs.checkpoint={llama}", "convert.llama31=false"]
    result = run_cli("steps", "run", "convert/hf_to_nemo", "-c", preset, *given)
    assert result.code == 2
    (line,) = result.err.strip().splitlines()
    assert ("gpt2 checkpoint" if preset == "tiny" else "has no CPU path") in line
    assert not (home / "jobs").exists()


def test_the_slurm_script_registers_after_the_converter_and_the_copy(home: Path, llama: Path) -> None:
    job = compile_job(
        Catalog(), "convert/nemo_to_hf", "default", [f"inputs.hf_template={llama}"],
        profile_name="local_slurm", mode="batch", dry_run=True,
    )  # fmt: skip
    text = submit.dry_run(job)
    script = text[text.index("#!/bin/bash") :]
    convert, copy = script.index("convert_llama_nemo_to_hf.py"), script.index("for f in tokenizer.json")
    register = script.index("-m nemotron.artifacts.lineage")
    assert convert < copy < register
    assert "checkpoint=" + f"{job.job_id}/checkpoint_hf" in script.replace(str(home / "jobs") + "/", "")
