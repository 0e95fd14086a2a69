"""A Ray cluster on DGX Cloud Lepton, for engines that bring their own driver (NeMo-RL): the RayCluster spec
(pure), and the job run on it, both through NeMo-Run's Lepton Ray API (`LeptonRayJob`).

The cluster is one head plus `nodes - 1` workers of the profile's resource shape, in the engine's image, on the
profile's node group and mounts. The job's files (the engine's config, the driver script) travel as the Ray job's
`working_dir` package; its entrypoint copies them into the job dir on the shared mount and runs the driver once,
on several nodes under the watchdog of launch/ray_watchdog.py (every node beats; a silent one fails the job).
nemotron deletes the RayCluster once it sees the job end (`jobs status`, `jobs logs -f`, an attached run), so the
nodes are not held after the run.
"""

from __future__ import annotations

import json
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import field_serializer

from nemotron.compile import Job
from nemotron.config.profiles import LeptonProfile
from nemotron.engines.base import RayDriver
from nemotron.errors import UserError
from nemotron.launch import liveness, ray_watchdog, remote
from nemotron.launch.lepton_site import (
    executor_fields,
    lepton_env,
    lepton_name,
    nemo_run_dir,
    refuse_config_secrets,
)
from nemotron.launch.ray_slurm import DRIVER_FILE, driver_script, register_lines
from nemotron.launch.records import LogReader, RemoteRecord, RemoteState
from nemotron.plan.placement import Placement

# The state Lepton reports for a RayCluster whose head and workers all run (nemo_run's RAY_READY_STATE).
READY_STATE = "Ready"
WATCHDOG_FILE = ray_watchdog.SCRIPT
# Ray job states (ray.job_submission.JobStatus) -> ours
STATES = {
    "PENDING": "pending",
    "RUNNING": "running",
    "SUCCEEDED": "succeeded",
    "FAILED": "failed",
    "STOPPED": "cancelled",
}


@dataclass(frozen=True)
class LeptonRayPlan:
    name: str  # the RayCluster's id: Kubernetes-safe, at most 35 characters
    nodes: int
    gpus_per_node: int
    image: str
    profile: LeptonProfile
    job_dir: str  # on the shared mount
    env: tuple[tuple[str, str], ...]
    files: tuple[tuple[str, str], ...]  # (name, text) shipped in the job's working_dir, copied into job_dir
    live: liveness.Liveness | None = None  # the watchdog: heartbeats on several nodes, Ray's view, progress
    step_line: str = ""  # the driver's step lines (RayDriver.step_line), which the watchdog times

    @property
    def entrypoint(self) -> str:
        """What the Ray job runs on the head, from its working_dir: the driver, under the watchdog on several nodes."""
        q = shlex.quote(self.job_dir)
        names = " ".join(shlex.quote(name) for name, _ in self.files)
        driver = f"bash {q}/{DRIVER_FILE}"
        if self.live:
            python = shlex.quote(self.profile.python)
            timeout = self.live.timeout_s if self.live.groups else 0  # one node: nothing to beat
            progress = f"--progress {self.live.progress.encode()} " if self.live.progress else ""
            if self.live.progress and self.step_line:
                progress += f"--step-line {shlex.quote(self.step_line)} "
            driver = (
                f"{python} {WATCHDOG_FILE} --job-dir {q} --interval {self.live.interval_s} "
                f"--timeout {timeout} {progress}-- {driver}"
            )
        return f"mkdir -p {q}/logs {q}/checkpoints && cp {names} {q}/ && NEMOTRON_RAY_NODES={self.nodes} {driver}"


def plan_for(job: Job[LeptonProfile], where: Placement, launch: RayDriver) -> LeptonRayPlan:
    profile = job.profile
    if not launch.image:
        raise UserError("on Lepton the engine runs in a container: profile nemo_rl_image cannot be empty")
    env = lepton_env(profile, where.job_dir)
    register = register_lines(profile.python, where.job_dir, launch.outputs)
    files = (*launch.files, (DRIVER_FILE, driver_script(launch.command, register)))
    live = liveness.for_job(profile, where.job_dir, (where.nodes,), progress=True)
    if live:
        files = (*files, (WATCHDOG_FILE, Path(ray_watchdog.__file__).read_text()))
    return LeptonRayPlan(
        lepton_name(job.job_id),
        where.nodes,
        where.gpus_per_node,
        launch.image,
        profile,
        where.job_dir,
        env,
        files,
        live,
        launch.step_line,
    )


# ----------------------------------------------------------------------------- rendering (pure)


def cluster_spec(plan: LeptonRayPlan, node_group_id: str, ray_version: str) -> dict[str, Any]:
    """The body of POST /rayclusters, as leptonai serialises NeMo-Run's LeptonRayCluster (aliases, no nulls)."""
    p = plan.profile
    envs: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in plan.env]
    envs += [{"name": k, "value_from": {"secret_name_ref": v}} for k, v in sorted(p.secret_vars.items())]
    group = {
        "affinity": {"allowed_dedicated_node_groups": [node_group_id]},
        "resource_shape": p.resource_shape,
        "envs": envs,
        "mounts": [m.model_dump(by_alias=True) for m in p.mounts],
    }
    return {
        "metadata": {"id": plan.name, "name": plan.name},
        "spec": {
            "image": plan.image,
            "image_pull_secrets": list(p.image_pull_secrets),
            "ray_version": ray_version,
            "suspend": False,
            "head_group_spec": {**group, "min_replicas": 1},
            "worker_group_specs": [{**group, "min_replicas": plan.nodes - 1}],
        },
    }


def render_text(plan: LeptonRayPlan) -> str:
    """What --dry-run shows after the engine's files: the driver script, the RayCluster spec, the Ray job."""
    group = plan.profile.node_group
    spec = cluster_spec(plan, f"<id of node group {group}>", "<the workspace's default Ray version>")
    job = {
        "entrypoint": plan.entrypoint,
        "runtime_env": {"working_dir": f"<{', '.join(n for n, _ in plan.files)}>"},
        "submission_id": f"{plan.name}-<time>",
    }
    driver = dict(plan.files)[DRIVER_FILE]
    watched = ""
    if plan.live:
        what = []
        if plan.live.groups:
            what.append(
                f"every node beats every {plan.live.interval_s} s; one silent past {plan.live.timeout_s} s"
            )
        what.append("a node Ray declares dead")
        if plan.live.progress:
            what.append('a driver log silent past its allowance (docs/cluster.md, "Progress")')
        watched = (
            f"# ---- {plan.job_dir}/{WATCHDOG_FILE} (nemotron.launch.ray_watchdog) runs the driver: "
            f"{', '.join(what)} fails the job\n"
        )
    return (
        f"# ---- {plan.job_dir}/{DRIVER_FILE}\n{driver.rstrip()}\n{watched}"
        f"# ---- POST $LEPTON_WORKSPACE_URL/rayclusters (then wait until it is {READY_STATE})\n{json.dumps(spec, indent=2)}\n"
        f"# ---- the Ray job, through the cluster's dashboard (POST .../rayclusters/{plan.name}/dashboard/api/jobs/)\n"
        f"{json.dumps(job, indent=2)}\n"
    )


# ----------------------------------------------------------------------------- submission and control (NeMo-Run)


def _executor(run: Any, profile: LeptonProfile, nodes: int, image: str, env: dict[str, str]) -> Any:
    return run.LeptonExecutor(
        **executor_fields(profile),
        container_image=image,
        nemo_run_dir=nemo_run_dir(profile),
        nodes=nodes - 1,
        env_vars=env,
    )


def submit(job: Job[LeptonProfile], job_dir: Path, plan: LeptonRayPlan, launch: RayDriver) -> LeptonRay:
    """Create the RayCluster and run the job on it through NeMo-Run's LeptonRayJob; return the job's record."""
    from nemotron.core.atomic import write_atomic

    refuse_config_secrets(job_dir)
    workdir = Path(tempfile.mkdtemp(prefix="nemotron-ray-"))
    for name, text in plan.files:
        write_atomic(workdir / name, text)
        write_atomic(job_dir / name, text)  # the record here shows what ran there
    with remote.nemo_run() as run:
        from nemo_run.run.ray.lepton import LeptonRayJob

        ray_job = LeptonRayJob(
            name=plan.name, executor=_executor(run, plan.profile, plan.nodes, plan.image, dict(plan.env))
        )
        submission_id = ray_job.start(command=plan.entrypoint, workdir=str(workdir))
    return LeptonRay(
        handle=f"lepton-ray://{plan.name}",
        remote_id=plan.name,
        submission_id=submission_id,
        roles=[plan.name],
        outputs=dict(launch.outputs),
        profile=plan.profile,
    )


# what status, logs and cancel need to reach the cluster again
_REACH = {"executor", "node_group", "resource_shape", "nemo_run_dir", "mounts"}


class LeptonRay(RemoteRecord):
    """A RayCluster and the Ray job on it, through NeMo-Run's LeptonRayJob: the state and log are the Ray job's
    (its driver's), and the cluster is deleted once the job ended or is cancelled, so its nodes are not held."""

    shape: Literal["ray"] = "ray"
    submission_id: str | None = None
    profile: LeptonProfile  # kept as the fields that reach the cluster (`_REACH`)

    @field_serializer("profile")
    def _reach(self, profile: LeptonProfile) -> dict[str, Any]:
        return profile.model_dump(mode="json", by_alias=True, include=_REACH)

    def _job(self, run: Any) -> Any:
        from nemo_run.run.ray.lepton import LeptonRayJob

        job = LeptonRayJob(name=self.remote_id, executor=_executor(run, self.profile, 1, "", {}))
        job.submission_id = self.submission_id
        return job

    def state(self) -> RemoteState:
        """The Ray job's state, ours. A job that ended frees its cluster; one that failed first has its watchdog's
        record (if the watchdog failed it) read from the driver log: the log goes with the cluster."""
        with remote.nemo_run() as run:
            try:
                found = str(self._job(run).status(display=False))
            except RuntimeError as e:
                if "does not exist" not in str(e):
                    raise
                # its RayCluster is gone (deleted by a cancel, or by hand): nothing runs it any more
                return RemoteState("cancelled")
        ours = STATES.get(found.rsplit(".", 1)[-1].upper(), "unknown")
        seen = liveness_seen(self.log()) if ours == "failed" else None
        if ours in ("succeeded", "failed", "cancelled"):
            self.delete_cluster()
        return RemoteState(ours, seen)

    def exit_code(self) -> int | None:
        """None: the driver's status is the Ray job's."""
        return None

    def log(self) -> str:
        with remote.nemo_run() as run:
            job = self._job(run)
            return str(job._ray_client().get_job_logs(job.submission_id))

    def log_reader(self, job_dir: Path, role: str | None = None) -> LogReader:
        return remote.WholeLog(self.log)

    def cancel(self) -> None:
        with remote.nemo_run() as run:
            self._job(run).stop(wait=False)
        self.delete_cluster()

    def delete_cluster(self) -> None:
        """Free the cluster's nodes (the RayCluster outlives its job otherwise)."""
        from leptonai.api.v2.client import APIClient

        try:
            APIClient().raycluster.delete(self.remote_id)
        except Exception:  # already gone; a later look deletes nothing twice
            return


def liveness_seen(log: str) -> dict[str, Any] | None:
    """The watchdog's record in a driver log (its last `nemotron: liveness: {...}` line), if it failed the job."""
    for line in reversed(log.splitlines()):
        if line.startswith(ray_watchdog.PREFIX):
            try:
                seen = json.loads(line[len(ray_watchdog.PREFIX) :])
            except ValueError:
                return None
            return seen if isinstance(seen, dict) else None
    return None
