"""What the tests on the local Slurm cluster share (imported as `tests.slurm.jobs`): the CLI run as a user runs
it, in the environment a test gives it; waiting for the cluster to get somewhere; and the profiles whose
backend=nemo_rl jobs run tests/fixtures/fake_nemo_rl as NeMo-RL."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

FAKE_NEMO_RL = Path(__file__).resolve().parents[1] / "fixtures" / "fake_nemo_rl"
# the jobs' PATH: the fake's bin first, then this venv's (nemotron, ray)
FAKE_NEMO_RL_PATH = f"{FAKE_NEMO_RL / 'bin'}:{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"


def nemotron(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`python -m nemotron ARGS` in exactly the environment `env`."""
    return subprocess.run(
        [sys.executable, "-m", "nemotron", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def wait_for(
    predicate: Callable[[], Any], timeout_s: float, what: str, detail: Callable[[], Any] | None = None
) -> None:
    """Until `predicate()`; past `timeout_s` fail, with `detail()` (the cluster and the job's log) when given."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s" + (
            f"\n{detail()}" if detail else ""
        )
        time.sleep(0.5)


def fake_nemo_rl_profile(name: str, extends: str = "local_slurm", **env_vars: str) -> str:
    """The env.toml section of profile NAME: two nodes, one CPU a task, the fake NeMo-RL as NeMo-RL (no image),
    and `env_vars` in its jobs' environment beside the PATH that finds the fake."""
    variables = ", ".join(f'{k} = "{v}"' for k, v in {"PATH": FAKE_NEMO_RL_PATH, **env_vars}.items())
    return f"""
[{name}]
extends = "{extends}"
nodes = 2
cpus_per_task = 1
nemo_rl_image = ""
nemo_rl_dir = "{FAKE_NEMO_RL}"
env_vars = {{ {variables} }}
"""
