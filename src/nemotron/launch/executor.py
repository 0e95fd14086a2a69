"""The Executor interface: where a compiled Job runs. One class per executor kind (local, slurm, lepton),
found through `EXECUTORS` by the profile's `executor`; nothing outside this registry asks which kind it has.

Every executor places the launch shapes an engine can answer with (`StepProcess`, `RayDriver`, `HetJob`) or refuses
one with exit 2 before anything is written. `render` is pure and is exactly what `submit` sends. Each is typed on its
own profile class (`Executor[SlurmProfile]` takes `Job[SlurmProfile]`): `executor_for` hands it only a job on that
class, so no executor asks which profile it holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, TypeVar

from nemotron.compile import Job
from nemotron.config.profiles import AnyProfile
from nemotron.core.registry import load
from nemotron.engines.base import Launch
from nemotron.plan.placement import Placement

P = TypeVar("P", bound=AnyProfile)


class Executor(Protocol[P]):
    kind: str
    # refresh asks nothing but this machine: cheap enough for every row of `jobs ls`
    cheap_refresh: bool
    # the profile class it places jobs on: the one its `kind` names (nemotron.config.profiles)
    profile: type[P]

    def placement(self, job: Job[P]) -> Placement:
        """The job dir as the nodes see it, and the nodes and GPUs per node the profile asks for."""
        ...

    def render(self, job: Job[P], where: Placement, launch: Launch) -> str:
        """The text `--dry-run` prints under `## launch` and `submit` sends (a command, an sbatch script, a spec)."""
        ...

    def submit(self, job: Job[P], job_dir: Path, where: Placement, launch: Launch) -> int:
        """Start the job whose record is `job_dir`; attached: stream it and return its exit code; batch: 0."""
        ...

    def refresh(self, job_dir: Path) -> dict[str, Any]:
        """The job's status, updated from the scheduler where it has one."""
        ...

    def print_logs(self, job_dir: Path, follow: bool) -> None: ...

    def cancel(self, job_dir: Path) -> dict[str, Any]: ...


# profile `executor` -> "module:Class"; imported on first use (the Slurm and Lepton modules pull in more).
EXECUTORS: dict[str, str] = {
    "local": "nemotron.launch.local_executor:LocalExecutor",
    "slurm": "nemotron.launch.slurm_executor:SlurmExecutor",
    "lepton": "nemotron.launch.lepton:LeptonExecutor",
}


def executor_named(kind: str) -> Executor[Any]:
    executor: Executor[Any] = load(EXECUTORS, kind, "executor")
    return executor


def executor_for(job: Job) -> Executor[Any]:
    """The executor of the job's profile, typed on that profile's class: the one place that checks the pairing."""
    executor = executor_named(job.profile.executor)
    if not isinstance(job.profile, executor.profile):
        raise TypeError(
            f"the {executor.kind} executor places {executor.profile.__name__}s, not {job.profile!r}"
        )
    return executor


def executor_of(job_dir: Path) -> Executor[Any]:
    """The executor a recorded job ran on."""
    from nemotron.jobs.dirs import read_record

    return executor_named(read_record(job_dir).executor)
