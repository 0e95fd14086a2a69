"""A NeMo-Aligner v0.7.0 script as one group of a heterogeneous job: `Script` (the script, the tag's YAML it loads,
its Hydra overrides), `AlignerRun` (what a recipe compiles to), Hydra's value syntax, the overrides every script
shares (runtime, optimizer, placement) and the one trainer group of the steps that train one model (`trainer_run`).
The recipes build on it: nemotron.engines.nemo_aligner.config (the RL steps and the reward server), .supervised (sft,
rm/train) and .preference (rl/dpo)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from nemotron.config.stepconfig import Optim, ServeRuntime, TrainRuntime
from nemotron.engines.refusals import Refusals

SCRIPTS = "examples/nlp/gpt"  # under the NeMo-Aligner checkout


@dataclass(frozen=True)
class Script:
    """One group's process: `script` (under the checkout) with Hydra `overrides` (key, value) on `nodes` nodes.
    `waits_for` names (host variable, port variable) of servers the group must reach before it starts."""

    role: str
    script: str
    yaml: str  # the tag's config file the script loads (conf/<yaml>); every override key must exist in it
    overrides: list[tuple[str, Any]]
    nodes: int = 1
    env: dict[str, str] = field(default_factory=dict)  # name -> value (exported, plain text)
    waits_for: tuple[tuple[str, str], ...] = ()

    def words(self) -> list[str]:
        return [f"{key}={hydra_value(value)}" for key, value in self.overrides]


@dataclass(frozen=True)
class AlignerRun:
    groups: list[Script]  # servers first, the actor last
    outputs: dict[str, str]  # our output name -> the .nemo the run leaves
    ports: dict[str, int]  # port variable -> its offset from the job's port, which the executor picks per job
    notes: list[str]
    # the words after the interpreter of a module run once before the trainer (its data files, in the job dir)
    prepare: tuple[str, ...] = ()


# ----------------------------------------------------------------------------- Hydra values


def hydra_value(value: Any) -> str:
    """A Hydra override value: numbers, booleans and plain paths bare, any other string single-quoted (so no
    character of it is grammar), lists and dicts in Hydra's own syntax. `${` is an interpolation only in `Env`."""
    if isinstance(value, Env):
        return value.text
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    return text if _BARE.match(text) and text.lower() not in _KEYWORDS else _quoted(text)


_BARE = re.compile(r"^[A-Za-z/_][A-Za-z0-9/._+@~-]*$")  # a path or a word Hydra reads as this very string
_KEYWORDS = {"true", "false", "null", "nan", "inf"}


def _quoted(text: str) -> str:
    # Hydra's quoted strings: \' is a quote, backslashes before a quote (or the closing one) are doubled, and
    # OmegaConf's \${ keeps a literal ${ from being resolved
    text = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, text)
    return "'" + text.replace("'", "\\'").replace("${", "\\${") + "'"


@dataclass(frozen=True)
class Env:
    """An override value read from the group's environment when NeMo-Aligner resolves its config."""

    name: str
    integer: bool = False

    @property
    def text(self) -> str:
        env = f"${{oc.env:{self.name}}}"
        # Hydra's override grammar reads a bare interpolation only up to its first `}`: a nested one must be a
        # quoted string (whose `${` OmegaConf still resolves; `_quoted` would escape it).
        return f"'${{oc.decode:{env}}}'" if self.integer else env


PRECISION = {"fp32": (32, False), "bf16-mixed": ("bf16", True)}  # -> trainer.precision, model.megatron_amp_O2


def runtime_overrides(rt: TrainRuntime, refuse: Refusals) -> list[tuple[str, Any]]:
    if rt.device == "cpu":
        refuse("runtime.device", "NeMo-Aligner runs on GPUs only")
    if rt.precision not in PRECISION:
        refuse(
            "runtime.precision", "NeMo-Aligner trains in fp32 or bf16 with fp32 master weights (bf16-mixed)"
        )
    if rt.gradient_checkpointing:
        refuse("runtime.gradient_checkpointing", "set activations checkpointing in the .nemo's model config")
    if rt.sharding != "ddp" or rt.fsdp_cpu_offload:
        refuse("runtime.sharding", "NeMo-Aligner shards by Megatron's tensor and pipeline parallelism")
    precision, o2 = PRECISION.get(rt.precision, ("bf16", True))
    return [("trainer.precision", precision), ("model.megatron_amp_O2", o2), ("model.seed", rt.seed)]


def optim_overrides(o: Optim, refuse: Refusals, key: str) -> list[tuple[str, Any]]:
    if o.min_lr_ratio != 1.0:
        refuse(
            f"{key}.min_lr_ratio", "NeMo-Aligner's schedule is cosine (CosineAnnealing), not our linear decay"
        )
    return [
        ("model.optim.lr", o.lr),
        ("model.optim.weight_decay", o.weight_decay),
        ("model.optim.betas", [o.adam_beta1, o.adam_beta2]),
        ("model.optim.sched.warmup_steps", o.warmup_steps),
        ("model.optim.sched.min_lr", o.lr * o.min_lr_ratio),
    ]


def placement(nodes: int, gpus: int) -> list[tuple[str, Any]]:
    return [("trainer.num_nodes", nodes), ("trainer.devices", max(gpus, 1))]


def threads(runtime: TrainRuntime | ServeRuntime) -> dict[str, str]:
    return {"OMP_NUM_THREADS": str(runtime.num_threads)}


def nemo_path(job_dir: str, log_dir: str, name: str) -> str:
    return f"{job_dir}/{log_dir}/checkpoints/{name}.nemo"


def jsonl_from_nemo(model: str, train: str, val: str, max_length: int) -> list[tuple[str, Any]]:
    """What a trainer YAML that starts from a .nemo by pretrained_checkpoint and reads JSONL files takes
    (training_rm.yaml, gpt_dpo.yaml): the .nemo, the train and validation files (validation doubling as test), and
    the sequence length."""
    return [
        ("pretrained_checkpoint.restore_from_path", model),
        ("model.data.data_impl", "jsonl"),
        ("model.data.data_prefix", {"train": [train], "validation": [val], "test": [val]}),
        ("model.data.seq_length", max_length),
    ]


class Trained(Protocol):
    """The config of a step that trains one model (sft, rm/train, rl/dpo): its optimizer and runtime groups."""

    optim: Optim
    runtime: TrainRuntime


def trainer_run(
    c: Trained,
    refuse: Refusals,
    script: str,
    yaml: str,
    overrides: list[tuple[str, Any]],
    nodes: int,
    gpus: int,
    outputs: dict[str, str],
    prepare: tuple[str, ...],
) -> AlignerRun:
    """A recipe that runs one trainer script on every node (sft, rm/train, rl/dpo): the recipe's own `overrides`,
    then those of the config's optimizer and runtime and the placement; `outputs` name the .nemo files it leaves."""
    every = [
        *overrides,
        *optim_overrides(c.optim, refuse, "optim"),
        *runtime_overrides(c.runtime, refuse),
        *placement(nodes, gpus),
    ]
    trainer = Script("trainer", f"{SCRIPTS}/{script}", yaml, every, nodes, threads(c.runtime))
    return AlignerRun([trainer], outputs, {}, [], prepare)
