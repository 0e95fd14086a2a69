"""`python -m nemotron.launch.torchrun_agent ARGS`: torchrun (`torch.distributed.run`) with Slurm's time-limit
warning (SIGUSR1, `nemotron.runtime.preempt`) ignored in the agent. Slurm signals every process of the step; the
agent catches no SIGUSR1 and would die of it, taking the ranks with it before they can checkpoint."""

from __future__ import annotations

import runpy

from nemotron.runtime import preempt

if __name__ == "__main__":
    preempt.ignore()
    runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
