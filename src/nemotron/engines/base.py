"""The Engine interface: a compiled Job in, what an executor must run out (pure, no I/O).

An engine never knows which executor runs it, and an executor never asks which engine it runs: the engine
answers with one of three launch shapes, and every executor knows how to place each (or refuses it, exit 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

from nemotron.compile import Job
from nemotron.config.backends import ENGINES
from nemotron.core.registry import load
from nemotron.errors import UserError
from nemotron.plan.placement import Placement


@dataclass(frozen=True)
class StepProcess:
    """Our own step process (`python -m nemotron.run_step`, torchrun when the step is distributed), with rm/serve
    beside it where the manifest asks. The step registers its outputs itself."""

    external: ClassVar[bool] = False  # an external engine's run, whose `outputs` the launcher registers
    outputs: ClassVar[tuple[tuple[str, str], ...]] = ()  # none: the step registers its outputs itself
    shown: ClassVar[str] = ""  # nothing compiled to show before the executor's text


@dataclass(frozen=True)
class RayDriver:
    """A Ray cluster across every node of the placement, in `image`; `driver` runs once on the head, then
    `finalize` (only if the driver succeeded). After the job succeeds, each of `outputs` (our output name, the
    path the run leaves it at) is registered as the step's artifact, with lineage to the job's inputs."""

    external: ClassVar[bool] = True
    image: str  # "": no container, the nodes' own environment
    driver: str
    finalize: str = ""
    files: tuple[tuple[str, str], ...] = ()  # (name, text) written into the job dir before launch
    outputs: tuple[tuple[str, str], ...] = ()
    shown: str = ""  # what --dry-run prints before the executor's text (the engine's compiled config)
    # a regular expression matching the driver's log line at each training step: the watchdog times the steps
    # by it (launch/ray_watchdog.py, "Progress"); "": every line is progress, and the pace is not known
    step_line: str = ""

    @property
    def command(self) -> str:
        """The whole head-node payload as one shell text: the driver, then finalize when it succeeded."""
        return f"{self.driver} && {self.finalize}" if self.finalize else self.driver


@dataclass(frozen=True)
class HetGroup:
    """One component of a heterogeneous job: `argv` (plain words; the executor quotes each) runs as `nodes` x
    `tasks_per_node` tasks with `env` (name, plain value) exported. `waits_for` names (host variable, port
    variable) of servers it must reach first: the executor sets each host variable to the first host of the
    group whose index is its position, and each port variable from `HetJob.ports`."""

    role: str
    argv: tuple[str, ...]
    nodes: int = 1
    tasks_per_node: int = 1
    env: tuple[tuple[str, str], ...] = ()
    waits_for: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class HetJob:
    """A heterogeneous Slurm job of an external engine's own scripts in `image`: the server groups first (group i
    is the server of the trainer's i-th `waits_for`), the trainer last; the job ends when any group ends. After it
    succeeds, each of `outputs` (our output name, the path the run leaves it at) is registered as the step's
    artifact, with lineage to the job's inputs."""

    external: ClassVar[bool] = True
    image: str  # "": no container, the nodes' own environment
    groups: tuple[HetGroup, ...]
    outputs: tuple[tuple[str, str], ...] = ()
    # (variable, offset): exported before the groups start, the executor's per-job port plus the offset
    ports: tuple[tuple[str, int], ...] = ()
    shown: str = ""  # what --dry-run prints before the executor's text (the engine's compiled commands)
    # shell run by the last group's first task once it succeeded, before the outputs are registered
    finalize: str = ""
    # shell run once by the last group's first task before its script (the data files the script reads, made in the
    # job dir); the group's other tasks wait for it, and the job fails when it fails
    prepare: str = ""
    # why the job cannot run on this machine's local executor, and what to do instead
    local_hint: str = "on this machine use backend=builtin"
    # the backends that run the step off Slurm (on Lepton); "" when there is none
    elsewhere: str = "backend=nemo_rl / builtin"


Launch = StepProcess | RayDriver | HetJob


class Engine(Protocol):
    """Turns a compiled Job into the launch an executor runs. Raises UserError (exit 2, naming the keys) for
    anything the engine cannot express, before anything is written or submitted."""

    name: str

    def launch(self, job: Job, where: Placement) -> Launch: ...


def pinned_or_profile(job: Job, field: str, pinned: str) -> str:
    """What an external engine runs with: the profile's `field` when it sets one (an image "" means the nodes' own
    environment), else the pinned value from `nemotron.config.targets`."""
    chosen = getattr(job.profile, field, None)
    return pinned if chosen is None else str(chosen)


def engine_named(name: str) -> Engine:
    engine: Engine = load(ENGINES, name, "backend")
    return engine


def engine_for(job: Job) -> Engine:
    """The engine a job's config names (`backend`, default builtin)."""
    return engine_named(job.backend)


def recipe_for(step_id: str, engine: str, what: str) -> str:
    """The engine's recipe for a step, as the step's manifest declares it (`[step] engines`); a step that declares
    none for `engine` is refused (exit 2) naming the steps that do. `what` is what the step lacks ("NeMo-RL mapping")."""
    from nemotron.catalog import Catalog

    catalog = Catalog()
    recipe = catalog.get(step_id).manifest.step.engines.get(engine)
    if recipe is None:
        runs = [s.id for s in catalog.steps.values() if engine in s.manifest.step.engines]
        raise UserError(f"backend={engine} runs {', '.join(runs)}; {step_id} has no {what}")
    return recipe
