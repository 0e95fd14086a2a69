"""Compile rl/rlhf, rl/reinforce and rl/ppo configs into NeMo-RL v0.7.0 runs: config tree, files, commands.

Pure: a validated step config in, a `NemoRLRun` out. Every key of our schemas is mapped to a NeMo-RL key, has
no effect there (documented in docs/nemo-rl.md), or is refused when set to a value NeMo-RL cannot express; all
refusals are raised together as one UserError."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from nemotron.config.targets import NEMO_RL_DIR, NEMO_RL_VERSION
from nemotron.engines import data_files
from nemotron.engines.base import recipe_for
from nemotron.engines.nemo_rl import evaluation, supervised, to_safetensors
from nemotron.engines.nemo_rl import sections as sec
from nemotron.engines.nemo_rl.steps import RECIPES, compile_step
from nemotron.engines.refusals import Refusals
from nemotron.engines.remote_tracking import RunLabels, Tracked, nemo_rl_logger
from nemotron.errors import UserError
from nemotron.plan.placement import Placement

CONFIG_FILE = "nemo_rl_config.yaml"
TO_SAFETENSORS = "to_safetensors.py"  # engines/nemo_rl/to_safetensors.py in the job dir


@dataclass(frozen=True)
class NemoRLRun:
    entry: str  # script relative to the NeMo-RL dir, e.g. "examples/run_grpo.py"
    config: dict[
        str, Any
    ]  # the NeMo-RL config: the tag's example YAML (`defaults:`) + our keys; data/env owned whole
    config_file: str  # file name in the job dir
    files: dict[str, str]  # every file to write into the job dir before launch (name -> text)
    driver: str  # run once on the Ray head
    finalize: str  # run after the driver succeeds: newest checkpoint -> HF checkpoints at `outputs`
    outputs: dict[str, str]  # our output name ([[produces]] name) -> absolute HF checkpoint path


def _yaml(tree: dict[str, Any], title: str) -> str:
    return f"# {title}\n" + yaml.safe_dump(tree, sort_keys=False, allow_unicode=True)


def compile_run(
    step_id: str,
    config: BaseModel,
    where: Placement,
    *,
    nemo_rl_dir: str = NEMO_RL_DIR,
    labels: RunLabels | None = None,
) -> NemoRLRun:
    """Our resolved step config (compile's validated config, input refs already paths: `Job.step_model`) -> the
    NeMo-RL run, for the job dir, nodes and GPUs per node the executor gives (`where`). Raises one UserError listing
    every setting NeMo-RL cannot express. `labels` name the tracker runs (default: the job dir's name, no
    profile variables)."""
    job_dir, nodes, gpus_per_node = where.job_dir, where.nodes, where.gpus_per_node
    recipe = recipe_for(step_id, "nemo_rl", "NeMo-RL mapping")
    if recipe not in (*RECIPES, evaluation.RECIPE):
        raise UserError(
            f"{step_id}: engines.nemo_rl = {recipe!r} is no NeMo-RL recipe; it has {', '.join(RECIPES)}, {evaluation.RECIPE}"
        )
    refuse = Refusals.of(
        step_id,
        config,
        engine=f"backend=nemo_rl (NeMo-RL {NEMO_RL_VERSION})",
        hint="Change them, or run with backend=builtin. docs/nemo-rl.md lists every key's mapping.",
    )
    if recipe == evaluation.RECIPE:
        if not isinstance(config, evaluation.EvalConfig):
            raise TypeError(f"{step_id}: its Config lacks a group NeMo-RL's eval reads")
        evaluated = evaluation.compile_eval(config, refuse, job_dir, nodes, gpus_per_node)
        refuse.raise_any()
        return _eval_run(step_id, evaluated, nemo_rl_dir, job_dir)
    compiled = compile_step(recipe, config, refuse, job_dir, nodes, gpus_per_node)
    # every RL step's schema has the tracking group (stepconfig.RLConfig, rl/rlhf's Config)
    if not isinstance(config, Tracked):
        raise TypeError(f"{step_id}: its Config has no tracking group, which every NeMo-RL recipe's has")
    logger, env = nemo_rl_logger(config.tracking, refuse, labels or RunLabels.from_job_dir(job_dir, step_id))
    refuse.raise_any()
    tree = {"defaults": f"{nemo_rl_dir}/{compiled.base}", **compiled.config}
    tree["logger"] = {**tree["logger"], **logger}
    config_path = f"{job_dir}/{CONFIG_FILE}"
    title = f"NeMo-RL {NEMO_RL_VERSION} config compiled by nemotron from {step_id}"
    files = {CONFIG_FILE: _yaml(tree, title)}
    files.update(
        {name: _yaml(t, f"converter config for {step_id}") for name, t in compiled.extra_files.items()}
    )
    prepare = []
    if (
        compiled.prepare
    ):  # the data step: nemotron.engines.data_files, shipped as a file (NeMo-RL's image has no nemotron)
        files[supervised.DATA_FILES] = Path(data_files.__file__).read_text()
        script = f"{job_dir}/{supervised.DATA_FILES}"
        prepare = [sec.python_command(nemo_rl_dir, script, compiled.prepare)]
    outputs = {name: f"{job_dir}/outputs/{name}" for _, _, name in compiled.conversions}
    conversions = [
        (component, f"{job_dir}/{cfg}" if cfg else None, outputs[name])
        for component, cfg, name in compiled.conversions
    ]
    checkpoint_dir = tree["checkpointing"]["checkpoint_dir"]  # of the tree compiled here, not the step config
    if conversions and not compiled.megatron:  # the DCP converter's pickle as safetensors, shipped as a file
        files[TO_SAFETENSORS] = Path(to_safetensors.__file__).read_text()
    return NemoRLRun(
        entry=compiled.entry,
        config=tree,
        config_file=CONFIG_FILE,
        files=files,
        driver=" && ".join([*prepare, sec.driver_command(nemo_rl_dir, compiled.entry, config_path, env)]),
        finalize=sec.finalize_command(
            nemo_rl_dir, checkpoint_dir, compiled.megatron, conversions, f"{job_dir}/{TO_SAFETENSORS}"
        ),
        outputs=outputs,
    )


def _eval_run(step_id: str, compiled: evaluation.CompiledEval, nemo_rl_dir: str, job_dir: str) -> NemoRLRun:
    """An eval run: the prompts prepared in the job dir, then the tag's eval entry; no checkpoint to convert
    (its output, evaluation_data.json, becomes our eval_report when it is registered)."""
    tree = {"defaults": f"{nemo_rl_dir}/{evaluation.BASE}", **compiled.config}
    title = f"NeMo-RL {NEMO_RL_VERSION} eval config compiled by nemotron from {step_id}"
    files = {CONFIG_FILE: _yaml(tree, title), **compiled.files}
    driver = sec.driver_command(nemo_rl_dir, evaluation.ENTRY, f"{job_dir}/{CONFIG_FILE}")
    return NemoRLRun(
        entry=evaluation.ENTRY,
        config=tree,
        config_file=CONFIG_FILE,
        files=files,
        driver=f"{compiled.prepare} && {driver}",
        finalize="",
        outputs=compiled.outputs,
    )
