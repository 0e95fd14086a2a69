"""Slurm's warning before a job's time limit (`#SBATCH --signal=USR1@N`, the profile's `time_limit_signal_s`):
the step notes it here, saves a checkpoint at the end of the training step it is in, and asks Slurm to requeue
the job, whose next start resumes from that checkpoint (docs/cluster.md, "Preemption and resume").

torch-free: `nemotron.run_step` installs the handler before the step script imports anything, so the signal is
never fatal (SIGUSR1's default action ends a process).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
from types import FrameType

log = logging.getLogger("nemotron")

SIGNAL = signal.SIGUSR1
SIGNAL_NAME = "USR1"
_state = {"warned": False}


def _on_warning(signum: int, frame: FrameType | None) -> None:
    # Only a flag: the training loop acts on it between steps, where a checkpoint is consistent.
    _state["warned"] = True


def install() -> None:
    """Catch the warning signal in this process (the step; torchrun's workers each call it through run_step)."""
    signal.signal(SIGNAL, _on_warning)


def ignore() -> None:
    """Processes of the job that do not checkpoint (torchrun's agent) must not die of the warning either; the
    ignored disposition is inherited by the workers until run_step installs the handler."""
    signal.signal(SIGNAL, signal.SIG_IGN)


def warned() -> bool:
    """True once this process got the time-limit warning."""
    return _state["warned"]


def handled() -> None:
    """The checkpoint the warning asked for is written: the next training step does not save again."""
    _state["warned"] = False


def requeue_self() -> bool:
    """`scontrol requeue $SLURM_JOB_ID` (Slurm then stops this run and starts the job again). False when this is
    not a Slurm batch job or Slurm refused; the run then goes on until its time limit."""
    job = os.environ.get("SLURM_JOB_ID")
    scontrol = shutil.which("scontrol")
    if not job or scontrol is None:
        return False
    done = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        log.warning("could not requeue Slurm job %s: %s", job, done.stderr.strip()[-500:])
        return False
    return True
