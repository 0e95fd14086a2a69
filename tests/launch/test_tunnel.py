"""The one tunnel builder of the Slurm executor (`slurm_script.tunnel`): NeMo-Run's LocalTunnel for `tunnel: local`,
its SSHTunnel with the profile's host, user and identity otherwise. Checked against nemo_run's own classes, in a
subprocess (importing nemo_run fixes NEMORUN_HOME for the importing process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import json
    import nemo_run as run
    from nemotron.launch.slurm_script import tunnel
    from nemotron.config.profiles import SlurmProfile

    local = tunnel(run, SlurmProfile(executor="slurm", tunnel="local"), "/jobs/here")
    ssh = tunnel(
        run,
        SlurmProfile(executor="slurm", tunnel="ssh", host="login.example", user="me", identity="/home/me/.ssh/id"),
        "/lustre/me/nemo_run",
    )
    print(json.dumps([type(local).__name__, local.job_dir, type(ssh).__name__, ssh.host, ssh.user, ssh.identity,
                      ssh.job_dir]))
    """
)


def test_local_and_ssh_profiles_get_nemo_runs_tunnels(tmp_path: Path) -> None:
    env = {**os.environ, "NEMORUN_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, env=env)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [
        "LocalTunnel",
        "/jobs/here",
        "SSHTunnel",
        "login.example",
        "me",
        "/home/me/.ssh/id",
        "/lustre/me/nemo_run",
    ]
