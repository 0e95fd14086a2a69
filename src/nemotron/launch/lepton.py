"""DGX Cloud Lepton: a compiled Job as the job spec NeMo-Run's LeptonExecutor sends (pure), its submission, and
status, logs and cancel mapped to the Lepton API (leptonai's APIClient, configured by $LEPTON_WORKSPACE_*).

NeMo-Run copies its task dir onto the shared mount (a busybox "data mover" job), then creates the job, whose
command runs `launch_script.sh` from there. The step's job dir is that copy; job.yaml and config.yaml reach it
through the packager, secrets only through Lepton workspace secrets (`secret_vars`).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import ConfigDict, Field, TypeAdapter

from nemotron.compile import Job
from nemotron.config.profiles import LeptonProfile
from nemotron.engines.base import HetJob, Launch, StepProcess
from nemotron.errors import UserError
from nemotron.launch import liveness, ray_lepton, remote, step_process
from nemotron.launch.lepton_site import (
    executor_fields,
    lepton_env,
    lepton_name,
    nemo_run_dir,
    refuse_config_secrets,
)
from nemotron.launch.nemo_run_layout import EXPERIMENT_TITLE, QUIET_EXPERIMENT, Experiment
from nemotron.launch.records import SHAPE_FIELD, LogReader, RemoteRecord, RemoteState, read_record
from nemotron.launch.remote import SchedulerJobs
from nemotron.plan.placement import Placement

if TYPE_CHECKING:
    from types import ModuleType

INIT_SCRIPT_URL = "https://raw.githubusercontent.com/leptonai/scripts/main/lepton_env_to_pytorch.sh"
RECORD_FILES = ("job.yaml", "config.yaml")
# how long a replica's log stream may stay silent while nemotron looks for a watchdog's record
LOG_WAIT_S = 10
# Lepton job state -> ours (the API's names, leptonai.api.v1.types.job.LeptonJobState).
STATES = {
    "Starting": "pending",
    "Queueing": "pending",
    "Awaiting": "pending",
    "Restarting": "pending",
    "PendingRetry": "pending",
    "Running": "running",
    "Completed": "succeeded",
    "Archived": "succeeded",
    "Failed": "failed",
    "Stopped": "cancelled",
    "Stopping": "cancelled",
    "Deleting": "cancelled",
    "Deleted": "cancelled",
    "UNK": "unknown",
}


@dataclass(frozen=True)
class LeptonPlan:
    """Everything the job spec and launch script depend on."""

    name: str  # the Lepton job id: a Kubernetes name, at most 35 characters
    experiment: Experiment  # under the mount's NEMORUN_HOME
    nemo_run_dir: str  # on the shared mount
    command: tuple[str, ...]  # shell words
    env: tuple[tuple[str, str], ...]
    setup: tuple[str, ...]
    profile: LeptonProfile

    @property
    def shipped(self) -> tuple[str, ...]:
        """Files packaged from the local job dir into the pod's job dir."""
        return RECORD_FILES

    @property
    def job_dir(self) -> str:
        """NeMo-Run's task dir on the mount, where its data mover copies the task: the step's job dir."""
        return self.experiment.task_dir(self.name)

    def executor_args(self) -> dict[str, Any]:
        """The keyword arguments of NeMo-Run's LeptonExecutor for this job, but its packager."""
        p = self.profile
        return executor_fields(p, "container_image", "nodes", "shared_memory_size") | {
            "nemo_run_dir": self.nemo_run_dir,
            "node_reservation": p.node_reservation or "",
            "env_vars": dict(self.env),
            "pre_launch_commands": list(self.setup),
        }


def _no_hetjob(job: Job[LeptonProfile], launch: HetJob) -> UserError:
    instead = (
        f", or {launch.elsewhere} on Lepton" if launch.elsewhere else f": {job.step_id} runs on Slurm only"
    )
    return UserError(
        f"backend={job.config_tree.get('backend')} runs as a heterogeneous Slurm job, which Lepton cannot place: use a "
        f"Slurm profile{instead}"
    )


def plan_lepton(job: Job[LeptonProfile], nemorun_home: str) -> LeptonPlan:
    """Our step process as a Lepton job (engines with their own driver run as a Ray cluster: ray_lepton)."""
    p = job.profile
    if job.launch == "server" and p.nodes > 1:
        # its replicas would all announce themselves as node 0 (the per-node address scheme reads Slurm's variables)
        raise UserError(
            f"{job.step_id} is a server: on Lepton it runs on one node; set nodes=1 in profile '{p.name}'"
        )
    root = nemo_run_dir(p)
    name = lepton_name(job.job_id)
    # NeMo-Run's task dir is the same under NEMORUN_HOME here and under the mount's copy of it
    experiment = Experiment(f"{root}/experiments", job.job_id)
    job_dir = experiment.task_dir(name)
    env = lepton_env(p, job_dir)
    q = shlex.quote(job_dir)
    setup = (
        f"mkdir -p {q}/logs {q}/checkpoints && cp {' '.join(f'{q}/code/{f}' for f in RECORD_FILES)} {q}/",
        *p.setup,
    )
    nproc = p.gpus_per_node or 1
    # lepton_env_to_pytorch.sh (sourced first) exports the rendezvous variables of the job's pods.
    rendezvous = (
        "--node-rank",
        "$NODE_RANK",
        "--master-addr",
        "$MASTER_ADDR",
        "--master-port",
        "$MASTER_PORT",
    )
    across = step_process.distributed(job, p.nodes, nproc)
    live = liveness.for_job(p, job_dir, (p.nodes,) if across else (1,), progress=True)
    # every pod watches the others' heartbeats (a lost or hung pod fails the job) and the ranks' progress
    # (launch/pod_watchdog.py)
    progress = ("--progress", live.progress.encode()) if live and live.progress else ()
    watchdog = (
        (shlex.quote(p.python), "-m", "nemotron.launch.pod_watchdog", "--job-dir", q, "--node-rank",
         "$NODE_RANK" if across else "0", "--nodes", str(p.nodes if across else 1), "--interval", str(live.interval_s), "--timeout",
         str(live.timeout_s), *progress, "--")
        if live else ()
    )  # fmt: skip
    step = step_process.step_command(
        job,
        python=shlex.quote(p.python),
        job_dir=job_dir,
        torchrun=step_process.across_nodes(p.nodes, nproc, *rendezvous),
        nodes=p.nodes,
        nproc=nproc,
        code_root=p.code_root,
        wrapper=watchdog,
    )
    return LeptonPlan(name, experiment, root, (*step.words(), EXIT_LINE), env, setup, p)


# ----------------------------------------------------------------------------- rendering (pure)

# Ends the step's command line: its exit code as the last line of the log the API returns (NeMo-Run's sbatch script
# does the same on Slurm). Lepton's job state says only Failed; exit codes 2/3/130 must mean the same everywhere.
EXIT_LINE = '; code=$?; echo "nemotron: job exited with code $code"; exit $code'


def launch_script(plan: LeptonPlan) -> str:
    """The script NeMo-Run writes into the task dir and the job runs (LeptonExecutor.launch)."""
    pre = "\n".join(plan.setup) + "\n" if plan.setup else ""
    return (
        f"\n{pre}wget -O init.sh {INIT_SCRIPT_URL}\nchmod +x init.sh\nsource init.sh\n"
        f"ln -s {plan.job_dir}/ /nemo_run\ncd /nemo_run/code\n{' '.join(plan.command)}\n"
    )


def job_spec(plan: LeptonPlan, node_group_id: str, node_ids: list[str]) -> dict[str, Any]:
    """The body of POST /jobs, as leptonai serialises NeMo-Run's LeptonJob (aliases, no nulls)."""
    p = plan.profile
    envs: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in plan.env]
    envs += [{"name": k, "value_from": {"secret_name_ref": v}} for k, v in sorted(p.secret_vars.items())]
    spec: dict[str, Any] = {
        "resource_shape": p.resource_shape,
        "affinity": {
            "allowed_dedicated_node_groups": [node_group_id],
            "allowed_nodes_in_node_group": node_ids,
        },
        "container": {
            "image": p.container_image,
            "command": ["/bin/bash", "-c", f"bash {plan.job_dir}/launch_script.sh"],
        },
        "shared_memory_size": p.shared_memory_size,
        "completions": p.nodes,
        "parallelism": p.nodes,
        "envs": envs,
        "mounts": [m.model_dump(by_alias=True) for m in p.mounts],
        "image_pull_secrets": list(p.image_pull_secrets),
        "intra_job_communication": True,
    }
    if p.node_reservation:
        spec["reservation_config"] = {"reservation_id": p.node_reservation}
    return {"metadata": {"id": plan.name}, "spec": spec}


def render_text(plan: LeptonPlan) -> str:
    """What --dry-run shows: the job spec (node ids are looked up at submit) and the script it runs."""
    group = plan.profile.node_group
    spec = job_spec(plan, f"<id of node group {group}>", [f"<nodes of {group}>"])
    return (
        f"# POST $LEPTON_WORKSPACE_URL/jobs\n{json.dumps(spec, indent=2)}\n"
        f"# {plan.job_dir}/launch_script.sh (copied there by NeMo-Run's data-mover job first)\n{launch_script(plan)}"
    )


# ----------------------------------------------------------------------------- submission and control


def submit_job(job: Job[LeptonProfile], job_dir: Path, plan: LeptonPlan) -> LeptonProcess:
    """Submit through NeMo-Run's LeptonExecutor; return the job's record."""
    refuse_config_secrets(job_dir)
    with remote.nemo_run() as run:
        handle = _submit(run, plan, job_dir)
    return LeptonProcess(handle=handle, remote_id=plan.name, roles=[plan.name])


def _submit(run: ModuleType, plan: LeptonPlan, job_dir: Path) -> str:
    packager = run.PatternPackager(
        include_pattern=[str(job_dir / f) for f in plan.shipped],
        relative_path=[str(job_dir)] * len(plan.shipped),
    )
    executor = run.LeptonExecutor(**plan.executor_args(), packager=packager)
    entry, *args = plan.command
    with run.Experiment(EXPERIMENT_TITLE, id=plan.experiment.id, **QUIET_EXPERIMENT) as exp:
        exp.add(run.Script(path=args[0], args=args[1:], entrypoint=entry), executor=executor, name=plan.name)
        exp.run(detach=True)
    return str(exp.jobs[0].handle)


def _client() -> Any:
    from leptonai.api.v2.client import APIClient

    return APIClient()


def job_state(job_id: str) -> RemoteState:
    client = _client()
    status = client.job.get(job_id).status
    if status is None:
        return RemoteState("unknown")
    state = getattr(status.state, "value", "UNK")
    if status.failed or state == "Failed":
        # a pod ended non-zero: if its watchdog found a pod lost, the job failed, and the lost pod may still
        # hold its node (a hung one never ends): the job is stopped and the record goes with the state
        seen = _watchdog_record(client, job_id)
        if seen is not None:
            client.job.delete(job_id)
            return RemoteState("failed", seen)
    # Lepton says Running once one pod runs; the job runs when all of them are ready.
    if state == "Running" and (status.ready or 0) < (status.active or 0):
        return RemoteState("pending")
    return RemoteState(STATES.get(state, "unknown"))


def _watchdog_record(client: Any, job_id: str) -> dict[str, Any] | None:
    """The pod watchdog's record (launch/pod_watchdog.py) in the log of any of the job's replicas. A replica
    still running streams its log until the read times out: what came by then is read."""
    for replica in client.job.get_replicas(job_id):
        chunks: list[str] = []
        try:
            for chunk in client.job.get_log(id_or_job=job_id, replica=replica, timeout=LOG_WAIT_S):
                chunks.append(chunk)
        except Exception:  # a timed-out or dropped stream: its first part is enough
            pass
        seen = ray_lepton.liveness_seen("".join(chunks))
        if seen is not None:
            return seen
    return None


def job_log(job_id: str) -> Iterator[str]:
    """The log of the job's first replica (rank 0), as far as it goes now."""
    client = _client()
    replicas = client.job.get_replicas(job_id)
    first = next((r for r in replicas if (r.metadata.id_ or "").replace(job_id, "").startswith("-0")), None)
    if first is None:
        raise UserError(f"Lepton job {job_id} has no replica yet")
    yield from client.job.get_log(id_or_job=job_id, replica=first, timeout=30)


def cancel_job(job_id: str) -> None:
    _client().job.delete(job_id)


# ----------------------------------------------------------------------------- the executor


class LeptonProcess(RemoteRecord):
    """Our step process as a Lepton job: its state and log are the Lepton API's, its exit code the last line of
    that log (launch_script echoes it)."""

    shape: Literal["process"] = "process"

    def state(self) -> RemoteState:
        return job_state(self.remote_id)

    def exit_code(self) -> int | None:
        return remote.last_exit_code("".join(job_log(self.remote_id)))

    def log_reader(self, job_dir: Path, role: str | None = None) -> LogReader:
        return remote.WholeLog(lambda: "".join(job_log(self.remote_id)))

    def cancel(self) -> None:
        cancel_job(self.remote_id)


# the shapes a Lepton job's record can have (there is no heterogeneous job on Lepton)
RECORDS: TypeAdapter[LeptonProcess | ray_lepton.LeptonRay] = TypeAdapter(
    Annotated[LeptonProcess | ray_lepton.LeptonRay, Field(discriminator=SHAPE_FIELD)],
    config=ConfigDict(defer_build=True),
)


class LeptonExecutor(SchedulerJobs):
    kind = "lepton"
    cheap_refresh = False
    profile = LeptonProfile

    def plan(self, job: Job[LeptonProfile]) -> LeptonPlan:
        return plan_lepton(job, str(remote.nemorun_home()))

    def placement(self, job: Job[LeptonProfile]) -> Placement:
        p = job.profile
        return Placement(
            self.plan(job).job_dir, p.nodes, p.gpus_per_node, ranks_per_node=p.gpus_per_node or 1
        )

    def render(self, job: Job[LeptonProfile], where: Placement, launch: Launch) -> str:
        if isinstance(launch, StepProcess):
            return render_text(self.plan(job))
        if isinstance(launch, HetJob):
            raise _no_hetjob(job, launch)
        return ray_lepton.render_text(ray_lepton.plan_for(job, where, launch))

    def submit(self, job: Job[LeptonProfile], job_dir: Path, where: Placement, launch: Launch) -> int:
        if isinstance(launch, StepProcess):
            plan = self.plan(job)
            return remote.submit_remote(job, job_dir, lambda: submit_job(job, job_dir, plan), self.record)
        if isinstance(launch, HetJob):
            raise _no_hetjob(job, launch)
        ray = ray_lepton.plan_for(job, where, launch)
        return remote.submit_remote(
            job, job_dir, lambda: ray_lepton.submit(job, job_dir, ray, launch), self.record
        )

    def record(self, status: dict[str, Any], job_dir: Path) -> RemoteRecord:
        return read_record(RECORDS, status, job_dir)
