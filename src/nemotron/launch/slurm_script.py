"""A Slurm plan as an sbatch script (pure), and its submission through NeMo-Run.

`render_sbatch` fills NeMo-Run's own `slurm.sh.j2`, read from the installed package without importing it
(the import costs seconds), with the values NeMo-Run's `SlurmBatchRequest` computes from the executors that
`submit_plan` builds from the same plan. tests/slurm proves the two texts equal.
"""

from __future__ import annotations

import importlib.util
import secrets
import shlex
import string
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from nemotron.compile import Job
from nemotron.config.profiles import SlurmProfile
from nemotron.errors import UserError
from nemotron.launch import nemo_run_sbatch, remote
from nemotron.launch.nemo_run_layout import EXPERIMENT_TITLE, QUIET_EXPERIMENT
from nemotron.launch.records import LogReader, RemoteRecord
from nemotron.launch.slurm import (
    JOB_NAME_PREFIX,
    MACROS,
    RUNDIR,
    SBATCH_COMMAND,
    SECRETS_FILE,
    SlurmPlan,
    SrunGroup,
    write_secrets,
)
from nemotron.reward.bind import TOKEN_ENV as REWARD_TOKEN_ENV

if TYPE_CHECKING:
    from types import ModuleType


class SlurmJob(RemoteRecord):
    """A job on Slurm, whatever its shape: its logs are the sbatch and srun output files in `remote_dir`, and the
    sbatch script's last line says its exit code."""

    remote_dir: str  # where the sbatch and srun outputs are

    def exit_code(self) -> int | None:
        return remote.exit_line_code(self.remote_dir, f"sbatch_*_{self.remote_id}.out")

    def log_reader(self, job_dir: Path, role: str | None = None) -> LogReader:
        return remote.LogTail(lambda: remote.step_log_files(self.remote_dir, role or self.roles[-1]))

    def side_logs(self) -> list[Path]:
        """The first group's log (the reward server's) of a job of several groups."""
        return remote.step_log_files(self.remote_dir, self.roles[0]) if len(self.roles) > 1 else []


# ----------------------------------------------------------------------------- rendering (pure)


def _macro(text: str) -> str:
    return string.Template(text).safe_substitute(MACROS)


def _sbatch_flag(key: str, value: Any) -> str:
    key = key.replace("_", "-")
    return f"#SBATCH --{key}" if value is True else f"#SBATCH --{key}={shlex.quote(str(value))}"


def _sbatch_flags(plan: SlurmPlan) -> list[str]:
    first = plan.groups[0]
    job_name = f"{JOB_NAME_PREFIX}{first.role}"
    output = f"{plan.task_dir}/sbatch_{job_name}_%j.out"
    params: dict[str, Any] = {
        "account": plan.account,
        "cpus_per_task": plan.cpus_per_task,
        "gpus_per_node": first.gpus_per_node,
        "job_name": job_name,
        "mem": plan.mem,
        "nodes": first.nodes,
        "ntasks_per_node": first.ntasks_per_node,
        "open_mode": "append",
        "output": output,
        "partition": plan.partition,
        "signal": plan.signal,
        "time": plan.time,
    }
    params = {k: v for k, v in params.items() if v is not None}
    if not plan.heterogeneous:
        return [_sbatch_flag(k, params[k]) for k in sorted(params)]
    flags = []
    for i, group in enumerate(plan.groups):
        het = {
            **params,
            "output": output.replace(first.role, group.role),
            "job_name": f"{job_name.removesuffix('-0')}-{i}",
            "nodes": group.nodes,
            "ntasks_per_node": group.ntasks_per_node,
            "gpus_per_node": group.gpus_per_node,
        }
        flags += [_sbatch_flag(k, het[k]) for k in sorted(params)]
        if i != len(plan.groups) - 1:
            flags.append("#SBATCH hetjob")
    return flags


def _srun(plan: SlurmPlan, i: int, group: SrunGroup) -> str:
    where = ["--chdir", f"{plan.task_dir}/code"]
    if plan.container_image:
        mounts = ",".join([*plan.mounts, f"{plan.task_dir}:{RUNDIR}"])
        where = [
            "--container-image",
            plan.container_image,
            "--container-mounts",
            mounts,
            "--container-workdir",
            f"{RUNDIR}/code",
        ]
    het = [f"--het-group={i}"] if plan.heterogeneous else []
    words = " ".join(shlex.quote(w) for w in ["srun", *het, "--output"])
    rest = " ".join(shlex.quote(w) for w in [*where, "--wait=60", "--kill-on-bad-exit=1"])
    command = " ".join(_macro(w) for w in group.command.words())
    line = f"{words} {plan.log_path(group.role)} {rest} {command}"
    if not plan.heterogeneous:
        return line
    line += f" & pids[{i}]=$!"
    return line + "\n\nsleep 0\n" if i != len(plan.groups) - 1 else line


def nemo_run_templates() -> Path:
    """NeMo-Run's template dir, found without importing nemo_run."""
    spec = importlib.util.find_spec("nemo_run")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("nemo-run is not installed: pip install 'nemo-run>=0.11,<0.12'")
    return Path(next(iter(spec.submodule_search_locations))) / "core" / "execution" / "templates"


def render_sbatch(plan: SlurmPlan) -> str:
    """The sbatch script NeMo-Run submits for this plan (byte for byte)."""
    templates = nemo_run_templates()
    # The first group's executor carries the common env: NeMo-Run exports it at the top of the script.
    exports = _group_env(plan, 0)
    variables = {
        "sbatch_command": " ".join(SBATCH_COMMAND),
        "sbatch_flags": _sbatch_flags(plan),
        "max_retries": 0,
        "env_vars": [f"export {k}={_macro(v)}" for k, v in exports],
        "head_node_ip_var": MACROS["head_node_ip_var"],
        "setup_lines": "\n".join(plan.setup) or None,
        "memory_measure": None,
        "srun_commands": [_srun(plan, i, g) for i, g in enumerate(plan.groups)],
        "group_env_vars": [
            [f"export {k}={_macro(v)}" for k, v in _group_env(plan, i)] for i in range(len(plan.groups))
        ]
        if plan.heterogeneous
        else [],
        "heterogeneous": plan.heterogeneous,
        "run_as_group": plan.heterogeneous,
        "monitor_group_job": plan.heterogeneous,
        "monitor_group_job_wait_time": 1,
        "het_group_host_var": MACROS["het_group_host_var"],
        "ft_enabled": False,
    }
    script = nemo_run_sbatch.render(templates, variables)
    if not plan.container_image:
        script = script.replace(RUNDIR, plan.task_dir)
    return script


def _group_env(plan: SlurmPlan, i: int) -> list[tuple[str, str]]:
    return [*plan.env, *plan.groups[0].env] if i == 0 else list(plan.groups[i].env)


def render_text(plan: SlurmPlan) -> str:
    """What --dry-run shows: the submit command, the secrets file (names only), then the script."""
    head = [f"# submitted with: {' '.join(SBATCH_COMMAND)} {plan.experiment.sbatch_script(plan.task)}"]
    if plan.secret_names:
        head.append(
            f"# {plan.paths.job_dir}/{SECRETS_FILE} (mode 0600) exports: {', '.join(plan.secret_names)}"
        )
    head += [f"# note: {note}" for note in plan.notes]
    return "\n".join(head) + "\n" + render_sbatch(plan)


# ----------------------------------------------------------------------------- submission (NeMo-Run)


def tunnel(run: ModuleType, profile: SlurmProfile, job_dir: str) -> Any:
    """NeMo-Run's way to the cluster a profile names: this machine (`tunnel: local`) or SSH, rooted at `job_dir`."""
    if profile.tunnel == "local":
        return run.LocalTunnel(job_dir=job_dir)
    return run.SSHTunnel(
        host=profile.host or "", user=profile.user or "", job_dir=job_dir, identity=profile.identity
    )


def executors(run: ModuleType, plan: SlurmPlan, profile: SlurmProfile) -> list[Any]:
    """One SlurmExecutor per group, as NeMo-Run merges them into a heterogeneous job."""
    from nemotron.launch.nemo_run_slurm import QuotedJobDetails

    base = run.SlurmExecutor(
        **plan.executor_args(),
        tunnel=tunnel(run, profile, plan.paths.nemorun_jobs),
        packager=run.Packager(),
        poll_estimated_start_time=False,
        job_name_prefix=JOB_NAME_PREFIX,
        job_details=QuotedJobDetails(),
    )
    out = []
    for i, group in enumerate(plan.groups):
        env = dict(plan.env) | dict(group.env) if i == 0 else dict(group.env)
        fields: dict[str, Any] = {
            "nodes": group.nodes,
            "ntasks_per_node": group.ntasks_per_node,
            "gpus_per_node": group.gpus_per_node,
            "env_vars": env,
        }
        if plan.heterogeneous:
            fields |= {"heterogeneous": True, "wait_time_for_group_job": 0, "monitor_group_job_wait_time": 1}
        out.append(replace(base, **fields))
    return out


def scripts(run: ModuleType, plan: SlurmPlan) -> list[Any]:
    return [
        run.Script(
            path=g.command.path,
            args=list(g.command.args),
            entrypoint=g.command.entrypoint,
            m=g.command.module,
        )
        for g in plan.groups
    ]


def submit_plan(run: ModuleType, plan: SlurmPlan, profile: SlurmProfile) -> str:
    """Submit detached through NeMo-Run; return its handle (slurm_tunnel://nemo_run/<slurm id>)."""
    ex, tasks = executors(run, plan, profile), scripts(run, plan)
    base_dir = str(PurePosixPath(plan.paths.nemorun_jobs).parent) if profile.tunnel == "local" else None
    with run.Experiment(
        EXPERIMENT_TITLE, id=plan.experiment.id, base_dir=base_dir, **QUIET_EXPERIMENT
    ) as exp:
        if plan.heterogeneous:
            exp.add(tasks, executor=ex, name=plan.task)
        else:
            exp.add(tasks[0], executor=ex[0], name=plan.task)
        exp.run(detach=True)
    return str(exp.jobs[0].handle)


def submit_job(job: Job[SlurmProfile], job_dir: Path, plan: SlurmPlan) -> dict[str, Any]:
    """Write the job's cluster-side files, submit the plan through NeMo-Run, return what status.json records."""
    profile = job.profile
    if plan.secret_names:
        token = {REWARD_TOKEN_ENV: secrets.token_urlsafe(24)} if REWARD_TOKEN_ENV in plan.secret_names else {}
        write_secrets(job, job_dir, plan.secret_names, token)
    with remote.nemo_run() as run:
        if profile.tunnel == "ssh":
            _upload(run, profile, job_dir, plan)
        handle = submit_plan(run, plan, profile)
    return {
        "handle": handle,
        "remote_id": handle.rsplit("/", 1)[-1],
        "remote_dir": plan.task_dir,
        "roles": [g.role for g in plan.groups],
    }


def _upload(run: ModuleType, profile: SlurmProfile, job_dir: Path, plan: SlurmPlan) -> None:
    """SSH: the step reads its record from the cluster-side job dir."""
    ssh = tunnel(run, profile, plan.paths.nemorun_jobs)
    ssh.connect()
    ssh.run(f"mkdir -p {shlex.quote(plan.paths.job_dir)}/logs {shlex.quote(plan.paths.job_dir)}/checkpoints")
    for path in sorted(p for p in job_dir.iterdir() if p.is_file()):
        ssh.put(str(path), f"{plan.paths.job_dir}/{path.name}")
    ssh.run(f"chmod 600 {shlex.quote(plan.paths.job_dir)}/.secrets.*")
