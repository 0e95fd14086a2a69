"""Fault injection for the reliability tests: `NEMOTRON_FAULT=POINT@STEP` makes the step SIGKILL itself at that
point (rollout, optimizer, checkpoint) of that step, the way a node failure or the OOM killer would.
`NEMOTRON_FAULT=stall@STEP` makes it hang at the rollout of that step for `NEMOTRON_FAULT_STALL_S` seconds
(default 600) on its first start only (SLURM_RESTART_COUNT unset or 0), so a test can requeue a job mid-run and
watch the restart finish. Unset, it does nothing.

`NEMOTRON_SLOW=POINT:SECONDS[,POINT:SECONDS]` (test-only) sleeps that long at every pass of that point: `train`
(the trainer, after each update of an asynchronous run) and `generate` (the generator process, after each batch),
so a test can make either side the slow one."""

from __future__ import annotations

import os
import signal
import time


def inject(point: str, step: int) -> None:
    spec = os.environ.get("NEMOTRON_FAULT")
    if not spec:
        return
    name, _, at = spec.partition("@")
    if name == "stall" and point == "rollout" and int(at) == step:
        if int(os.environ.get("SLURM_RESTART_COUNT") or 0) == 0:
            print(f"nemotron: stalling at step {step} (NEMOTRON_FAULT={spec})", flush=True)
            time.sleep(float(os.environ.get("NEMOTRON_FAULT_STALL_S", "600")))
        return
    if name == point and (not at or int(at) == step):
        os.kill(os.getpid(), signal.SIGKILL)


def slow(point: str) -> None:
    spec = os.environ.get("NEMOTRON_SLOW")
    if not spec:
        return
    for part in spec.split(","):
        name, _, seconds = part.partition(":")
        if name == point:
            time.sleep(float(seconds))
