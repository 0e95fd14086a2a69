"""Slurm: a compiled Job as a plan (pure): the groups to srun, the paths as the cluster sees them, the profile's
time, place, container and environment. `slurm_script` renders a plan and submits it."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

from nemotron.compile import Job
from nemotron.config.profiles import SlurmProfile
from nemotron.core.paths import bundled_root
from nemotron.errors import UserError
from nemotron.launch import containers, step_process
from nemotron.launch.nemo_run_layout import Experiment, srun_log
from nemotron.plan.served import ServedModel
from nemotron.reward.bind import TOKEN_ENV as REWARD_TOKEN_ENV

JOB_NAME_PREFIX = "nemotron."
SECRETS_FILE = ".secrets.env"
READY_FILE = "logs/reward_server.json"
READY_TIMEOUT_S = 3600  # loading a large reward model can take minutes
REWARD_PORT_ENV = "NEMOTRON_REWARD_PORT"
REWARD_URL_ENV = "NEMOTRON_REWARD_URL"
RDZV_HOST_ENV = "NEMOTRON_RDZV_HOST"
SBATCH_COMMAND = ("sbatch", "--requeue", "--parsable")
RUNDIR = (
    "/nemo_run"  # NeMo-Run's name for the job dir inside a container; replaced by the real dir without one
)
# NeMo-Run's ExecutorMacros: `$name` in args and env values becomes the shell variable's name.
MACROS = {
    "head_node_ip_var": "head_node_ip",
    "nproc_per_node_var": "SLURM_NTASKS_PER_NODE",
    "num_nodes_var": "SLURM_NNODES",
    "node_rank_var": "SLURM_NODEID",
    "het_group_host_var": "het_group_host",
}
# SlurmSite's fields that NeMo-Run's SlurmExecutor takes under the same name
EXECUTOR_FIELDS = ("account", "partition", "time", "cpus_per_task", "mem", "container_image", "signal")


class ClusterPaths(NamedTuple):
    """Where the job's files live as the compute nodes see them (the same paths as here with a LocalTunnel)."""

    home: str  # NEMOTRON_HOME on the cluster
    job_dir: str  # the step's job dir
    artifacts_root: str
    nemorun_jobs: str  # NeMo-Run's experiments root (its tunnel's job_dir)
    python: str  # interpreter on the compute nodes, as a shell word
    code: tuple[str, str] | None = None  # (root here, root there) of the steps' code, when they differ


class Command(NamedTuple):
    """What NeMo-Run's `Script(path, args, entrypoint, m)` runs: `entrypoint [-m] path args...` (args are shell words)."""

    entrypoint: str
    path: str
    args: tuple[str, ...] = ()
    module: bool = False

    def words(self) -> list[str]:
        return [self.entrypoint, *(["-m"] if self.module else []), self.path, *self.args]


class SrunGroup(NamedTuple):
    """One srun of the job; several make a heterogeneous job (group i runs on its own nodes)."""

    role: str  # NeMo-Run role name; its log is log-nemotron.<role>_<slurm id>_0.out
    command: Command
    nodes: int = 1
    ntasks_per_node: int = 1
    gpus_per_node: int | None = None
    env: tuple[tuple[str, str], ...] = ()  # exported before this group's srun; values are shell words


@dataclass(frozen=True, kw_only=True)
class SlurmSite:
    """What every sbatch script of a job takes from its profile (`shared_fields`): time and place, the container
    and its mounts, the exported environment and the setup lines."""

    time: str
    account: str | None = None
    partition: str | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    container_image: str | None = None
    mounts: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # exported for every group; values are shell words
    setup: tuple[str, ...] = ()
    secret_names: tuple[str, ...] = ()  # variables the 0600 secrets file exports (names only)
    # `#SBATCH --signal`: Slurm's warning before the time limit (`USR1@300`), for jobs whose every process
    # survives it (our own steps: nemotron.runtime.preempt); None for engines that would die of it
    signal: str | None = None

    def executor_args(self) -> dict[str, Any]:
        """The keyword arguments of NeMo-Run's SlurmExecutor that the site sets."""
        same = {name: getattr(self, name) for name in EXECUTOR_FIELDS}
        return same | {"container_mounts": list(self.mounts), "setup_lines": "\n".join(self.setup) or None}


@dataclass(frozen=True, kw_only=True)
class SlurmPlan(SlurmSite):
    """Everything the sbatch script depends on: the one input of both `render_sbatch` and `submit_plan`."""

    job_id: str
    task: str  # NeMo-Run task name (the step id, '/' -> '-')
    groups: tuple[SrunGroup, ...]
    paths: ClusterPaths
    notes: tuple[str, ...] = ()  # what --dry-run says about the plan besides the script

    @property
    def heterogeneous(self) -> bool:
        return len(self.groups) > 1

    @property
    def experiment(self) -> Experiment:
        return Experiment(self.paths.nemorun_jobs, self.job_id)

    @property
    def task_dir(self) -> str:
        return self.experiment.task_dir(self.task)

    def log_path(self, role: str) -> str:
        """The srun output of one group (`%j` is the Slurm job id), as one shell word whatever the path holds
        (nemo_run_slurm.QuotedJobDetails gives NeMo-Run the same text)."""
        return srun_log(self.task_dir, f"{JOB_NAME_PREFIX}{role}")


# ----------------------------------------------------------------------------- planning (pure)


def cluster_paths(job: Job[SlurmProfile], local_home: Path, python: str) -> ClusterPaths:
    """LocalTunnel: the compute nodes share this filesystem. SSH: `job_dir` is the jobs root on the cluster."""
    profile = job.profile
    if profile.tunnel == "local":
        home = str(local_home)
        jobs_root = f"{home}/jobs"
    else:
        if not profile.job_dir:
            raise UserError(
                f"profile '{profile.name}': an SSH tunnel needs job_dir (where job dirs live on the cluster)"
            )
        jobs_root = profile.job_dir.rstrip("/")
        home = str(PurePosixPath(jobs_root).parent)
    artifacts = step_process.artifacts_root(profile, home)
    code = (str(bundled_root()), profile.code_root.rstrip("/")) if profile.code_root else None
    for what, path in (
        ("NEMOTRON_HOME", home),
        ("artifacts_root", artifacts),
        ("code_root", code[1] if code else ""),
    ):
        if any(ord(c) < 32 or ord(c) == 127 for c in path):
            # an #SBATCH line ends at a newline whatever the quoting: the rest would run as a command
            raise UserError(
                f"{what} {path!r} holds a control character (newline, tab, ...), which no sbatch script can carry"
            )
    return ClusterPaths(
        home, f"{jobs_root}/{job.job_id}", artifacts, f"{home}/nemorun/experiments", shlex.quote(python), code
    )


_NEMO_RUN_SAFE = re.compile(r"^[A-Za-z0-9/._+@:,=~-]+$")


def refuse_unsafe_paths(paths: ClusterPaths) -> None:
    """Our scripts quote every path, but NeMo-Run's own submission runs `mkdir -p <dir>` and friends with the
    path unquoted: a space splits it and a `$(...)` runs on the submitting machine. Such paths are refused
    (exit 2) before anything is written or run."""
    shown = {
        "NEMOTRON_HOME": paths.home,
        "artifacts_root": paths.artifacts_root,
        "code_root": paths.code[1] if paths.code else paths.home,
    }
    bad = [f"{what} {path!r}" for what, path in shown.items() if not _NEMO_RUN_SAFE.match(path)]
    if bad:
        raise UserError(
            "these paths hold characters NeMo-Run's Slurm submission cannot carry (it runs shell commands "
            "with them unquoted):",
            bad,
            hint="Use paths of letters, digits and / . _ + @ : , = ~ -",
        )


def partition_for(job: Job[SlurmProfile]) -> str | None:
    p = job.profile
    chosen = p.run_partition if job.mode == "attached" else p.batch_partition
    return chosen or p.partition


def secrets_source_line(path: str) -> str:
    # The script runs under `set -vx`: tracing off while sourcing keeps the values out of the log.
    return f"{{ set +vx; }} 2>/dev/null; source {shlex.quote(path)}; set -vx"


# torchrun's rendezvous port, one per job: two jobs that share a node (non-exclusive nodes; a job still completing
# beside the next) never meet on one port. A port another job's agent holds makes the new agent join that job's
# store, and fail when it goes. Below Linux's ephemeral range (32768-60999), so no outgoing connection holds it.
RDZV_PORT = "$((20000+SLURM_JOB_ID%10000))"


def step_command(
    job: Job[SlurmProfile], paths: ClusterPaths, nodes: int, nproc: int, rdzv_host: str
) -> Command:
    """The step process (launch/step_process.py), torchrun's launcher one per node when the step is distributed
    (`torchrun_agent`: torchrun's agent with Slurm's time-limit warning ignored, nemotron.runtime.preempt)."""
    rendezvous = (
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{rdzv_host}:{RDZV_PORT}",
        "--rdzv-id",
        "$SLURM_JOB_ID",
    )
    step = step_process.step_command(
        job,
        python=paths.python,
        job_dir=paths.job_dir,
        torchrun=step_process.across_nodes(nodes, nproc, *rendezvous),
        nodes=nodes,
        nproc=nproc,
        code_root=job.profile.code_root,
    )
    return Command(step.python, step.module, step.args, module=True)


def server_command(served: ServedModel, paths: ClusterPaths, threads: int) -> Command:
    """Group 0: our reward server, or `vllm serve` for a generative judge; either writes READY_FILE once it answers.
    The token reaches both through $NEMOTRON_REWARD_TOKEN (the secrets file), never argv."""
    where = ["--model", shlex.quote(served.path), "--host", "0.0.0.0", "--port", f"${REWARD_PORT_ENV}"]
    ready = ["--ready-file", shlex.quote(f"{paths.job_dir}/{READY_FILE}")]
    if served.server == "vllm":
        memory = ("--memory", str(served.memory)) if served.memory else ()
        return Command(paths.python, "nemotron.reward.vllm_serve", (*where, *memory, *ready), module=True)
    args = [*where, "--threads", str(threads), *ready]
    if served.max_length:
        args += ["--max-length", str(served.max_length)]
    return Command(paths.python, "nemotron.reward.server", tuple(args), module=True)


def after_server_is_ready(command: Command, paths: ClusterPaths, what: str = "the reward server",
                          timeout_s: int = READY_TIMEOUT_S, ready: str = "", then: str = "") -> Command:  # fmt: skip
    """Start the policy only once the server is ready: `ready` (a shell test) succeeds, by default once the
    server wrote its ready file (the job dir is on shared storage). Give up after `timeout_s`, so a server that
    never comes up fails the job instead of holding it to its time limit. `then` (shell) runs after the policy
    succeeded; the exit code stays the policy's."""
    ready = ready or f"[ -s {shlex.quote(f'{paths.job_dir}/{READY_FILE}')} ]"
    run = " ".join(command.words())
    inner = (
        # the time-limit warning (nemotron.runtime.preempt) must not end this shell; the step catches it itself
        "trap '' USR1; "
        f"for i in $(seq {timeout_s}); do {ready} && break; sleep 1; done; "
        f'{ready} || {{ echo "nemotron: {what} was not ready after {timeout_s} s" >&2; exit 1; }}; '
        + (f"{run}; code=$?; if [ $code -eq 0 ]; then\n{then}fi; exit $code" if then else f"exec {run}")
    )
    return Command("bash", "-c", (shlex.quote(inner),))


def job_env(job: Job[SlurmProfile], paths: ClusterPaths) -> tuple[tuple[tuple[str, str], ...], list[str]]:
    """(the variables every group exports, as shell words; the names the 0600 secrets file exports instead)."""
    env = step_process.step_env(job.profile, paths.home, paths.job_dir)
    return tuple((k.upper(), shlex.quote(v)) for k, v in env.variables), list(env.secrets)


def per_job_port(offset: int = 0) -> str:
    """Shell arithmetic for a port of this job: one per job, so two jobs sharing a node never collide, and every
    group of a heterogeneous job computes the same one."""
    return f"$((20000 + SLURM_JOB_ID % 10000{f' + {offset}' if offset else ''}))"


def shared_fields(
    job: Job[SlurmProfile],
    paths: ClusterPaths,
    image: str | None,
    extra_setup: Sequence[str] = (),
    extra_secrets: Sequence[str] = (),
) -> dict[str, Any]:
    """The fields every Slurm script of a job shares (our step's, a Ray cluster's, an engine's hetjob): time and
    place, the container and its mounts, the exported environment, and the setup lines (the secrets sourced, when
    the profile or `extra_secrets` has any, `extra_setup`, the image imported, the profile's own)."""
    p = job.profile
    env, secret_names = job_env(job, paths)
    secret_names += extra_secrets
    secrets = [secrets_source_line(f"{paths.job_dir}/{SECRETS_FILE}")] if secret_names else []
    image, import_lines, mounts = containers.container(
        job, image, home=paths.home, artifacts_root=paths.artifacts_root, job_dir=paths.job_dir
    )
    return {
        "time": p.time,
        "account": p.account,
        "partition": partition_for(job),
        "mem": p.mem,
        "container_image": image,
        "mounts": mounts,
        "env": env,
        "setup": (*secrets, *extra_setup, *import_lines, *p.setup),
        "secret_names": tuple(secret_names),
    }


def write_secrets(
    job: Job[SlurmProfile], job_dir: Path, names: Sequence[str], generated: dict[str, str] | None = None
) -> None:
    """<job dir>/.secrets.env (mode 0600): the profile's secret variables and any generated ones, never in a script."""
    from nemotron.core.atomic import write_atomic

    store = step_process.team_store_url(job.profile)
    values = {k: v for k, v in job.profile.env_vars.items() if k in names} | (generated or {})
    if store is not None and step_process.STORE_URL_ENV in names:  # a store URL with its password
        values[step_process.STORE_URL_ENV] = store
    write_atomic(
        job_dir / SECRETS_FILE,
        "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(values.items())),
        mode=0o600,
    )


def plan_slurm(job: Job[SlurmProfile], paths: ClusterPaths, served: ServedModel | None = None) -> SlurmPlan:
    """The job as Slurm sees it. `served` makes it heterogeneous: rm/serve in group 0, the step in group 1."""
    p = job.profile
    task = job.step_id.replace("/", "-").replace(".", "-")
    nproc = p.gpus_per_node or p.ntasks_per_node
    distributed = job.launch == "torchrun" and p.nodes * nproc > 1
    # NeMo-Run writes --gpus-per-node for every group once the first has it: all groups set it, or none.
    gpus = p.gpus_per_node or None

    served_setup = [f"export {REWARD_PORT_ENV}={per_job_port()}"] if served is not None else []
    served_secrets = [REWARD_TOKEN_ENV] if served is not None else []
    fields = shared_fields(job, paths, p.container_image, served_setup, served_secrets)

    nodes, tasks, notes = step_shape(job, p, distributed)
    if served is None:
        cmd = step_command(job, paths, p.nodes, nproc, "$head_node_ip")
        groups: tuple[SrunGroup, ...] = (SrunGroup(task, cmd, nodes, tasks, gpus),)
    else:
        threads = p.cpus_per_task or 1
        # The policy waits inside `bash -c`, where the script's unexported het_group_host_* are gone: export them.
        policy = step_command(job, paths, p.nodes, nproc, f"${RDZV_HOST_ENV}")
        policy_env = [(REWARD_URL_ENV, f'"http://${{het_group_host_0}}:${{{REWARD_PORT_ENV}}}"')]
        if distributed:
            policy_env.append((RDZV_HOST_ENV, '"${het_group_host_1}"'))
        groups = (
            SrunGroup(f"{task}-0", server_command(served, paths, threads), 1, 1, gpus),
            SrunGroup(
                f"{task}-1",
                after_server_is_ready(policy, paths, served.what),
                nodes,
                tasks,
                gpus,
                tuple(policy_env),
            ),
        )
    return SlurmPlan(
        job_id=job.job_id,
        task=task,
        groups=groups,
        paths=paths,
        cpus_per_task=p.cpus_per_task or job.resources.cpus,
        notes=tuple(notes),
        signal=time_limit_signal(p),
        **watched(fields, job, paths, groups),
    )


def watched(
    fields: dict[str, Any], job: Job[SlurmProfile], paths: ClusterPaths, groups: Sequence[SrunGroup]
) -> dict[str, Any]:
    """`shared_fields` with the watchdog (launch/liveness.py) after the setup lines: the heartbeats when the job
    spans more than one node, the ranks' progress unless the profile turned it off."""
    from nemotron.launch import liveness

    live = liveness.for_job(job.profile, paths.job_dir, tuple(g.nodes for g in groups), progress=True)
    return fields | {"setup": (*fields["setup"], *liveness.lines(live))}


def time_limit_signal(p: SlurmProfile) -> str | None:
    """`USR1@N`: Slurm sends SIGUSR1 to every process of the job's steps N s before its time limit; the built-in
    engine then saves a checkpoint and requeues the job (nemotron.runtime.preempt). 0 turns it off."""
    from nemotron.runtime.preempt import SIGNAL_NAME

    return f"{SIGNAL_NAME}@{p.time_limit_signal_s}" if p.time_limit_signal_s else None


def step_shape(job: Job[SlurmProfile], p: SlurmProfile, distributed: bool) -> tuple[int, int, list[str]]:
    """(nodes, tasks per node, notes) of the step's srun. A distributed step runs one torchrun launcher per node,
    which starts the node's ranks; a server one process per node; any other step one process on one node, since
    N copies of it would write the same outputs. The notes say when the profile asked for more."""
    if distributed:
        return p.nodes, 1, []
    if job.launch == "server":
        return p.nodes, 1, server_notes(job, p)
    if p.nodes * p.ntasks_per_node == 1:
        return 1, 1, []
    return (
        1,
        1,
        [
            f"{job.step_id} runs as one process ({job.launch} launch): 1 node, 1 task, not the profile's "
            f"{p.nodes} node(s) x {p.ntasks_per_node} task(s)"
        ],
    )


def server_notes(job: Job[SlurmProfile], p: SlurmProfile) -> list[str]:
    """A server step (manifest `launch = "server"`) runs one process per node: N tasks on a node would be N
    servers on one port. Say so when the profile asked for more tasks than that."""
    if p.ntasks_per_node == 1:
        return []
    return [
        f"{job.step_id} is a server: one server process per node ({p.nodes} in all), not the profile's "
        f"ntasks_per_node={p.ntasks_per_node}; clients find them in <job dir>/servers/ (docs/executors.md)"
    ]
