"""Servers a test starts and talks to (`python -m nemotron.X ...`), started as the suite starts its CLI: forked from
the run's warm server when the suite runs warm (scripts/test.sh sets NEMOTRON_WARM_CLI=1; nemotron.warm), so each
one does not import torch and transformers again (about 9 of its ~10 CPU-seconds), else a plain Popen. Either way
a real process of its own: its pid, signals, exit code, environment and output are a cold one's."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from nemotron import warm
from nemotron.core import procs
from nemotron.warm.cli import CLI_ENV


def start_module(cmd: Sequence[str], env: Mapping[str, str], output: IO[bytes] | None) -> Any:
    """`cmd` ([sys.executable, "-m", "nemotron.X", ...]) with `env`, its stdout and stderr both to `output` (a file
    open for writing; None: /dev/null), as nemotron.core.procs.start starts a step's reward server (a session of its
    own, dying with this process): a warm.WarmChild or a subprocess.Popen, which the caller uses alike (pid, args,
    poll, wait, send_signal, terminate, kill)."""
    env = dict(env)
    if os.environ.get(CLI_ENV) == "1":
        env[warm.ENABLE_ENV] = "1"
    return procs.start(cmd, env, output if output is not None else subprocess.DEVNULL)


def run_to_exit_0(
    cmd: Sequence[str], env: Mapping[str, str], cwd: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """`cmd` run to its end in `cwd` with `env`, its output captured as text; it must exit 0 (the assertion shows
    the end of its stderr)."""
    done = subprocess.run(
        list(cmd), capture_output=True, text=True, env=dict(env), cwd=cwd, timeout=timeout, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def two_ranks(script: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[bytes]:
    """`script ARGS` on two local ranks under torchrun (gloo on CPU), checked: a script of the test's own that
    exercises a collective path of the library."""
    import sys

    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(script),
    ]
    return subprocess.run([*command, *args], check=True, timeout=timeout, capture_output=True)
