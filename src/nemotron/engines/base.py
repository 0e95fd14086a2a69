"""The Engine interface: a compiled Job in, what an executor must run out (pure, no I/O).

An engine never knows which executor runs it, and an executor never asks which engine it runs: the engine
answers with one of two launch shapes, and every executor knows how to place both (or refuses one, exit 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from nemotron.compile import Job
from nemotron.registry import load


@dataclass(frozen=True)
class Placement:
    """Where the executor puts the job: the job dir as the nodes see it, and the resources of the profile."""

    job_dir: str
    nodes: int = 1
    gpus_per_node: int = 0


@dataclass(frozen=True)
class StepProcess:
    """Our own step process (`python -m nemotron.run_step`, torchrun when the step is distributed), with rm/serve
    beside it where the manifest asks. The step registers its outputs itself."""


@dataclass(frozen=True)
class RayDriver:
    """A Ray cluster across every node of the placement, in `image`; `driver` runs once on the head, then
    `finalize` (only if the driver succeeded). After the job succeeds, each of `outputs` (our output name, the
    path the run leaves it at) is registered as the step's artifact, with lineage to the job's inputs."""

    image: str  # "": no container, the nodes' own environment
    driver: str
    finalize: str = ""
    files: tuple[tuple[str, str], ...] = ()  # (name, text) written into the job dir before launch
    outputs: tuple[tuple[str, str], ...] = ()
    shown: str = ""  # what --dry-run prints before the executor's text (the engine's compiled config)

    @property
    def command(self) -> str:
        """The whole head-node payload as one shell text: the driver, then finalize when it succeeded."""
        return f"{self.driver} && {self.finalize}" if self.finalize else self.driver


Launch = StepProcess | RayDriver


class Engine(Protocol):
    """Turns a compiled Job into the launch an executor runs. Raises UserError (exit 2, naming the keys) for
    anything the engine cannot express, before anything is written or submitted."""

    name: str

    def launch(self, job: Job, where: Placement) -> Launch: ...


# backend name -> "module:Class"; imported on first use so the CLI's start-up stays light.
ENGINES: dict[str, str] = {
    "builtin": "nemotron.engines.builtin:BuiltinEngine",
    "nemo_rl": "nemotron.engines.nemo_rl:NemoRLEngine",
}


def engine_named(name: str) -> Engine:
    engine: Engine = load(ENGINES, name, "backend")
    return engine


def engine_for(job: Job) -> Engine:
    """The engine a job's config names (`backend`, default builtin)."""
    return engine_named(str(job.config.get("backend") or "builtin"))
