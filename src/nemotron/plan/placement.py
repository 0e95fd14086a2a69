"""Where a job runs, as the executor places it: what the plan sizes the groups for, and what an engine lays its
launch out on (nemotron.engines.base.Engine.launch)."""

from __future__ import annotations

from typing import NamedTuple


class Placement(NamedTuple):
    """Where the executor puts the job: the job dir as the nodes see it, the resources of the profile, and whether
    that is this machine (its paths, RAM and store are this machine's: the local executor's jobs)."""

    job_dir: str
    nodes: int = 1
    gpus_per_node: int = 0
    here: bool = False
    # the ranks a torchrun step starts on each node: its GPUs, else the profile's CPU processes
    ranks_per_node: int = 1
