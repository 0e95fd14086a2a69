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


def _watch(live: Liveness, tmp: Path) -> subprocess.CompletedProcess[str]:
    """The batch script with the stubs: liveness, then a command that outlives two checks (its last line, `kill`
    of a watchdog that already ended, may fail: what counts is what the watchdog did)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for name, text in STUBS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    script = "\n".join(["set -uo pipefail", *lines(live), "sleep 2.5", stop_line(live), ""])
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_LOG": str(tmp / "scancel.log"),
           "SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "0"}  # fmt: skip
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)


def _run(job_dir: Path, tmp: Path, stale: bool) -> subprocess.CompletedProcess[str]:
    beats = job_dir / "heartbeats" / "42-0"
    beats.mkdir(parents=True)
    if stale:  # node2 beat once, long ago
        (beats / "node2").touch()
        old = time.time() - 100
        os.utime(beats / "node2", (old, old))
    return _watch(Liveness(str(job_dir), (2,), interval_s=1, timeout_s=3), tmp)


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


def _run_progress(job_dir: Path, tmp: Path, beacons: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The watchdog of a one-node job (no heartbeats) over the given beacon lines, for two checks."""
    from nemotron.runtime.progress import Bounds

    folder = job_dir / "progress" / "42-0"
    folder.mkdir(parents=True)
    for name, line in beacons.items():
        (folder / name).write_text(line)
    return _watch(
        Liveness(str(job_dir), (), interval_s=1, timeout_s=3, progress=Bounds(6, 3, 60, 60, 60)), tmp
    )


def test_every_rank_past_its_deadline_fails_the_job_naming_the_last_to_progress(tmp_path: Path) -> None:
    now = int(time.time())
    job_dir = tmp_path / "job dir"
    done = _run_progress(
        job_dir,
        tmp_path,
        {  # deadline section step node rank pid written
            "node1.11": f"{now - 20} step 12 node1 0 11 {now - 32}\n",
            "node2.22": f"{now - 5} checkpoint 12 node2 1 22 {now - 55}\n",  # the newest deadline
            "node1.33": f"0 serving 0 node1 0 33 {now - 99}\n",  # a served model beside them: not watched
        },
    )
    seen = json.loads((job_dir / "liveness.json").read_text())
    assert seen["kind"] == "progress"
    assert (seen["node"], seen["rank"], seen["section"], seen["step"]) == ("node2", 1, "checkpoint", 12)
    assert seen["bound_s"] == 50 and seen["silent_s"] >= 55
    assert "rank 0 on node1: step after step 12" in seen["ranks"] and "serving" not in seen["ranks"]
    assert "nemotron: liveness: no progress from any of 2 rank(s)" in done.stderr
    assert (tmp_path / "scancel.log").read_text().split() == ["42.0", "42.1"]


def test_one_rank_within_its_deadline_keeps_the_job(tmp_path: Path) -> None:
    """A main rank in a long validation: the rank waiting for it at the next collective is past its step
    deadline, but the job as a whole is not stuck."""
    now = int(time.time())
    job_dir = tmp_path / "job"
    _run_progress(
        job_dir,
        tmp_path,
        {
            "node1.11": f"{now + 600} validation 3 node1 0 11 {now - 100}\n",
            "node2.22": f"{now - 50} step 3 node2 1 22 {now - 100}\n",
        },
    )
    assert not (job_dir / "liveness.json").exists() and not (tmp_path / "scancel.log").exists()


def test_no_watched_rank_is_never_judged(tmp_path: Path) -> None:
    now = int(time.time())
    job_dir = tmp_path / "job"
    _run_progress(job_dir, tmp_path, {"node1.11": f"0 done 40 node1 0 11 {now - 900}\n"})
    assert not (job_dir / "liveness.json").exists() and not (tmp_path / "scancel.log").exists()
