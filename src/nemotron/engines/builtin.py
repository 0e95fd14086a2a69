"""The built-in engine: our own torch trainers, run as the step's process on any executor."""

from __future__ import annotations

from nemotron.compile import Job
from nemotron.engines.base import Launch, Placement, StepProcess


class BuiltinEngine:
    name = "builtin"

    def launch(self, job: Job, where: Placement) -> Launch:
        return StepProcess()
