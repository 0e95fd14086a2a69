"""An external engine's heterogeneous job (`HetJob`, NeMo-Aligner's servers and actor) as a Slurm plan: the same
`SlurmPlan` our own steps use, so the sbatch script (`#SBATCH hetjob`, `srun --het-group=N`), its rendering and
its submission through NeMo-Run are the ones `slurm.py` already has. Every word is quoted here."""

from __future__ import annotations

import shlex

from nemotron.compile import Job
from nemotron.config.profiles import SlurmProfile
from nemotron.core.paths import nemotron_home
from nemotron.engines.base import HetGroup, HetJob
from nemotron.launch import slurm


def _command(group: HetGroup) -> slurm.Command:
    """NeMo-Run's `Script(path, args, entrypoint)`: the interpreter, the script, then the arguments as shell words."""
    python, script, *args = group.argv
    return slurm.Command(shlex.quote(python), shlex.quote(script), tuple(shlex.quote(a) for a in args))


def _reachable(waits_for: tuple[tuple[str, str], ...]) -> str:
    """A shell test that every (host variable, port variable) accepts a TCP connection (bash's /dev/tcp)."""
    return " && ".join(f'(: </dev/tcp/"${host}"/"${port}") 2>/dev/null' for host, port in waits_for)


def _finalize_on_rank_0(launch: HetJob, paths: slurm.ClusterPaths, python: str) -> str:
    """The last group's first task runs the engine's `finalize`, then registers the outputs where they are, as a
    Ray driver does (`register_lines`)."""
    from nemotron.launch.ray_slurm import register_lines

    lines = launch.finalize + register_lines(python, paths.job_dir, launch.outputs)
    return f'if [ "${{SLURM_PROCID:-0}}" = 0 ]; then\n{lines}fi\n' if lines else ""


def _after_prepare(command: slurm.Command, prepare: str, job_dir: str) -> slurm.Command:
    """`command` on every task once the first task ran `prepare` (the engine's data files): the others wait for
    its marker, one per Slurm run of the job (a requeue prepares afresh), at most 10 minutes."""
    mark = f"{shlex.quote(job_dir)}/.prepared.$SLURM_JOB_ID.${{SLURM_RESTART_COUNT:-0}}"
    run = " ".join(command.words())
    inner = (
        f'if [ "${{SLURM_PROCID:-0}}" = 0 ]; then ({prepare}) && touch {mark} || exit 1; '
        f"else n=0; until [ -e {mark} ]; do n=$((n + 1)); [ $n -gt 600 ] && exit 1; sleep 1; done; fi; exec {run}"
    )
    return slurm.Command("bash", "-c", (shlex.quote(inner),))


def _then_on_success(command: slurm.Command, then: str) -> slurm.Command:
    """`command`, then the shell `then` once it succeeded; the exit code stays the command's."""
    run = " ".join(command.words())
    # the time-limit warning (nemotron.runtime.preempt) must not end this shell
    inner = f"trap '' USR1; {run}; code=$?; if [ $code -eq 0 ]; then\n{then}fi; exit $code"
    return slurm.Command("bash", "-c", (shlex.quote(inner),))


def plan_het(job: Job[SlurmProfile], launch: HetJob) -> slurm.SlurmPlan:
    profile = job.profile
    python = profile.python or "python"
    paths = slurm.cluster_paths(job, nemotron_home(), python)
    ports = [f"export {name}={slurm.per_job_port(offset)}" for name, offset in launch.ports]
    task = job.step_id.replace("/", "-").replace(".", "-")
    gpus = profile.gpus_per_node or None  # NeMo-Run sets --gpus-per-node for every group or none
    groups = []
    for i, group in enumerate(launch.groups):
        command = _command(group)
        if launch.prepare and i == len(launch.groups) - 1:
            command = _after_prepare(command, launch.prepare, paths.job_dir)
        group_env = [(k, shlex.quote(v)) for k, v in group.env]
        last = i == len(launch.groups) - 1
        then = _finalize_on_rank_0(launch, paths, python) if last else ""
        if group.waits_for:
            # the servers are groups 0..n-1 in the order the trainer names them
            group_env += [(host, f'"${{het_group_host_{j}}}"') for j, (host, _) in enumerate(group.waits_for)]
            what = "the server group(s) it talks to"
            ready = _reachable(group.waits_for)
            command = slurm.after_server_is_ready(command, paths, what, ready=ready, then=then)
        elif then:
            command = _then_on_success(command, then)
        role = f"{task}-{i}" if len(launch.groups) > 1 else task
        groups.append(
            slurm.SrunGroup(role, command, group.nodes, group.tasks_per_node, gpus, tuple(group_env))
        )
    return slurm.SlurmPlan(
        job_id=job.job_id,
        task=task,
        groups=tuple(groups),
        paths=paths,
        cpus_per_task=profile.cpus_per_task or job.resources.cpus,
        **slurm.watched(slurm.shared_fields(job, paths, launch.image or None, ports), job, paths, groups),
    )
