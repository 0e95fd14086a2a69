"""Execution profiles: env.toml tables with `extends`, one strict schema per executor kind, secrets redacted on show.

No `from __future__ import annotations` here: pydantic would evaluate every field's annotation string when each
profile class is defined, a quarter of this module's import on the CLI's start-up path (`python -X importtime`)."""

import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from nemotron.config.configtree import deep_merge, unflatten
from nemotron.core.paths import bundled_root
from nemotron.errors import NotFound, UserError, did_you_mean

# sbatch's --time formats (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) and its words for no limit; --mem's
# SIZE[K|M|G|T] (0: all of a node's memory)
_SLURM_TIME = re.compile(r"\d+(:\d\d?){0,2}|\d+-\d+(:\d\d?){0,2}|unlimited|infinite", re.IGNORECASE)
_SLURM_MEM = re.compile(r"\d+[KMGT]?", re.IGNORECASE)


def _slurm_time(value: str) -> str:
    if not _SLURM_TIME.fullmatch(value.strip()):
        raise ValueError(
            f"{value!r} is not a Slurm time limit: sbatch --time takes MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS"
            " or UNLIMITED"
        )
    return value.strip()


def _slurm_mem(value: str | None) -> str | None:
    if value is not None and not _SLURM_MEM.fullmatch(value.strip()):
        raise ValueError(
            f"{value!r} is not a Slurm memory size: sbatch --mem takes a number with K, M, G or T (64G)"
        )
    return value.strip() if value is not None else None


class _ProfileBase(BaseModel):
    # defer_build: a command reads one profile, so only its executor's schema is built (load_profile), not all three
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True, allow_inf_nan=False)

    name: str = ""
    description: str = ""
    # Config overrides this profile applies (precedence: preset < profile < CLI). Dotted keys allowed.
    config: dict[str, Any] = {}
    env_vars: dict[str, str] = {}
    artifacts_root: str | None = None  # where the artifact store lives (shared storage on clusters)
    inherits_shell_env: ClassVar[bool] = False  # whether the job sees the submitting shell's variables
    # where a served reward model or judge runs beside the step: a process of its own, a node of its own (Slurm:
    # group 0 of a heterogeneous job, nemotron.plan.served), or beside each node's local rank 0 (Lepton)
    serves_on: ClassVar[Literal["process", "node", "rank0"]] = "process"


GpuType = Literal["H100-80GB", "H200", "A100-40GB", "A100-80GB", "L40S"]


class _Progress(_ProfileBase):
    """The progress watch's bounds (runtime/progress.py; docs/cluster.md, "Progress")."""

    # a job whose work stops (no training step, checkpoint or validation ends; for a Ray engine no log line from
    # its driver, or a node Ray declares dead) fails once it is silent past its allowance:
    # max(progress_floor_s, progress_pace_factor x its slowest step so far); 0 turns the progress watch off. The
    # floor is NCCL's own default collective timeout (600 s).
    progress_floor_s: int = Field(default=600, ge=0)
    progress_pace_factor: float = Field(default=5.0, ge=1.0)
    progress_startup_s: int = Field(
        default=1800, ge=1
    )  # from the start to the first step: loading, rendezvous
    progress_checkpoint_s: int = Field(default=1800, ge=1)  # one checkpoint save (a 70B's state is minutes)
    progress_validation_s: int = Field(
        default=1800, ge=1
    )  # one validation pass (generation on held-out prompts)


class LocalProfile(_Progress):
    executor: Literal["local"] = "local"
    # off here by default: a run on this machine is in front of you, and a debugger's breakpoint is not a hang;
    # set it (a CI machine, an unattended box) and a step that stops making progress fails as on a cluster
    progress_floor_s: int = Field(default=0, ge=0)
    # a local job is a child of this shell and inherits its environment; a cluster job gets only env_vars
    inherits_shell_env: ClassVar[bool] = True
    nproc_per_node: int = Field(1, ge=1)  # data-parallel processes (torchrun) on this machine
    cpu_threads: int | None = Field(None, ge=1)


class _Watched(_Progress):
    """The watchdog's bounds, for the executors that run a job on nodes nemotron does not see (docs/cluster.md,
    "Liveness" and "Progress")."""

    # a multi-node job's nodes each touch a heartbeat file this often (Slurm: one srun task per node; Lepton: a
    # Ray node's heartbeat actor for NeMo-RL, the watchdog around each pod's torchrun for the built-in engine); the
    # watchdog fails the job once one is silent longer than heartbeat_timeout_s
    heartbeat_interval_s: int = Field(default=30, ge=1)
    heartbeat_timeout_s: int = Field(default=90, ge=2)


class SlurmProfile(_Watched):
    serves_on: ClassVar[Literal["process", "node", "rank0"]] = "node"
    executor: Literal["slurm"]
    account: str | None = None
    partition: str | None = None
    run_partition: str | None = None  # used by -r (attached)
    batch_partition: str | None = None  # used by -b (batch)
    # refused below 1 here, so `#SBATCH --nodes=0` is never rendered; 0 GPUs is a CPU cluster
    nodes: int = Field(1, ge=1)
    gpus_per_node: int = Field(0, ge=0)
    # what the resource plan checks each GPU's memory against (docs/cluster.md, "The resource plan"): the GPU
    # model, its memory from the plan's table (nemotron.plan.terms.GPU_TYPES), or gpu_memory_gb (GiB per GPU,
    # for a GPU the table lacks; wins over gpu_type)
    gpu_type: GpuType | None = None
    gpu_memory_gb: float | None = Field(None, gt=0)
    ntasks_per_node: int = Field(1, ge=1)
    cpus_per_task: int | None = Field(None, ge=1)
    mem: Annotated[str | None, AfterValidator(_slurm_mem)] = None
    time: Annotated[str, AfterValidator(_slurm_time)] = "01:00:00"
    # seconds before `time` runs out at which Slurm warns the job (`#SBATCH --signal=USR1@N`): a built-in step
    # saves a checkpoint at the end of its current training step and requeues the job, which resumes from it
    # (docs/cluster.md, "Preemption and resume"); 0: no warning
    time_limit_signal_s: int = Field(default=300, ge=0)
    container_image: str | None = None
    mounts: list[str] = []
    setup: list[str] = []
    tunnel: Literal["local", "ssh"] = "local"
    host: str | None = None
    user: str | None = None
    identity: str | None = None
    job_dir: str | None = None  # SSH: where job dirs live on the cluster (NEMOTRON_HOME there is its parent)
    # interpreter on the compute nodes; default: this one (LocalTunnel), `python` in a container, `python3` over SSH
    python: str | None = None
    code_root: str | None = (
        None  # where nemotron's steps/ root is on the cluster (default: the same path as here)
    )
    # backend=nemo_rl runs in this container (default: targets.NEMO_RL_IMAGE, the pinned tag's image);
    # another image must hold the same NeMo-RL tag: the compiled config follows that tag's schema.
    nemo_rl_image: str | None = None
    nemo_rl_dir: str | None = None  # NeMo-RL's checkout inside it (default: targets.NEMO_RL_DIR)
    # backend=nemo_aligner runs in this container (default: targets.NEMO_ALIGNER_IMAGE), its scripts from
    # nemo_aligner_dir (default: targets.NEMO_ALIGNER_DIR); the overrides follow NeMo-Aligner v0.7.0's YAMLs.
    nemo_aligner_image: str | None = None
    nemo_aligner_dir: str | None = None
    # convert/* run NeMo's converter scripts from this checkout inside nemo_aligner_image (the same NeMo that
    # NeMo-Aligner then reads the .nemo with; default: targets.NEMO_DIR)
    nemo_dir: str | None = None


class LeptonMount(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, defer_build=True)
    from_: str = Field(alias="from")
    path: str
    mount_path: str


class LeptonProfile(_Watched):
    serves_on: ClassVar[Literal["process", "node", "rank0"]] = "rank0"
    executor: Literal["lepton"]
    resource_shape: str = "cpu.small"
    node_group: str
    node_reservation: str | None = None
    container_image: str = "nvcr.io/nvidia/nemo:25.07"
    nodes: int = Field(1, ge=1)
    gpus_per_node: int = Field(0, ge=0)
    # what the resource plan checks each GPU's memory against (docs/cluster.md, "The resource plan"): the GPU
    # model, its memory from the plan's table (nemotron.plan.terms.GPU_TYPES), or gpu_memory_gb (GiB per GPU,
    # for a GPU the table lacks; wins over gpu_type)
    gpu_type: GpuType | None = None
    gpu_memory_gb: float | None = Field(None, gt=0)
    shared_memory_size: int = Field(65536, ge=1)
    mounts: list[LeptonMount] = []
    workspace_url: str | None = None  # defaults to $LEPTON_WORKSPACE_URL
    # Where NeMo-Run copies the job on shared storage (default: <first mount>/nemorun); the step's job dir is there.
    nemo_run_dir: str | None = None
    python: str = "python"  # interpreter in the container
    code_root: str | None = (
        None  # where nemotron's steps/ root is in the pod (default: the same path as here)
    )
    setup: list[str] = []  # shell lines run in the pod before the step (e.g. pip install nemotron)
    secret_vars: dict[str, str] = {}  # env var -> name of a Lepton workspace secret holding its value
    image_pull_secrets: list[str] = []
    nemo_rl_image: str | None = None  # as for Slurm
    nemo_rl_dir: str | None = None


AnyProfile = LocalProfile | SlurmProfile | LeptonProfile
Profile = Annotated[AnyProfile, Field(discriminator="executor")]
# each executor's profile schema, so that a profile is validated by its own (the union's errors are the same, less the
# executor in their location, which load_profile drops from the union's)
_BY_EXECUTOR: dict[str, type[AnyProfile]] = {
    "local": LocalProfile,
    "slurm": SlurmProfile,
    "lepton": LeptonProfile,
}


def runs_here(profile: object) -> bool:
    """Whether a profile's jobs run on this machine (the local executor): its paths and RAM are this machine's.
    Asked here, beside the executor -> profile registry, so no module outside it compares executor kinds."""
    return getattr(profile, "executor", "local") == "local"


def serves_beside_rank0(profile: object) -> bool:
    """Whether a reward server shares each node's local rank 0's device (Lepton: reward/sibling.py) instead of
    a node or process of its own."""
    return getattr(profile, "serves_on", "process") == "rank0"


def serves_on_a_node(profile: object) -> bool:
    """Whether a served reward model or judge gets a node of its own (a heterogeneous job's group 0)."""
    return getattr(profile, "serves_on", "process") == "node"


def find_env_file(start: Path | None = None) -> Path | None:
    """$NEMOTRON_ENV_FILE, else the first env.toml walking up from the working directory."""
    env = os.environ.get("NEMOTRON_ENV_FILE")
    if env:
        p = Path(env).expanduser()
        if not p.is_file():
            raise UserError(f"$NEMOTRON_ENV_FILE points to {p}, which does not exist")
        return p
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "env.toml").is_file():
            return d / "env.toml"
    return None


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: not valid TOML: {e}") from None
    bad = [k for k, v in data.items() if not isinstance(v, dict)]
    if bad:
        raise UserError(
            f"{path}: every top-level entry must be a [profile] table", [f"'{k}' is not a table" for k in bad]
        )
    return {name: {**raw, "_file": str(path)} for name, raw in data.items()}


def raw_profiles() -> dict[str, dict[str, Any]]:
    """Shipped templates (profiles/*.toml), then the user's env.toml on top."""
    tables: dict[str, dict[str, Any]] = {}
    for f in sorted((bundled_root() / "profiles").glob("*.toml")):
        tables.update(_read(f))
    env_file = find_env_file()
    if env_file:
        tables.update(_read(env_file))
    return tables


def _resolve_raw(name: str, tables: dict[str, dict[str, Any]], chain: tuple[str, ...] = ()) -> dict[str, Any]:
    if name in chain:
        raise UserError(f"profile '{name}': `extends` cycle: {' -> '.join((*chain, name))}")
    if name not in tables:
        where = f" (extended by '{chain[-1]}')" if chain else ""
        raise NotFound(
            f"unknown profile '{name}'{where}{did_you_mean(name, tables)}",
            hint="List profiles with: nemotron profiles ls",
        )
    raw = dict(tables[name])
    parent = raw.pop("extends", None)
    if "config" in raw:
        raw["config"] = unflatten(raw["config"])
    if parent is None:
        return raw
    base = _resolve_raw(str(parent), tables, (*chain, name))
    base.pop("_file", None)
    return deep_merge(base, raw)


def load_profile(name: str) -> AnyProfile:
    raw = _resolve_raw(name, raw_profiles())
    source = raw.pop("_file", "?")
    raw["name"] = name
    executor = raw.get("executor")
    kind = _BY_EXECUTOR.get(executor) if isinstance(executor, str) else None
    try:
        if kind is not None:
            return kind.model_validate(raw)
        from pydantic import TypeAdapter  # here: only a missing or unknown executor needs the union

        # a missing or unknown executor is the union's to report (which tags it knows)
        validated: AnyProfile = TypeAdapter(Profile).validate_python(raw)
        return validated
    except ValidationError as e:
        problems = []
        for err in e.errors():
            loc = [str(p) for p in err["loc"] if p not in ("local", "slurm", "lepton")]
            # numbers only: a mistyped env_vars value may be a secret
            got = f" (got {err['input']!r})" if type(err["input"]) in (int, float) else ""
            msg = str(err["msg"]).removeprefix("Value error, ")
            if err["type"] == "extra_forbidden" and kind is not None and len(loc) == 1:
                msg = f"unknown key{did_you_mean(loc[0], kind.model_fields)}"
            problems.append(f"{'.'.join(loc) or '(profile)'}: {msg}{got}")
        if len(problems) == 1:
            raise UserError(f"profile '{name}' in {source} is invalid: {problems[0]}") from None
        raise UserError(f"profile '{name}' in {source} is invalid:", problems) from None


def implicit_profile() -> LocalProfile:
    """The profile of a run without -r/-b: `local` as the user's env.toml (or the shipped one) defines it, so its
    config and env_vars apply; reading it also reports a $NEMOTRON_ENV_FILE that does not exist."""
    profile = load_profile("local")
    if not isinstance(profile, LocalProfile):
        raise UserError(
            f"profile 'local' is used when no -r/-b is given, so it must have executor = \"local\" (it has "
            f'"{profile.executor}"); give the cluster profile another name'
        )
    return profile


def list_profiles() -> list[tuple[str, str, str]]:
    """(name, executor, file) for every profile that can be named with -r/-b."""
    out = []
    tables = raw_profiles()
    for name in sorted(tables):
        try:
            executor = str(_resolve_raw(name, tables).get("executor", "local"))
        except UserError:
            executor = "invalid"
        out.append((name, executor, tables[name]["_file"]))
    return out
