"""Liveness on the real local 2-node Slurm: a multi-node job whose worker node dies (its processes killed) or hangs
(its processes stopped, SIGSTOP, as a hung node that does not exit) ends `failed` within the bound, says which
node and what was seen, releases its allocation and registers nothing; `jobs ls` and `jobs status` agree.

The heartbeat interval and bound are seconds here (the profile's heartbeat_interval_s / heartbeat_timeout_s;
30 s / 120 s by default)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from tests.slurm.jobs import fake_nemo_rl_profile, nemotron, wait_for

STEPS = Path(__file__).resolve().parent / "steproot"
NODE_FAILS = Path(__file__).resolve().parents[1] / "fixtures" / "torchrun_node_fails"
INTERVAL_S, TIMEOUT_S = 2, 8
# the bound a user can count on: the silence bound, one check interval, Slurm's KillWait (5 s here) to end the
# steps, and a margin for this loaded machine (sacct's End has whole seconds)
BOUND_S = TIMEOUT_S + INTERVAL_S + 5 + 10
# a rank's progress allowance here: the floor (a round takes 0.2 s, so 3 x its pace stays under it)
PROGRESS_FLOOR_S = 6
PROGRESS_BOUND_S = PROGRESS_FLOOR_S + INTERVAL_S + 5 + 10

pytestmark = pytest.mark.slurm


@pytest.fixture
def env(home: Path, tmp_path: Path) -> dict[str, str]:
    (tmp_path / "env.toml").write_text(f"""
[watched]
extends = "local_slurm"
nodes = 2
cpus_per_task = 1
heartbeat_interval_s = {INTERVAL_S}
heartbeat_timeout_s = {TIMEOUT_S}

[watched_progress]
extends = "local_slurm"
nodes = 2
cpus_per_task = 1
heartbeat_interval_s = {INTERVAL_S}
heartbeat_timeout_s = {TIMEOUT_S}
progress_floor_s = {PROGRESS_FLOOR_S}
progress_pace_factor = 3
progress_startup_s = 120

[node2_never_starts]
extends = "local_slurm"
nodes = 2
cpus_per_task = 1
python = "{NODE_FAILS}/python"
env_vars = {{ NEMOTRON_TEST_REAL_PYTHON = "{sys.executable}" }}

[watched_hetjob]
extends = "local_slurm"
heartbeat_interval_s = {INTERVAL_S}
heartbeat_timeout_s = {TIMEOUT_S}
{fake_nemo_rl_profile("ray2_slow", "watched", FAKE_NEMO_RL_SLEEP_S="300")}
{fake_nemo_rl_profile("ray2_stepping", "watched_progress", FAKE_NEMO_RL_STEP_S="0.5", FAKE_NEMO_RL_STEP_TASKS="1")}
progress_checkpoint_s = {PROGRESS_FLOOR_S}
progress_validation_s = {PROGRESS_FLOOR_S}
""")
    return {
        **os.environ,
        "COLUMNS": "200",
        "NEMOTRON_ENV_FILE": str(tmp_path / "env.toml"),
        "NEMOTRON_STEPS_PATH": str(STEPS),
    }


def processes_on(slurm_id: str, node: str) -> list[int]:
    """The job's processes on one node: the tasks slurmstepd started there and their children (their
    environment names the job and the node; both nodes share this host)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"SLURM_JOB_ID={slurm_id}".encode() in environ and f"SLURMD_NODENAME={node}".encode() in environ:
            found.append(int(proc.name))
    return found


def worker_node(slurm_id: str) -> str:
    """The job's node that does not run its batch script, where the watchdog runs (a hang of that node is Slurm's
    own health check's to notice, docs/cluster.md): node2 for a job on both nodes; either node for a hetjob, whose
    group 0 Slurm places on the busier node (best fit), and whose batch script runs there."""
    rows = subprocess.run(
        ["squeue", "-h", "-j", slurm_id, "-o", "%i %B"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    hosts = dict(row.split() for row in rows)
    batch = hosts.get(slurm_id) or hosts[f"{slurm_id}+0"]
    assert batch in ("node1", "node2"), hosts
    return "node2" if batch == "node1" else "node1"


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


@pytest.fixture
def cleanup() -> Iterator[list[str]]:
    """Slurm ids to cancel at teardown, and stopped processes to continue first (the cluster is shared)."""
    ids: list[str] = []
    yield ids
    for slurm_id in ids:
        signal_all(processes_on(slurm_id, "node1") + processes_on(slurm_id, "node2"), signal.SIGCONT)
        subprocess.run(["scancel", slurm_id], capture_output=True)


def _until_logged(
    home: Path, cluster: Any, job_id: str, slurm_id: str, says: str, timeout_s: float, what: str
) -> None:
    """Until the job's log says `says`; past `timeout_s` fail with the cluster's view of the job and the log's end."""
    wait_for(
        lambda: says in _logs(home, job_id),
        timeout_s,
        what,
        lambda: f"{cluster.describe(slurm_id)}\n{_logs(home, job_id)[-3000:]}",
    )


def _submit(env: dict[str, str], home: Path, cluster: Any, profile: str, *args: str) -> tuple[str, str]:
    """Submit and wait for the allocation: the tests' deadlines start once the job runs (a job the test before
    left completing can hold both nodes for a minute)."""
    done = nemotron(env, "steps", "run", *args, "-b", profile)
    assert done.returncode == 0, done.stderr[-4000:]
    job_id = done.stdout.strip().splitlines()[-1]
    status = json.loads((home / "jobs" / job_id / "status.json").read_text())
    slurm_id = str(status["remote_id"])
    try:
        cluster.wait_running(slurm_id)
    except AssertionError:
        subprocess.run(
            ["scancel", slurm_id], capture_output=True
        )  # the cluster is shared: leave nothing queued
        raise
    return job_id, slurm_id


def _shown(home: Path, cluster: Any, job_id: str, slurm_id: str) -> str:
    """The cluster's view of the job, its steps, its processes and the end of its logs (CI's machine is gone when
    its log is read)."""
    steps = subprocess.run(["squeue", "-h", "-s", "-j", slurm_id], capture_output=True, text=True)
    return (
        f"{cluster.describe(slurm_id)}\n$ squeue -h -s -j {slurm_id}\n{steps.stdout}{steps.stderr}\n"
        f"{processes_shown(slurm_id)}\n{_logs(home, job_id)[-4000:]}"
    )


def _logs(home: Path, job_id: str) -> str:
    remote = Path(json.loads((home / "jobs" / job_id / "status.json").read_text())["remote_dir"])
    return "".join(p.read_text(errors="replace") for p in remote.glob("*.out")) if remote.is_dir() else ""


def processes_shown(slurm_id: str) -> str:
    """The job's processes on each node, with their state (T: stopped) and command, for a failure message."""
    shown = []
    for node in ("node1", "node2"):
        for pid in processes_on(slurm_id, node):
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, IndexError):
                continue
            shown.append(f"{node} {pid} {state} {argv[:160]}")
    return "$ the job's processes (node pid state command)\n" + "\n".join(shown)


def slurm_end(slurm_id: str, detail: Callable[[], str] | None = None) -> float:
    """When Slurm ended the job (sacct's End, epoch seconds), once it has; past the wait, fail with `detail()`."""
    end = ""

    def ended() -> bool:
        nonlocal end
        out = subprocess.run(
            ["sacct", "-n", "-P", "-X", "-j", slurm_id, "-o", "State,End"], capture_output=True, text=True
        ).stdout.split("\n")[0]
        state, _, end = out.partition("|")
        return state.split(" ")[0] in ("FAILED", "COMPLETED", "CANCELLED", "TIMEOUT", "NODE_FAIL")

    wait_for(ended, BOUND_S + 60, "Slurm to end the job", detail)
    return datetime.fromisoformat(end).timestamp()


def _check_failed_in_bound(
    env: dict[str, str],
    home: Path,
    cluster: Any,
    job_id: str,
    slurm_id: str,
    broke_at: float,
    watchdog: bool = True,
    broken: str = "node2",
) -> None:
    """Slurm ended the job within BOUND_S of the break (sacct's End: what `jobs status` reports later depends on
    how often one asks), `jobs status` and `jobs ls` both say failed, nothing registered; `watchdog`: the
    watchdog must be what ended it, naming the `broken` node."""
    took = slurm_end(slurm_id, lambda: _shown(home, cluster, job_id, slurm_id)) - broke_at
    cluster.final_state(slurm_id, timeout_s=120)  # and out of squeue, which `jobs status` reads first
    shown = json.loads(nemotron(env, "jobs", "status", job_id, "--json").stdout)
    assert shown["state"] == "failed", shown
    assert took <= BOUND_S, f"ended {took:.0f} s after the break, bound {BOUND_S} s"
    if watchdog:
        assert shown["liveness"]["node"] == broken and "no heartbeat" in shown["error"], shown
        assert f"nemotron: liveness: node {broken} sent no heartbeat" in _logs(home, job_id)
    assert "registered" not in shown
    (row,) = [r for r in json.loads(nemotron(env, "jobs", "ls", "--json").stdout) if r["job_id"] == job_id]
    assert row["state"] == "failed"
    # the allocation is released: Slurm has nothing of the job running
    squeue = ["squeue", "-h", "-j", slurm_id]
    wait_for(
        lambda: not subprocess.run(squeue, capture_output=True, text=True).stdout.strip(), 30, "the release"
    )
    print(f"Slurm ended the job {took:.0f} s after the break (bound {BOUND_S} s)")


# The jobs that span both nodes: (profile, step and overrides), the log line that says it runs on both and what
# that waits for, and whether a frozen node2 is the watchdog's to end.
TWO_NODE_JOBS = {
    # NeMo-RL's driver over a Ray cluster of both nodes
    "nemo_rl_on_ray": (
        ("ray2_slow", "rl/rlhf", "-c", "tiny", "backend=nemo_rl", "eval.task=null"),
        ("alive Ray nodes", "the driver to start"),
        False,
    ),
    # built-in torchrun across two nodes: killed, rank 0's collective may fail by itself first (gloo sees the
    # closed socket); frozen, it waits forever, and only the watchdog ends the job
    "builtin_torchrun_across_two_nodes": (
        ("watched", "test/ranks", "-c", "tiny", "rounds=100000", "sleep_s=0.2"),
        ("2 ranks agree", "both ranks to run"),
        True,
    ),
}


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
@pytest.mark.parametrize("kind", list(TWO_NODE_JOBS))
def test_a_two_node_job_fails_within_the_bound_when_node2_dies_or_hangs(
    env: dict[str, str], home: Path, kind: str, sig: signal.Signals, cleanup: list[str], slurm_cluster: Any
) -> None:
    job, (running, waiting_for), frozen_is_the_watchdogs = TWO_NODE_JOBS[kind]
    job_id, slurm_id = _submit(env, home, slurm_cluster, *job)
    cleanup.append(slurm_id)
    _until_logged(home, slurm_cluster, job_id, slurm_id, running, 150, waiting_for)
    assert worker_node(slurm_id) == "node2"
    wait_for(lambda: processes_on(slurm_id, "node2"), 30, "the job's processes on node2")
    broke_at = time.time()
    signal_all(processes_on(slurm_id, "node2"), sig)
    watchdog = frozen_is_the_watchdogs and sig == signal.SIGSTOP
    _check_failed_in_bound(env, home, slurm_cluster, job_id, slurm_id, broke_at, watchdog=watchdog)


def test_a_hetjob_fails_within_the_bound_when_its_worker_node_hangs(
    env: dict[str, str], home: Path, cleanup: list[str], slurm_cluster: Any
) -> None:
    """The step beside its reward server (group 0, the server, on the node with the batch script and the watchdog;
    group 1, the step, on the other): each group's nodes beat, and the watchdog cancels the steps of both groups.
    The step stalls at step 2 so that only the watchdog can end it. Group 0 lands on node2 when node2 is the busier
    (a CI run froze node2 there, the watchdog with it, and waited out the bound)."""
    env = {**env, "NEMOTRON_FAULT": "stall@2", "NEMOTRON_FAULT_STALL_S": "300"}
    args = ["rl/reinforce", "-c", "tiny", "trainer.max_steps=4", "eval.num_prompts=0"]
    job_id, slurm_id = _submit(env, home, slurm_cluster, "watched_hetjob", *args)
    cleanup.append(slurm_id)
    _until_logged(
        home, slurm_cluster, job_id, slurm_id, "stalling at step 2", 180, "the step to reach step 2"
    )
    worker = worker_node(slurm_id)
    broke_at = time.time()
    signal_all(processes_on(slurm_id, worker), signal.SIGSTOP)
    _check_failed_in_bound(env, home, slurm_cluster, job_id, slurm_id, broke_at, broken=worker)


def _failed_on_progress(
    env: dict[str, str], home: Path, cluster: Any, job_id: str, slurm_id: str, frozen: list[int]
) -> tuple[dict[str, Any], float]:
    """Freeze `frozen`; the job must end failed on the progress watch (its record's `kind`), the nodes still
    beating, nothing registered, the allocation released: `jobs status` and how long after the freeze Slurm
    ended it."""
    broke_at = time.time()
    signal_all(frozen, signal.SIGSTOP)
    took = slurm_end(slurm_id, lambda: _shown(home, cluster, job_id, slurm_id)) - broke_at
    cluster.final_state(slurm_id, timeout_s=120)
    shown = json.loads(nemotron(env, "jobs", "status", job_id, "--json").stdout)
    assert shown["state"] == "failed", shown
    assert shown["liveness"]["kind"] == "progress" and shown["error"].startswith("no progress: "), shown
    # the nodes kept beating: only the progress watch saw it (the log also holds the script's trace)
    assert not re.search(r"sent no heartbeat for \d", _logs(home, job_id))
    assert "registered" not in shown
    squeue = ["squeue", "-h", "-j", slurm_id]
    wait_for(
        lambda: not subprocess.run(squeue, capture_output=True, text=True).stdout.strip(), 30, "the release"
    )
    return shown, took


def _rank_process(slurm_id: str, node: str, rank: int) -> list[int]:
    """The Python process of one rank (torchrun's worker: RANK in its environment), not its node's torchrun agent
    nor its heartbeat."""
    found = []
    for pid in processes_on(slurm_id, node):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ:
            found.append(pid)
    return found


def test_a_rank_frozen_on_a_live_node_fails_the_job_on_progress(
    env: dict[str, str], home: Path, cleanup: list[str], slurm_cluster: Any
) -> None:
    """Rank 1's Python process stopped (continued at teardown with the rest of node2's), its node still beating (as a hung NCCL call or filesystem read leaves
    it): no rank makes progress (rank 0 waits in the collective), and the progress watch fails the job."""
    args = ("test/ranks", "-c", "tiny", "rounds=100000", "sleep_s=0.2")
    job_id, slurm_id = _submit(env, home, slurm_cluster, "watched_progress", *args)
    cleanup.append(slurm_id)
    _until_logged(home, slurm_cluster, job_id, slurm_id, "2 ranks agree", 150, "both ranks to run")
    # torchrun's rendezvous orders the nodes: rank 1 is on either
    frozen: list[int] = []
    wait_for(lambda: frozen.extend(_rank_process(slurm_id, "node1", 1) + _rank_process(slurm_id, "node2", 1))
             or frozen, 30, "rank 1's process")  # fmt: skip
    shown, took = _failed_on_progress(env, home, slurm_cluster, job_id, slurm_id, frozen)
    seen = shown["liveness"]
    assert "rank 0 on node" in seen["ranks"] and "rank 1 on node" in seen["ranks"], seen
    assert seen["bound_s"] == PROGRESS_FLOOR_S, seen
    assert re.search(r"nemotron: liveness: no progress from any of 2 rank\(s\) for \d", _logs(home, job_id))
    assert took <= PROGRESS_BOUND_S, f"ended {took:.0f} s after the freeze, bound {PROGRESS_BOUND_S} s"
    print(
        f"progress: Slurm ended the torchrun job {took:.0f} s after rank 1 froze (floor {PROGRESS_FLOOR_S} s)"
    )


def _ray_processes(slurm_id: str, node: str) -> list[int]:
    """A Ray node's raylet and its `ray::` workers: not the node's heartbeat, nor its `ray start` (which only waits)."""
    found = []
    for pid in processes_on(slurm_id, node):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"/raylet" in command.split(b" ")[0] or command.startswith(b"ray::"):
            found.append(pid)
    return found


def test_a_ray_worker_frozen_on_a_live_node_fails_the_job_on_progress(
    env: dict[str, str], home: Path, cleanup: list[str], slurm_cluster: Any
) -> None:
    """NeMo-RL's driver (the fake, one task on each node every step) with node2's raylet and Ray workers stopped,
    its heartbeat left running: the driver's log stops, and ray_watchdog fails the job on progress within the
    bound; nothing is registered."""
    args = ("rl/rlhf", "-c", "tiny", "backend=nemo_rl", "eval.task=null", "grpo.max_num_steps=100000")
    job_id, slurm_id = _submit(env, home, slurm_cluster, "ray2_stepping", *args)
    cleanup.append(slurm_id)
    _until_logged(home, slurm_cluster, job_id, slurm_id, "step 3/100000", 180, "the driver's third step")
    frozen: list[int] = []
    wait_for(lambda: frozen.extend(_ray_processes(slurm_id, "node2")) or frozen, 30, "node2's raylet")
    shown, took = _failed_on_progress(env, home, slurm_cluster, job_id, slurm_id, frozen)
    seen = shown["liveness"]
    # the progress bound (6 s) comes long before Ray declares a stopped node dead (about a minute here)
    assert seen["seen"].startswith("no log line from the driver for "), seen
    assert re.search(r"step \d+/100000", seen["last_line"]), seen
    assert took <= PROGRESS_BOUND_S + 10, (
        f"ended {took:.0f} s after the freeze, bound {PROGRESS_BOUND_S + 10} s"
    )
    print(
        f"progress: Slurm ended the Ray job {took:.0f} s after node2's raylet froze (floor {PROGRESS_FLOOR_S} s)"
    )


def test_a_node_whose_torchrun_agent_exits_at_start_fails_the_job_at_once(
    env: dict[str, str], home: Path
) -> None:
    """Bring-up fails fast on the built-in engine too: node2's torchrun agent exits during start-up (its rendezvous
    unreachable); srun's --kill-on-bad-exit ends node1's agent, which would otherwise wait out its rendezvous
    timeout (900 s) with the allocation held. The attached run shows node2's own error."""
    started = time.monotonic()
    done = nemotron(env, "steps", "run", "test/ranks", "-c", "tiny", "-r", "node2_never_starts")
    took = time.monotonic() - started
    said = done.stdout + done.stderr
    assert done.returncode != 0, said[-4000:]
    assert "failed to connect to the rendezvous" in said, said[-4000:]
    assert took < 60, (
        took,
        said[-4000:],
    )  # submit, node1's start, node2's failure: not the rendezvous timeout
    (job_dir,) = (home / "jobs").iterdir()
    shown = json.loads(nemotron(env, "jobs", "status", job_dir.name, "--json").stdout)
    assert shown["state"] == "failed" and "registered" not in shown, shown
    print(f"bring-up: the attached run ended {took:.0f} s after the submit")
