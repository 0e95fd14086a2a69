"""The built-in engine: our own torch trainers, run as the step's process on any executor."""

from __future__ import annotations

from nemotron.compile import Job
from nemotron.engines.base import Launch, Placement, StepProcess
from nemotron.errors import UserError


class BuiltinEngine:
    name = "builtin"

    def launch(self, job: Job, where: Placement) -> Launch:
        from nemotron.engines.refusals import builtin_refusals

        refused = builtin_refusals(job.config)
        if refused:
            raise UserError(
                f"these keys act only on backend=nemo_rl; {job.step_id} runs on backend=builtin:", refused
            )
        return StepProcess()
