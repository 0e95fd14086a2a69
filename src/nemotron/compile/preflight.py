"""Preflight: what a cluster job would only find out after it queued, checked at compile time instead, the same for
`--dry-run` and a submit, before anything is written (docs/troubleshooting.md, "Preflight").

- **Parallelism**: tensor x pipeline x context parallel sizes must divide the GPUs of the group they run on, for
  the policy, the critic, the reward model and the vLLM generation engine. The groups and the rule are each
  engine's own (see `_nemo_rl_groups` and `_nemo_aligner_groups`); the built-in engine is pure data parallel (one
  process per GPU, `nemotron.launch.slurm.plan_slurm`) and takes no parallel sizes (its `nemo_rl.*` keys are
  refused), so it has nothing to divide.
- **Loadable local inputs**: a Hugging Face checkpoint whose config, safetensors headers (every shard its index
  names) and tokenizer files can be read, and a .nemo whose model config can; read from the files, without torch.
- **Optional record fields the config needs**: a step whose schema has `record_fields_needed()` (eval/policy's
  scorers.math needs the answer of every prompt it evaluates) gets the records it will read of each local JSONL
  input checked for them, naming the first line without one.

Every problem is collected and raised as one UserError (exit 2). Profiles' own numbers (nodes, GPUs and tasks per
node >= 1) are refused where the profile is read (`nemotron.config.profiles`), naming its file and key.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import yaml
from pydantic import BaseModel

from nemotron.config.backends import PREFLIGHT_RULES, READS_TOKENIZER_JSON_ONLY
from nemotron.config.stepconfig import engine_name
from nemotron.errors import UserError
from nemotron.models.layout import CheckpointError, parameter_count, read_config, shape_problems
from nemotron.tracking.checks import tracking_problems

if TYPE_CHECKING:
    from nemotron.artifacts.binding import Binding
    from nemotron.catalog import Catalog, Manifest
    from nemotron.config.profiles import AnyProfile
    from nemotron.config.stepconfig import NemoRL


class _NemoRLSizes(Protocol):
    """What NeMo-RL's groups read of a step's `nemo_rl` group (the RL steps' NemoRL, eval/policy's own)."""

    generation_tensor_parallel_size: int


class _RunsOnNemoRL(Protocol):
    @property
    def nemo_rl(self) -> _NemoRLSizes: ...


# The files a Hugging Face tokenizer loads from (fast tokenizer, SentencePiece, byte-level BPE vocabulary). The
# built-in engine loads tokenizer.json only (nemotron.models.checkpoint.load_tokenizer).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
NEMO_MODEL_CONFIG = "model_config.yaml"  # inside a .nemo tar (NeMo's NLPSaveRestoreConnector)


@dataclass(frozen=True)
class Group:
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
    engine = engine_name(validated)
    if engine in PREFLIGHT_RULES:  # the engine's own rules, found through the registry
        module, _, name = PREFLIGHT_RULES[engine].partition(":")
        problems += getattr(importlib.import_module(module), name)(manifest, validated, bindings)
    job_env = {k for k, v in profile.env_vars.items() if v} | set(getattr(profile, "secret_vars", None) or {})
    problems += tracking_problems(validated, job_env, inherits_shell=profile.inherits_shell_env)
    problems += [
        p
        for g in parallel_groups(manifest, validated, profile, bindings)
        if (p := g.problem(profile.name)) is not None
    ]
    if len(problems) == 1:
        raise UserError(problems[0])
    if problems:
        raise UserError(
            f"{len(problems)} problems with '{step_id}', found before anything was written:", problems
        )


# ----------------------------------------------------------------------------- parallelism


def parallel_groups(
    manifest: Manifest, config: BaseModel, profile: AnyProfile, bindings: Sequence[Binding]
) -> list[Group]:
    """The GPU groups of the job on this profile; none on a profile without GPUs (the engines already note that
    their workers need GPUs, and the local profile refuses the cluster engines outright) or on the built-in engine,
    which is data parallel only: one process per GPU (nemotron.launch.slurm.plan_slurm), nothing to divide."""
    nodes, gpus = getattr(profile, "nodes", 1), getattr(profile, "gpus_per_node", 0)
    if gpus < 1:
        return []
    engine = engine_name(config)
    groups = _GROUPS.get(engine)
    return groups(manifest, engine, config, bindings, nodes, gpus) if groups is not None else []


def _nemo_rl_groups(
    manifest: Manifest, engine: str, config: BaseModel, bindings: Sequence[Binding], nodes: int, gpus: int
) -> list[Group]:
    """NeMo-RL v0.7.0's rule: the policy's (and the PPO value model's) Ray cluster must have a world size that is a
    multiple of PP * CP * TP (nemo_rl/models/policy/lm_policy.py:174-212 at v0.7.0; DTensor has no PP, :162), and
    vLLM's TP * PP must divide the same, colocated, cluster (nemo_rl/models/generation/vllm/vllm_generation.py:110).
    The policy cluster is what the reward model's workers leave: a one-node job gives them reward_model_gpus of
    its GPUs, a larger one a node of its own (nemo_rl/algorithms/grpo.py:520-590, ppo.py:380-415; our mapping:
    nemotron.engines.nemo_rl.sections.reward_model_resources). The reward model itself runs DTensor at TP 1 CP 1
    (nemo_rl.sections.reward_model_env)."""
    from nemotron.engines.nemo_rl.evaluation import RECIPE as EVAL
    from nemotron.engines.nemo_rl.steps import RECIPES

    recipe = manifest.step.engines.get(engine, "")
    if recipe == EVAL:  # NeMo-RL's eval: one vLLM engine per TP group over every GPU (eval.py setup)
        tp = cast("_RunsOnNemoRL", config).nemo_rl.generation_tensor_parallel_size
        keys = "nemo_rl.generation_tensor_parallel_size"
        return [Group("generation (vLLM)", keys, tp, 1, 1, nodes * gpus, shape(nodes, gpus))]
    if recipe not in RECIPES:
        return []  # the engine refuses the step itself
    from nemotron.engines.nemo_rl.sections import reward_model_resources

    # an RL recipe's Config has the RL steps' NemoRL group; NeMo-Gym's judge (env.should_use_nemo_gym) replaces
    # the reward model's workers
    nemo: NemoRL = getattr(config, "nemo_rl")  # noqa: B009 (a step Config, read by name)
    gym = bool(getattr(getattr(config, "env", None), "should_use_nemo_gym", False))
    megatron = nemo.policy_backend == "megatron"
    tp, cp = nemo.tensor_parallel_size, nemo.context_parallel_size
    # DTensor takes no PP (lm_policy.py:162); dtensor with pipeline_parallel_size > 1 is refused by the engine
    pp = nemo.pipeline_parallel_size if megatron else 1
    groups: list[Group] = []
    policy_gpus, where = nodes * gpus, shape(nodes, gpus)
    if not gym:
        rm = reward_model_resources(nodes, gpus, nemo.reward_model_gpus)
        rm_gpus = rm["num_nodes"] * rm["gpus_per_node"]
        if nodes == 1:
            policy_gpus, where = gpus - rm_gpus, f"{where} less the reward model's {rm_gpus}"
        else:
            policy_gpus, where = (nodes - 1) * gpus, f"{where} less the reward model's node"
        rm_where = f"nemo_rl.reward_model_gpus of {shape(nodes, gpus)}"
        groups.append(Group("reward model", "DTensor, fixed", 1, 1, 1, rm_gpus, rm_where))
    who = "policy and critic" if any(m.role == "critic" for m in manifest.models) else "policy"
    pp_key = "nemo_rl.pipeline_parallel_size, " if megatron else ""
    sizes = f"nemo_rl.tensor_parallel_size, {pp_key}nemo_rl.context_parallel_size"
    gen_tp = nemo.generation_tensor_parallel_size
    return [
        Group(who, sizes, tp, pp, cp, policy_gpus, where),
        Group(
            "generation (vLLM)", "nemo_rl.generation_tensor_parallel_size", gen_tp, 1, 1, policy_gpus, where
        ),
        *groups,
    ]


def _nemo_aligner_groups(
    manifest: Manifest, _engine: str, _config: BaseModel, bindings: Sequence[Binding], nodes: int, gpus: int
) -> list[Group]:
    """NeMo-Aligner v0.7.0 takes the model-parallel sizes from the .nemo's own model_config.yaml (its scripts merge
    the YAML's `model` over it: examples/nlp/gpt/train_gpt_ppo_actor.py:58, nemo_aligner/utils/utils.py:260
    load_and_override_model_config; the tag's YAMLs set no tensor/pipeline size), and Megatron needs the group's
    trainer.num_nodes x trainer.devices to be a multiple of TP x PP x CP (data parallel = world / model parallel,
    as examples/nlp/synthetic_data_gen/compute_topk_logits.py:101 computes it). The groups are our het job's
    (nemotron.engines.nemo_aligner.config): each server one node, the actor the nodes left (at least one); a
    step that only serves its model serves it on every node. Which inputs they load, the manifest's [[models]]
    say."""
    by_name = {b.name: b for b in bindings}
    trained = [m for m in manifest.models if m.trained]
    actor = next((m for m in trained if m.reference), None)
    critic = any(m.role == "critic" for m in trained)
    servers = [m for m in manifest.models if not m.trained]
    places: list[tuple[str, int, bool]] = []  # (input, nodes, whether it is the actor)
    if actor is not None:
        places.append((actor.input, max(1, nodes - 1 - critic), True))
        places += [(m.input, 1, False) for m in servers[:1]]
    else:
        places += [(m.input, nodes, False) for m in servers[:1]]
    groups = []
    for name, group_nodes, is_actor in places:
        b = by_name.get(name)
        sizes = _nemo_parallel_sizes(Path(b.path)) if b is not None and b.path else None
        if b is None or sizes is None:
            continue
        tp, pp, cp = sizes
        keys = f"{b.ref}'s {NEMO_MODEL_CONFIG}"
        where = f"{shape(group_nodes, gpus)} of the profile's {shape(nodes, gpus)}"
        if is_actor:
            groups.append(Group("actor (policy)", keys, tp, pp, cp, group_nodes * gpus, where))
        else:
            groups.append(Group("reward model server", keys, tp, pp, cp, group_nodes * gpus, where))
            if critic:  # the critic restores from the reward model (serve_ppo_critic.py)
                critic_where = f"{shape(1, gpus)} of the profile's {shape(nodes, gpus)}"
                groups.append(Group("critic server", keys, tp, pp, cp, gpus, critic_where))
    return groups


# engine -> its GPU groups; the built-in engine is data parallel only, with nothing to divide
_GROUPS = {"nemo_rl": _nemo_rl_groups, "nemo_aligner": _nemo_aligner_groups}


def _nemo_parallel_sizes(path: Path) -> tuple[int, int, int] | None:
    """(tensor, pipeline, context) from a local .nemo's model config; None when it is not here or not readable
    (unloadable_inputs reports the latter)."""
    try:
        config = _nemo_model_config(path)
    except CheckpointError:
        return None
    if config is None:
        return None
    return tuple(  # type: ignore[return-value]
        int(config.get(f"{k}_parallel_size") or 1) for k in ("tensor_model", "pipeline_model", "context")
    )


def _nemo_model_config(path: Path) -> dict[str, Any] | None:
    """The model config of a .nemo file (a tar, its members read one header at a time until model_config.yaml);
    None when `path` is not a local file. A file that is not such a tar raises CheckpointError."""
    if not path.is_file():
        return None
    import tarfile  # here: only a .nemo input is read, and a dry run's start-up counts

    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                if Path(member.name).name == NEMO_MODEL_CONFIG and member.isfile():
                    handle = tar.extractfile(member)
                    data = yaml.safe_load(handle.read()) if handle is not None else None
                    if not isinstance(data, dict):
                        raise CheckpointError(f"{path}: {NEMO_MODEL_CONFIG} is not a mapping")
                    return data
    except (OSError, tarfile.TarError, yaml.YAMLError, EOFError) as err:
        raise CheckpointError(
            f"{path}: not a readable .nemo (a tar holding {NEMO_MODEL_CONFIG}): {err}"
        ) from err
    raise CheckpointError(f"{path}: not a .nemo checkpoint (no {NEMO_MODEL_CONFIG} inside)")


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
                # a critic's tokenizer is the policy's: NeMo-RL's value model and our PPO tokenize with the policy
                if not catalog.is_a(b.expected_type, "critic_hf"):
                    wanted = TOKENIZER_FILES[:1] if json_only else TOKENIZER_FILES
                    if not any((path / name).is_file() for name in wanted):
                        raise CheckpointError(
                            f"{path}: no tokenizer ({' or '.join(wanted)}); the checkpoint was saved without it"
                        )
            elif catalog.is_a(b.expected_type, "checkpoint_nemo"):
                _nemo_model_config(path)
        except CheckpointError as err:
            problems.append(f"input '{b.name}' ({b.ref}) cannot load: {str(err).removeprefix(f'{path}: ')}")
    return problems


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
