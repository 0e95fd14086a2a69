"""Preflight: what a cluster job would only find out after it queued, checked at compile time instead, the same for
`--dry-run` and a submit, before anything is written (docs/troubleshooting.md, "Preflight").

- **Parallelism**: tensor x pipeline x context parallel sizes must divide the GPUs of the group they run on, for
  the policy, the critic, the reward model and the generation engine. The groups are each engine's own, with the
  rules it adds: the function `PREFLIGHT_RULES` names for it (nemotron.config.backends, "module:function", imported
  only for a job on that engine) returns them as `EngineChecks`; an engine without one (a data-parallel engine,
  one process per GPU) has nothing to divide.
- **Loadable local inputs**: a Hugging Face checkpoint whose config, safetensors headers (every shard its index
  names) and tokenizer files can be read, and a .nemo whose model config can; read from the files, without torch.
- **Optional record fields the config needs**: a step whose schema has `record_fields_needed()` (eval/policy's
  scorers.math needs the answer of every prompt it evaluates) gets the records it will read of each local JSONL
  input checked for them, naming the first line without one.
- **Prompts that leave no room for a response**: a step whose schema has `prompt_token_limits()` (rl/dpo: prompt
  and response within trainer.max_length) gets each named local JSONL input's prompts counted with the tokenizer of
  the input it names, naming the first line whose prompt alone fills the limit.

Every problem is collected and raised as one UserError (exit 2). Profiles' own numbers (nodes, GPUs and tasks per
node >= 1) are refused where the profile is read (`nemotron.config.profiles`), naming its file and key.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from pydantic import BaseModel

from nemotron.config.backends import PREFLIGHT_RULES, READS_TOKENIZER_JSON_ONLY
from nemotron.config.stepconfig import engine_name
from nemotron.config.workload import holds
from nemotron.errors import UserError
from nemotron.models.layout import CheckpointError, parameter_count, read_config, shape_problems
from nemotron.models.nemo_checkpoint import nemo_model_config
from nemotron.models.prompt_lengths import first_prompt_at_least
from nemotron.models.tokenizer_match import generation_config_problem
from nemotron.tracking.checks import tracking_problems

if TYPE_CHECKING:
    from nemotron.artifacts.binding import Binding
    from nemotron.catalog import Catalog, Manifest
    from nemotron.config.profiles import AnyProfile


# The files a Hugging Face tokenizer loads from (fast tokenizer, SentencePiece, byte-level BPE vocabulary). An
# engine in READS_TOKENIZER_JSON_ONLY loads tokenizer.json only (nemotron.models.checkpoint.load_tokenizer).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


class Group(NamedTuple):
    """One set of GPUs and the model-parallel sizes of what runs on it."""

    who: str  # "policy", "policy and critic", "generation (vLLM)", "reward model", ...
    keys: str  # where the sizes come from, so the user knows what to change
    tensor: int
    pipeline: int
    context: int
    gpus: int  # the group's GPUs in all
    where: str  # how the profile's nodes and GPUs give them, e.g. "1 node × 8 GPUs less the reward model's 1"

    def problem(self, profile: str) -> str | None:
        size = self.tensor * self.pipeline * self.context
        if self.gpus < 1 or self.gpus % size == 0:
            return None  # no GPUs left to a group: the engine's own refusal says which key took them
        return (
            f"{self.who} ({self.keys}): tensor {self.tensor} × pipeline {self.pipeline} × context {self.context} = "
            f"{size} does not divide {self.gpus} GPUs ({self.where}, profile {profile})"
        )


def shape(nodes: int, gpus: int) -> str:
    return f"{nodes} node{'s' * (nodes != 1)} × {gpus} GPU{'s' * (gpus != 1)}"


@dataclass(frozen=True)
class EngineChecks:
    """What an engine's own preflight finds of a job: the problems of its own rules, and the GPU groups it runs
    the job's models on (none on a profile without GPUs), whose sizes `check` divides into their GPUs."""

    problems: list[str] = field(default_factory=list)
    groups: list[Group] = field(default_factory=list)


# An engine's preflight, as PREFLIGHT_RULES names it: (manifest, validated config, bindings, the profile's nodes,
# its GPUs per node: 0 for a profile without GPUs) -> its checks
EngineRules = Callable[["Manifest", BaseModel, Sequence["Binding"], int, int], EngineChecks]


def check(
    catalog: Catalog,
    manifest: Manifest,
    validated: BaseModel,
    profile: AnyProfile,
    bindings: Sequence[Binding],
) -> None:
    """Raise one UserError listing every parallelism problem and every local input that cannot load. `validated`
    is the step's resolved config as its schema validated it (compile); what the rules need to know about the step
    (its engines' recipes, its models) its `manifest` declares."""
    step_id = manifest.step.id
    problems = unloadable_inputs(catalog, validated, bindings) + records_lacking_fields(validated, bindings)
    problems += scorers_run_as_generators(catalog, manifest, validated, bindings)
    problems += prompts_leaving_no_response(validated, bindings)
    nodes, gpus = getattr(profile, "nodes", 1), getattr(profile, "gpus_per_node", 0)
    own = engine_checks(manifest, validated, bindings, nodes, gpus)
    problems += own.problems
    job_env = {k for k, v in profile.env_vars.items() if v} | set(getattr(profile, "secret_vars", None) or {})
    problems += tracking_problems(validated, job_env, inherits_shell=profile.inherits_shell_env)
    problems += [p for g in own.groups if (p := g.problem(profile.name)) is not None]
    if len(problems) == 1:
        raise UserError(problems[0])
    if problems:
        raise UserError(
            f"{len(problems)} problems with '{step_id}', found before anything was written:", problems
        )


def engine_checks(
    manifest: Manifest, config: BaseModel, bindings: Sequence[Binding], nodes: int, gpus: int
) -> EngineChecks:
    """The checks of the engine that runs `config` (its `backend`), found through the registry; none for an engine
    without its own preflight."""
    where = PREFLIGHT_RULES.get(engine_name(config))
    if where is None:
        return EngineChecks()
    module, _, name = where.partition(":")
    rules: EngineRules = getattr(importlib.import_module(module), name)
    return rules(manifest, config, bindings, nodes, gpus)


# ----------------------------------------------------------------------------- local inputs


def unloadable_inputs(catalog: Catalog, config: BaseModel, bindings: Sequence[Binding]) -> list[str]:
    """A problem for each local checkpoint input that its step could not load: the same files the loaders read
    (config.json, every safetensors header, the tokenizer; a .nemo's model config), read without torch. Paths
    that are not here (a remote profile's, or a dry-run's) are left to the cluster."""
    json_only = engine_name(config) in READS_TOKENIZER_JSON_ONLY
    problems = []
    for b in bindings:
        if not b.path or b.kind == "hub":
            continue
        path = Path(b.path)
        try:
            if catalog.is_a(b.expected_type, "checkpoint_hf") and path.is_dir():
                checkpoint_config = read_config(path)
                parameter_count(path)  # every shard the index names is there, and every header reads
                reward_model = catalog.is_a(b.actual_type or b.expected_type, "reward_model_hf")
                shapes = shape_problems(path, checkpoint_config, reward_model)
                if shapes:
                    raise CheckpointError(f"{path}: {'; '.join(shapes)}")
                # a critic's tokenizer is the policy's: a value model tokenizes with the policy's tokenizer
                if not catalog.is_a(b.expected_type, "critic_hf"):
                    wanted = TOKENIZER_FILES[:1] if json_only else TOKENIZER_FILES
                    if not any((path / name).is_file() for name in wanted):
                        raise CheckpointError(
                            f"{path}: no tokenizer ({' or '.join(wanted)}); the checkpoint was saved without it"
                        )
                    disagree = generation_config_problem(path)
                    if disagree:
                        raise CheckpointError(f"{path}: {disagree}; make them agree")
            elif catalog.is_a(b.expected_type, "checkpoint_nemo"):
                nemo_model_config(path)
        except CheckpointError as err:
            problems.append(f"input '{b.name}' ({b.ref}) cannot load: {str(err).removeprefix(f'{path}: ')}")
    return problems


def scorers_run_as_generators(
    catalog: Catalog, manifest: Manifest, config: BaseModel, bindings: Sequence[Binding]
) -> list[str]:
    """A problem for each local input that the step runs as a policy or a generative judge (its [[models]] role,
    where its `when` holds) but that holds a scorer, a reward model or a critic: the step would refuse it on loading,
    after the job was written. (A type cannot say "a causal LM": a reward_model_hf is a checkpoint_hf too.)"""
    scorers = {
        b.name: b
        for b in bindings
        if b.actual_type and any(catalog.is_a(b.actual_type, t) for t in ("reward_model_hf", "critic_hf"))
    }
    generators = [m for m in manifest.models if m.role in ("policy", "judge") and m.input in scorers]
    if not generators:
        return []  # the config is dumped only when a scorer is given where a generator may go
    tree = config.model_dump(mode="json")
    return [
        f"input '{m.input}' ({scorers[m.input].ref}) is a {scorers[m.input].actual_type}, but the step runs it as "
        f"its {m.role}, a causal LM that writes text: give a causal LM's checkpoint"
        for m in {m.input: m for m in generators if holds(m.when, tree)}.values()
    ]


# ----------------------------------------------------------------------------- record fields


def records_lacking_fields(config: BaseModel, bindings: Sequence[Binding]) -> list[str]:
    """A problem for each local JSONL input whose records lack a field the config needs: the schema's
    `record_fields_needed()` maps input names to (fields, why, how many leading records the step reads, 0: all),
    e.g. {"prompts": (["answer"], "scorers.math ...", 16)}. Records past those are never read, so never checked.
    Paths that are not here are left to the step, which checks again."""
    needed = getattr(config, "record_fields_needed", None)
    if needed is None:
        return []
    wants: dict[str, tuple[list[str], str, int]] = needed()
    problems = []
    for b in bindings:
        if b.name not in wants or not b.path or not Path(b.path).is_file():
            continue
        fields, why, used = wants[b.name]
        lacking = first_record_lacking(Path(b.path), fields, used)
        if lacking is not None:
            line, field = lacking
            problems.append(f"input '{b.name}' ({b.ref}): line {line} has no {field!r}; {why}")
    return problems


def first_record_lacking(path: Path, fields: Sequence[str], used: int = 0) -> tuple[int, str] | None:
    """(line number, field) of the first record of a JSONL file without one of `fields` (null counts as absent),
    or None; only the first `used` records (non-blank lines) are read, all when 0. Lines that are not JSON objects
    are left to the record validation that reports them."""
    records = 0
    with path.open(encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            records += 1
            if used and records > used:
                return None
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                missing = [f for f in fields if record.get(f) is None]
                if missing:
                    return number, missing[0]
    return None


# ----------------------------------------------------------------------------- prompt lengths


def prompts_leaving_no_response(config: BaseModel, bindings: Sequence[Binding]) -> list[str]:
    """A problem for each local JSONL input with a prompt that takes the whole token budget the config gives it:
    the schema's `prompt_token_limits()` maps input names to (the limit's key, its value, the input whose
    tokenizer counts), e.g. {"preferences": ("trainer.max_length", 32, "policy")}; a prompt of at least that many
    tokens leaves its response none. Inputs or tokenizers that are not here are left to the step, which checks
    again."""
    limits = getattr(config, "prompt_token_limits", None)
    if limits is None:
        return []
    wants: dict[str, tuple[str, int, str]] = limits()
    local = {b.name: b for b in bindings if b.path}
    problems = []
    for name, (key, limit, counted_by) in wants.items():
        data, tokenizer = local.get(name), local.get(counted_by)
        if data is None or tokenizer is None or not Path(str(data.path)).is_file():
            continue
        over = first_prompt_at_least(Path(str(data.path)), Path(str(tokenizer.path)), limit)
        if over is not None:
            line, tokens = over
            problems.append(
                f"input '{name}' ({data.ref}): line {line}: the prompt takes {tokens} tokens, so with {key}={limit} "
                f"no response token is left; raise {key} or shorten the prompt"
            )
    return problems
