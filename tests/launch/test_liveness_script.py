"""The watchdog's shell (launch/liveness.py) run by bash with stub `srun`/`squeue`/`scancel`: a node whose heartbeat
file is older than the bound is recorded in liveness.json and the job's numbered steps are cancelled (not the
batch step); with every node beating, nothing happens. The real thing runs in tests/slurm/test_liveness.py."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from nemotron.launch.liveness import Liveness, lines, stop_line

STUBS = {
    # the heartbeat step runs its loop here, as node1
    "srun": '#!/bin/bash\nwhile [ "$1" != bash ]; do shift; done\nSLURMD_NODENAME=node1 exec "$@"\n',
    "squeue": '#!/bin/bash\nprintf "42.0\\n42.1\\n42.batch\\n42.extern\\n"\n',
    "scancel": '#!/bin/bash\necho "$@" >> "$STUB_LOG"\n',
}


def _run(job_dir: Path, tmp: Path, stale: bool) -> subprocess.CompletedProcess[str]:
    live = Liveness(str(job_dir), (2,), interval_s=1, timeout_s=3)
    beats = job_dir / "heartbeats" / "42-0"
    beats.mkdir(parents=True)
    if stale:  # node2 beat once, long ago
        (beats / "node2").touch()
        old = time.time() - 100
        os.utime(beats / "node2", (old, old))
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for name, text in STUBS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    # the batch script: liveness, then a command that outlives two checks
    script = "\n".join(["set -uo pipefail", *lines(live), "sleep 2.5", stop_line(live), ""])
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_LOG": str(tmp / "scancel.log"),
           "SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "0"}  # fmt: skip
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)


def test_a_silent_node_is_recorded_and_the_job_steps_cancelled(tmp_path: Path) -> None:
    job_dir = tmp_path / "job dir $(x)"  # quoted everywhere
    done = _run(job_dir, tmp_path, stale=True)
    assert done.returncode == 0, done.stderr
    seen = json.loads((job_dir / "liveness.json").read_text())
    assert seen["node"] == "node2" and seen["silent_s"] >= 100 and seen["bound_s"] == 3
    assert "nemotron: liveness: node node2 sent no heartbeat" in done.stderr
    assert (tmp_path / "scancel.log").read_text().split() == ["42.0", "42.1"]  # not the batch step


def test_with_every_node_beating_the_watchdog_does_nothing(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    done = _run(job_dir, tmp_path, stale=False)
    assert done.returncode == 0, done.stderr
    assert not (job_dir / "liveness.json").exists() and not (tmp_path / "scancel.log").exists()
