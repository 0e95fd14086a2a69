"""A Ray cluster across a Slurm allocation, for engines that bring their own driver (NeMo-RL): the sbatch script
(pure, every path quoted) and its submission, state and cancel through NeMo-Run's Slurm Ray API.

One `ray start --head` on the first node, one `ray start --address` on each other node, then the driver once on
the head (`srun --overlap`), which first waits until every node has joined. Each raylet gets a port block of its
own (derived from the Slurm job id and the node's index), so two jobs on one node, or two raylets on one host,
never collide; the script stops the raylets itself when the driver ends, so the job does not linger.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import field_serializer

from nemotron.compile import Job
from nemotron.config.profiles import SlurmProfile
from nemotron.core.paths import nemotron_home
from nemotron.engines.base import RayDriver
from nemotron.launch import liveness, ray_watchdog, remote, slurm
from nemotron.launch.nemo_run_layout import RayClusterDirs
from nemotron.launch.records import RemoteState
from nemotron.launch.slurm_script import SlurmJob, tunnel
from nemotron.plan.placement import Placement

DRIVER_FILE = "ray_driver.sh"
READY_TIMEOUT_S = 600  # pulling a container and starting raylets on many nodes takes minutes
# A raylet's ports: BASE + (job id % JOBS) * JOBS_STRIDE + (node index % NODES) * NODE_STRIDE + offset, all
# below Linux's ephemeral range (32768+), so no outgoing connection takes one first.
PORT_BASE, PORT_JOBS, PORT_JOB_STRIDE, PORT_NODES, PORT_NODE_STRIDE = 10000, 12, 1600, 8, 200
_PORT_OFFSETS = {  # within a node's block of 200; workers take [20, 199]
    "node-manager-port": 0,
    "object-manager-port": 1,
    "dashboard-agent-listen-port": 2,
    "dashboard-agent-grpc-port": 3,
    "metrics-export-port": 4,
    "runtime-env-agent-port": 5,
}
GCS_OFFSET, CLIENT_OFFSET, MIN_WORKER_OFFSET, MAX_WORKER_OFFSET = 6, 7, 20, 199
HEAD, WORKER, WORKER_INDEX = '"$head"', '"${nodes[$i]}"', '"$i"'  # shell words of the script's own variables
# A worker node's `ray start --block` writes its exit code to ray-worker-<i>.exit beside its log when it ends: the
# driver, waiting for the nodes to join, fails the job at once with that node's log tail (a node that never
# starts would otherwise hold the allocation until the wait's bound).
EXITED = ".exit"
WORKER_RAY_START = 'bash -c \'ray "$@"; echo $? > "$0"\''


@dataclass(frozen=True, kw_only=True)
class RayPlan(slurm.SlurmSite):
    """Everything the Ray sbatch script depends on: the one input of `render_sbatch` and `submit`."""

    job_id: str
    cluster: RayClusterDirs  # named after the job
    job_dir: str  # the step's job dir on shared storage (the engine's files and the driver script)
    nodes: int
    gpus_per_node: int
    driver_script: str = ""  # the text of <job dir>/ray_driver.sh
    files: tuple[tuple[str, str], ...] = ()  # the engine's files for the job dir
    liveness: liveness.Liveness | None = (
        None  # heartbeats and watchdog (launch/liveness.py); None on one node
    )

    @property
    def job_name(self) -> str:
        return f"{slurm.JOB_NAME_PREFIX}{self.cluster.name}"  # what NeMo-Run's SlurmRayRequest.get_job_name gives

    @property
    def role(self) -> str:
        return f"{self.cluster.name}-driver"


def plan_for(job: Job[SlurmProfile], where: Placement, launch: RayDriver) -> RayPlan:
    profile = job.profile
    paths = slurm.cluster_paths(job, nemotron_home(), profile.python or "python")
    cluster = RayClusterDirs(paths.nemorun_jobs, job.job_id)
    command, files = watched_driver(launch, profile, where.job_dir)
    return RayPlan(
        job_id=job.job_id,
        cluster=cluster,
        job_dir=where.job_dir,
        nodes=where.nodes,
        gpus_per_node=where.gpus_per_node,
        # one task per node holds the node's whole CPU share (the profile's tasks x CPUs per task)
        cpus_per_task=profile.cpus_per_task * profile.ntasks_per_node if profile.cpus_per_task else None,
        driver_script=driver_script(
            command,
            register_lines(profile.python or "python", where.job_dir, launch.outputs),
            started=f'{shlex.quote(cluster.logs)}/ray-worker-*_"$SLURM_JOB_ID".out',  # render_sbatch's names
            exited=f"{shlex.quote(cluster.logs)}/ray-worker-*{EXITED}",
        ),
        files=files,
        liveness=liveness.for_job(profile, where.job_dir, (where.nodes,)),
        **slurm.shared_fields(job, paths, launch.image or None),
    )


def watched_driver(
    launch: RayDriver, profile: SlurmProfile, job_dir: str
) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The engine's command under launch/ray_watchdog.py (shipped into the job dir beside the engine's files),
    which fails the job once Ray declares a node dead or the driver's log stops moving; the nodes' heartbeats
    stay the sbatch script's. As it was where the profile turned progress off (`progress_floor_s = 0`)."""
    command, files = launch.command, launch.files
    bounds = liveness.progress_bounds(profile)
    if bounds is None:
        return command, files
    q = shlex.quote
    steps = f"--step-line {q(launch.step_line)} " if launch.step_line else ""
    python = q(profile.python or "python")
    wrapped = (
        f"{python} {q(f'{job_dir}/{ray_watchdog.SCRIPT}')} --job-dir {q(job_dir)} "
        f"--interval {profile.heartbeat_interval_s} --timeout 0 --progress {bounds.encode()} {steps}-- bash -c {q(command)}"
    )
    return wrapped, (*files, (ray_watchdog.SCRIPT, Path(ray_watchdog.__file__).read_text()))


# ----------------------------------------------------------------------------- rendering (pure)


def register_lines(python: str, job_dir: str, outputs: tuple[tuple[str, str], ...]) -> str:
    """Shell: register the outputs where they are (the store is on the cluster's storage) when nemotron is
    importable next to the engine (the profile's PYTHONPATH / code_root); else the watching machine does."""
    if not outputs:
        return ""
    py = shlex.quote(python)
    pairs = " ".join(shlex.quote(f"{name}={path}") for name, path in outputs)
    return (
        f"if {py} -c 'import nemotron.artifacts.lineage' 2>/dev/null; then\n"
        f"    {py} -m nemotron.artifacts.lineage --job-dir {shlex.quote(job_dir)} {pairs}\n"
        "else\n"
        f'    echo "nemotron: nemotron is not importable by {python} here; the outputs are registered by the machine that watches this job"\n'
        "fi\n"
    )


def driver_script(
    command: str,
    register: str = "",
    timeout_s: int = READY_TIMEOUT_S,
    started: str = "",
    hint_s: int = 30,
    exited: str = "",
) -> str:
    """<job dir>/ray_driver.sh: wait until all $NEMOTRON_RAY_NODES nodes joined, then the engine's command, then
    the outputs registered (`register`, shell lines). `started` (a shell glob: the worker nodes' `ray start` logs,
    where there are such) is read between the calls: each `ray status` is a Python process of about 4 CPU-seconds,
    so Ray is asked once every worker said "Ray runtime started", else every `hint_s` seconds (a Ray whose
    `ray start` says it otherwise is still seen), where it was asked every 2 s from the first. The bound is the
    clock's, however long each call takes. `exited` (a shell glob: the worker nodes' exit-code files) ends the wait
    at once, exit 1, with the first such node's code and the tail of its `ray start` log."""
    active = "awk '/^Active:/{a=1;next} /^[A-Z][a-z]+:/{a=0} a && /node_/{n++} END{print n+0}'"
    # a worker node whose `ray start` exited (its code in a file `exited` matches): fail now, with its log's end
    left = (
        "left() {\n"
        f"    gone=$(ls {exited} 2>/dev/null | head -n 1)\n"
        '    [ -z "$gone" ] && return 0\n'
        '    log="${gone%.exit}_$SLURM_JOB_ID.out"\n'
        # srun's step daemon writes the node's output to its log, which can land after the exit file the node's
        # shell wrote: read the tail once the log has stopped growing (1 s unchanged, 10 s at most)
        "    size=-1\n"
        "    for _ in 1 2 3 4 5 6 7 8 9 10; do\n"
        '        now=$(stat -c %s "$log" 2>/dev/null || echo 0)\n'
        '        [ "$now" = "$size" ] && [ "$now" != 0 ] && break\n'
        "        size=$now\n"
        "        sleep 1\n"
        "    done\n"
        '    echo "nemotron: a Ray worker node left before the cluster was ready: its \\`ray start\\` exited with code'
        ' $(cat "$gone") ($gone); the end of its log:" >&2\n'
        '    tail -n 20 "$log" >&2\n'
        "    exit 1\n"
        "}\n"
        if exited
        else ""
    )
    check = "left\n" if exited else ""
    wait_logs = (
        "    asked=$SECONDS\n"
        "    while [ $SECONDS -lt $deadline ] && [ $SECONDS -lt $((asked + "
        f"{hint_s})) ] && [ \"$(grep -ls 'Ray runtime started' {started} | wc -l)\" -lt $((want - 1)) ]; do\n"
        + "        " * bool(check)
        + check
        + "        sleep 1\n"
        "    done\n"
        if started
        else ""
    )
    return f"""#!/bin/bash
# Runs once, on the Ray head, after `ray start` on every node (written by nemotron; see ray.sub beside the logs).
set -uo pipefail
want=$NEMOTRON_RAY_NODES
deadline=$((SECONDS + {timeout_s}))
n=0
{left}while :; do
{"    " * bool(check)}{check}{wait_logs}    n=$(ray status --address "$RAY_ADDRESS" 2>/dev/null | {active})
    [ "$n" -ge "$want" ] || [ $SECONDS -ge $deadline ] && break
    sleep 2
done
if [ "$n" -lt "$want" ]; then
    echo "nemotron: only $n of $want Ray nodes joined within {timeout_s} s" >&2
    exit 1
fi
echo "nemotron: Ray cluster ready: $n node(s) at $RAY_ADDRESS"
set -e
{command}
{register}"""


def _flags(plan: RayPlan) -> list[str]:
    values: dict[str, Any] = {
        "requeue": True,  # preempted, it comes back; NeMo-RL resumes from the newest step_N (docs/cluster.md)
        "job-name": plan.job_name,
        "nodes": plan.nodes,
        "ntasks-per-node": 1,
        "time": plan.time,
        "output": f"{plan.cluster.logs}/sbatch_{plan.job_name}_%j.out",
        "account": plan.account,
        "partition": plan.partition,
        "cpus-per-task": plan.cpus_per_task,
        "mem": plan.mem,
        "gpus-per-node": plan.gpus_per_node or None,
    }
    return [
        f"#SBATCH --{k}" if v is True else f"#SBATCH --{k}={shlex.quote(str(v))}"
        for k, v in values.items()
        if v is not None
    ]


def _srun(plan: RayPlan, where: str, log: str, *, overlap: bool = False) -> str:
    """`srun` on one node (`where` is a shell word), its output in `log`, in the container when there is one."""
    words = [
        "srun",
        *(["--overlap"] if overlap else []),
        "--nodes=1",
        "--ntasks=1",
        "-w",
        where,
        "--output",
        log,
    ]
    if plan.container_image:
        words += ["--container-image", shlex.quote(plan.container_image), "--no-container-mount-home"]
        if plan.mounts:
            words += ["--container-mounts", shlex.quote(",".join(plan.mounts))]
    return " ".join(words)


def _ports(node: str) -> str:
    block = f"$(( {PORT_BASE} + (SLURM_JOB_ID % {PORT_JOBS}) * {PORT_JOB_STRIDE} + ({node} % {PORT_NODES}) * {PORT_NODE_STRIDE} ))"
    lines = [f"b={block}"]
    flags = " ".join(f"--{k}=$((b + {v}))" for k, v in _PORT_OFFSETS.items())
    lines.append(
        f'ports="{flags} --min-worker-port=$((b + {MIN_WORKER_OFFSET})) --max-worker-port=$((b + {MAX_WORKER_OFFSET}))"'
    )
    return "\n".join(lines)


def render_sbatch(plan: RayPlan) -> str:
    """The sbatch script: Ray head, workers, the driver once on the head, the raylets stopped at the end."""
    q = shlex.quote
    gpus = f" --num-gpus={plan.gpus_per_node}"
    cpus = f" --num-cpus={plan.cpus_per_task}" if plan.cpus_per_task else ""
    common = f'--temp-dir="/tmp/ray-$SLURM_JOB_ID-$i" --disable-usage-stats{gpus}{cpus} $ports --block'
    logs = q(plan.cluster.logs)
    lines = [
        "#!/bin/bash",
        *_flags(plan),
        "",
        f"# nemotron {plan.job_id}: a Ray cluster on {plan.nodes} node(s); the driver runs once on the head.",
        "set -uo pipefail",
        *(f"export {k}={v}" for k, v in plan.env),
        "export RAY_AUTH_MODE=disabled  # a token file left by an earlier local ray.init() must not lock us out",
        f"export NEMOTRON_RAY_NODES={plan.nodes}",
        *plan.setup,
        f"mkdir -p {logs}",
        f"rm -f {logs}/ray-worker-*{EXITED}  # an earlier attempt's (a requeue): the driver reads them as this one's",
        'nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
        "head=${nodes[0]}",
        "head_ip=$(srun --nodes=1 --ntasks=1 -w \"$head\" hostname --ip-address | awk '{print $1}')",
        "i=0",
        _ports("0"),
        f'export RAY_ADDRESS="$head_ip:$((b + {GCS_OFFSET}))"',
        "",
        "# the head",
        f'{_srun(plan, HEAD, q(f"{plan.cluster.logs}/ray-head_%j.out"))} ray start --head --node-ip-address="$head_ip" '
        f"--port=$((b + {GCS_OFFSET})) --ray-client-server-port=$((b + {CLIENT_OFFSET})) --include-dashboard=false {common} &",
        "raylets=($!)",
        "",
        "# one worker per other node",
        "for ((i = 1; i < ${#nodes[@]}; i++)); do",
        *("    " + line for line in _ports("i").splitlines()),
        f"    {_srun(plan, WORKER, q(f'{plan.cluster.logs}/ray-worker-') + WORKER_INDEX + '_%j.out')} "
        f"{WORKER_RAY_START} {q(f'{plan.cluster.logs}/ray-worker-')}{WORKER_INDEX}{EXITED} "
        f'start --address="$RAY_ADDRESS" {common} &',
        "    raylets+=($!)",
        "done",
        "",
        *liveness.lines(plan.liveness),
        "",
        "# the driver, once, on the head: it waits for every node, then runs the engine's command",
        f"{_srun(plan, HEAD, q(f'{plan.cluster.logs}/log-{slurm.JOB_NAME_PREFIX}{plan.role}_%j.out'), overlap=True)} "
        f"bash {q(f'{plan.job_dir}/{DRIVER_FILE}')}",
        "code=$?",
        "",
        "# stop the raylets (their sruns end with them), so the job ends now rather than at its time limit",
        'kill "${raylets[@]}" 2>/dev/null',
        *([liveness.stop_line(plan.liveness)] if plan.liveness else []),
        "for _ in $(seq 30); do jobs -r | grep -q . || break; sleep 1; done",
        'echo "job exited with code $code"',
        "exit $code",
        "",
    ]
    return "\n".join(lines)


def render_text(plan: RayPlan) -> str:
    """What --dry-run shows after the engine's files: the driver script, the submit command, the script."""
    head = [
        f"# ---- {plan.job_dir}/{DRIVER_FILE}",
        plan.driver_script.rstrip(),
        f"# ---- submitted with: sbatch --parsable {plan.cluster.script}",
    ]
    if plan.secret_names:
        head.append(
            f"# {plan.job_dir}/{slurm.SECRETS_FILE} (mode 0600) exports: {', '.join(plan.secret_names)}"
        )
    return "\n".join(head) + "\n" + render_sbatch(plan)


# ----------------------------------------------------------------------------- submission and control (NeMo-Run)


def submit(job: Job[SlurmProfile], job_dir: Path, plan: RayPlan, launch: RayDriver) -> SlurmRay:
    """Write the driver script and the engine's files into the job dir, submit through NeMo-Run's Slurm Ray API,
    return the job's record."""
    from nemotron.core.atomic import write_atomic

    if plan.secret_names:
        slurm.write_secrets(job, job_dir, plan.secret_names)
    for name, text in plan.files:
        write_atomic(job_dir / name, text)
    write_atomic(job_dir / DRIVER_FILE, plan.driver_script, mode=0o755)
    profile = job.profile
    with remote.nemo_run() as run:
        from nemotron.launch.nemo_run_ray import ScriptedSlurmRayCluster

        executor = slurm_executor(run, profile, plan.cluster.root)
        slurm_id = ScriptedSlurmRayCluster(name=plan.cluster.name, executor=executor).create_from_script(
            render_sbatch(plan)
        )
    return SlurmRay(
        handle=f"ray://{plan.cluster.name}",
        remote_id=slurm_id,
        remote_dir=plan.cluster.logs,
        roles=[plan.role],
        ray_name=plan.cluster.name,
        ray_root=plan.cluster.root,
        outputs=dict(launch.outputs),
        profile=profile,
    )


def slurm_executor(run: Any, profile: SlurmProfile, root: str) -> Any:
    """The NeMo-Run executor whose tunnel reaches the cluster; only its tunnel and job-name prefix are used."""
    return run.SlurmExecutor(
        account=profile.account, tunnel=tunnel(run, profile, root), job_name_prefix=slurm.JOB_NAME_PREFIX
    )


_STATES = {
    "PENDING": "pending",
    "CONFIGURING": "pending",
    "REQUEUED": "pending",
    "RUNNING": "running",
    "COMPLETING": "running",
    "COMPLETED": "succeeded",
    "CANCELLED": "cancelled",
    "FAILED": "failed",
    "TIMEOUT": "failed",
    "NODE_FAIL": "failed",
    "OUT_OF_MEMORY": "failed",
    "PREEMPTED": "failed",
    "BOOT_FAIL": "failed",
    "DEADLINE": "failed",
}
# what status and cancel need to reach the cluster again (no secrets: job.yaml's profile is masked)
_REACH = {"executor", "tunnel", "host", "user", "identity", "account"}


class SlurmRay(SlurmJob):
    """A Ray cluster submitted through NeMo-Run's Slurm Ray API: its state is sacct's, through that API; its
    logs are the cluster's (the driver's is the step's)."""

    shape: Literal["ray"] = "ray"
    ray_name: str
    ray_root: str
    profile: SlurmProfile  # kept as the fields that reach the cluster (`_REACH`)

    @field_serializer("profile")
    def _reach(self, profile: SlurmProfile) -> dict[str, Any]:
        return profile.model_dump(mode="json", include=_REACH)

    def _job(self, run: Any) -> Any:
        from nemotron.launch.nemo_run_ray import SlurmRayJob

        job = SlurmRayJob(name=self.ray_name, executor=slurm_executor(run, self.profile, self.ray_root))
        job.job_id = self.remote_id
        return job

    def state(self) -> RemoteState:
        with remote.nemo_run() as run:
            found = str(self._job(run).status(display=False).get("state") or "UNKNOWN")
        return RemoteState(
            _STATES.get(found.split()[0].rstrip("+"), "unknown")
        )  # sacct says "CANCELLED by 0"

    def cancel(self) -> None:
        with remote.nemo_run() as run:
            self._job(run).stop(wait=False)
