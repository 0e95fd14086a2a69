"""`nemotron pipeline run NAME --dry-run -b PROFILE`: every step compiled, none run, each input bound to the path
its upstream step's job will leave the output at. The cross-engine pipeline (built-in SFT -> NeMo's converter ->
NeMo-Aligner's PPO -> NeMo's converter -> eval/policy) is a golden file (NEMOTRON_UPDATE_GOLDENS=1 rewrites it)."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.assertions import matches_golden

from nemotron.artifacts.store import ArtifactStore
from nemotron.catalog import Catalog
from nemotron.compile import compile_job
from nemotron.config.configtree import get_dotted
from nemotron.core.paths import artifacts_dir, jobs_dir
from nemotron.launch import submit
from nemotron.launch.pipeline import load_pipeline, plan_pipeline, planned_outputs

GOLDEN = Path(__file__).parent / "golden" / "pipeline__cross_engine__slurm_rlhf.txt"
REPO = Path(__file__).resolve().parents[2]
JOB_ID = re.compile(r"\b([a-z0-9_-]+)-\d{8}-\d{6}-[0-9a-f]{4}(?![0-9a-z])")  # new_job_id: a time, 4 hex


def _normalised(text: str, home: Path) -> str:
    for path, name in ((home, "<NEMOTRON_HOME>"), (sys.executable, "<PYTHON>"), (REPO, "<REPO>")):
        text = text.replace(str(path), name)
    return JOB_ID.sub(r"\1-20250101-120000-abcd", text)


def test_cross_engine_dry_run_matches_golden(home: Path, run_cli: Callable[..., Any]) -> None:
    result = run_cli("pipeline", "run", "cross_engine", "--dry-run", "-b", "slurm_rlhf")
    assert result.code == 0, result.err
    text = _normalised(result.out, home)
    matches_golden(text, GOLDEN)
    # the five steps, on the three engines, in order
    headers = re.findall(r"^# ==== pipeline cross_engine, step (\S+): (\S+)$", text, re.M)
    assert headers == [
        ("sft", "sft"),
        ("to_nemo", "convert/hf_to_nemo"),
        ("ppo", "rl/ppo"),
        ("to_hf", "convert/nemo_to_hf"),
        ("eval", "eval/policy"),
    ]
    scripts = ("convert_llama_hf_to_nemo.py", "train_gpt_ppo_actor.py", "convert_llama_nemo_to_hf.py")
    assert all(f"/{script} " in text for script in scripts)
    assert not (home / "jobs").exists()  # nothing written


AT_SCALE = {
    # pipeline -> (step id, step, the engine's script it compiles to) in order
    "cluster": [
        ("sft", "sft", "examples/run_sft.py"),
        ("rm", "rm/train", "examples/run_rm.py"),
        ("rlhf", "rl/rlhf", "examples/run_grpo.py"),
        ("eval", "eval/policy", "examples/run_eval.py"),
    ],
    "aligner": [
        ("sft", "sft", "train_gpt_sft.py"),
        ("rm", "rm/train", "train_reward_model.py"),
        ("reinforce", "rl/reinforce", "train_gpt_reinforce_actor.py"),
        ("ppo", "rl/ppo", "train_gpt_ppo_actor.py"),
    ],
}


@pytest.mark.parametrize("name", list(AT_SCALE))
def test_pipelines_at_scale_compile_in_one_dry_run(
    home: Path, run_cli: Callable[..., Any], name: str
) -> None:
    """The models RL starts from and the RL on one external engine: NeMo-RL (`cluster`) or NeMo-Aligner's .nemo
    chain (`aligner`), every step compiled and planned, each input its upstream step's planned output."""
    result = run_cli("pipeline", "run", name, "--dry-run", "-b", "slurm_rlhf")
    assert result.code == 0, result.err
    text = _normalised(result.out, home)
    matches_golden(text, GOLDEN.with_name(f"pipeline__{name}__slurm_rlhf.txt"))
    headers = re.findall(rf"^# ==== pipeline {name}, step (\S+): (\S+)$", text, re.M)
    assert headers == [(i, s) for i, s, _ in AT_SCALE[name]]
    parts = re.split(r"^# ==== pipeline .*$", text, flags=re.M)[1:]
    for part, (_, _, script) in zip(parts, AT_SCALE[name], strict=True):
        assert (f"{script} " in part and "fits  " in part) or "no model to plan for" in part
    catalog = Catalog()
    pipe = load_pipeline(name, catalog)
    planned = {p.id: p for p in plan_pipeline(pipe, catalog, "slurm_rlhf")}
    for s in pipe.steps:
        keys = {c.name: c.config_key for c in catalog.get(s.step).manifest.consumes}
        for inp, src in s.inputs.items():
            up, _, out = src.partition(".")
            assert get_dotted(planned[s.id].job.step_config, keys[inp]) == planned[up].outputs[out]
    assert not (home / "jobs").exists()


def test_each_input_is_its_upstream_steps_planned_output(home: Path) -> None:
    catalog = Catalog()
    pipe = load_pipeline("cross_engine", catalog)
    planned = {p.id: p for p in plan_pipeline(pipe, catalog, "slurm_rlhf")}
    bound = 0
    for s in pipe.steps:
        keys = {c.name: c.config_key for c in catalog.get(s.step).manifest.consumes}
        for inp, src in s.inputs.items():
            up, _, out = src.partition(".")
            assert get_dotted(planned[s.id].job.step_config, keys[inp]) == planned[up].outputs[out]
            bound += 1
    assert bound == 5
    # the actor's .nemo is where NeMo-Aligner's engine says it registers it from
    assert planned["to_hf"].job.step_config["inputs"]["checkpoint"].endswith("megatron_gpt_ppo_actor.nemo")


def test_planned_outputs_are_where_a_real_step_registers_them(home: Path) -> None:
    """Our own step process's outputs: the planned paths are the ones data/prep really writes and registers."""
    job = compile_job(Catalog(), "data/prep", "tiny")
    _executor, where, launch, _text = submit.plan(job)
    planned = planned_outputs(job, where.job_dir, launch, Catalog())
    assert submit.submit(job) == 0
    registered = {a.name: a.path for a in ArtifactStore(artifacts_dir()).by_job(job.job_id)}
    assert {job.outputs[n][0]: p for n, p in planned.items()} == registered
    assert where.job_dir == str(jobs_dir() / job.job_id)


def test_refusals(home: Path, run_cli: Callable[..., Any]) -> None:
    # -b without --dry-run: a pipeline runs its steps here, one after the other
    result = run_cli("pipeline", "run", "cross_engine", "-b", "slurm_rlhf")
    assert result.code == 2 and "-b/--batch goes with --dry-run" in result.err
    # on this machine the converters cannot run: the dry-run says so for the step that needs them
    result = run_cli("pipeline", "run", "cross_engine", "--dry-run")
    assert result.code == 2 and "convert/hf_to_nemo has no CPU path" in result.err, result.err
    assert not (home / "jobs").exists()
