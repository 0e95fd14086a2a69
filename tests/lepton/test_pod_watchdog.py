"""Liveness of the built-in engine's torchrun across Lepton pods (launch/pod_watchdog.py), for real: each "pod" is
a real process tree on this machine (the watchdog, and under it a torchrun-like agent that starts its worker in a
session of its own, as torchrun does), beating on a shared job dir. Killing or freezing every process of one pod
fails the other within the bound, with liveness.json naming the lost pod and the survivor's workers stopped; a
healthy run passes its code through. Through the Lepton stub, the job submitted is the one whose pods run the
watchdog, and `jobs status` / `jobs ls` turn the watchdog's record in a pod's log into `failed`, stopping the job."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from nemotron.core.procs import free_port
from nemotron.launch import lepton
from nemotron.launch.ray_watchdog import PREFIX

INTERVAL_S, TIMEOUT_S = 1, 3
BOUND_S = TIMEOUT_S + 2 * INTERVAL_S + 3  # the watchdog's bound, plus room for a loaded machine
REPO = Path(__file__).resolve().parents[2]
RANKS_STEPS = REPO / "tests" / "slurm" / "steproot"  # test/ranks: a built-in step launched by torchrun
# torchrun in miniature: an agent that starts its worker in a session of its own, records both pids, waits for it,
# and ends with the given code; with FAKE_TERM_EXIT set, TERM ends it with that code (a worker that ends cleanly on
# TERM, as a preemptible step may, before its agent sees the signal)
FAKE_TORCHRUN = """
import os, signal, subprocess, sys
pids, seconds, code = sys.argv[1], sys.argv[2], int(sys.argv[3])
if "FAKE_TERM_EXIT" in os.environ:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(int(os.environ["FAKE_TERM_EXIT"])))
worker = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"], start_new_session=True)
open(pids + ".tmp", "w").write(f"{os.getpid()} {worker.pid}")
os.replace(pids + ".tmp", pids)
worker.wait()
sys.exit(code)
"""


class Pods:
    """Pods of one job on this machine; every process they leave is ended by the test's end."""

    def __init__(self, tmp_path: Path, job_dir: Path) -> None:
        self.tmp_path, self.job_dir = tmp_path, job_dir
        self.fake = tmp_path / "fake_torchrun.py"
        self.fake.write_text(FAKE_TORCHRUN)
        self.procs: list[subprocess.Popen[bytes]] = []
        job_dir.mkdir(parents=True, exist_ok=True)

    def torchrun(self, rank: int, seconds: float, code: int) -> list[str]:
        return [sys.executable, str(self.fake), str(self.pids_file(rank)), str(seconds), str(code)]

    def pids_file(self, rank: int) -> Path:
        return self.tmp_path / f"pids-{rank}"

    def start(
        self,
        rank: int,
        seconds: float = 600,
        code: int = 0,
        *extra: str,
        nodes: int = 2,
        env: dict[str, str] | None = None,
    ) -> None:
        watchdog = [sys.executable, "-m", "nemotron.launch.pod_watchdog", "--job-dir", str(self.job_dir)]
        watchdog += ["--node-rank", str(rank), "--nodes", str(nodes), "--interval", str(INTERVAL_S)]
        watchdog += ["--timeout", str(TIMEOUT_S), *extra, "--", *self.torchrun(rank, seconds, code)]
        self.run(watchdog, env or {})

    def run(self, argv: list[str], env: dict[str, str]) -> None:
        # into a file, not a pipe: a worker left running would hold a pipe open
        with (self.tmp_path / f"pod-{len(self.procs)}.log").open("w") as log:
            self.procs.append(
                subprocess.Popen(
                    argv,
                    env={**os.environ, **env},
                    start_new_session=True,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )

    def running(self, ranks: range) -> None:
        """Until each pod's agent runs and each pod has seen every other beat."""
        deadline = time.monotonic() + 30
        while not all(self.pids_file(r).exists() for r in ranks):
            assert time.monotonic() < deadline, [p.poll() for p in self.procs]
            time.sleep(0.2)
        time.sleep(2 * INTERVAL_S + 0.5)

    def tree(self, rank: int) -> list[psutil.Process]:
        root = psutil.Process(self.procs[rank].pid)
        return [root, *root.children(recursive=True)]

    def workers(self, rank: int) -> list[int]:
        return [int(pid) for pid in self.pids_file(rank).read_text().split()]

    def output(self, rank: int) -> str:
        """What a pod printed (its log on Lepton)."""
        return (self.tmp_path / f"pod-{rank}.log").read_text()

    def end(self) -> None:
        for proc in self.procs:
            try:
                for p in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
                    p.kill()
                    p.resume()
            except psutil.NoSuchProcess:
                pass
            proc.wait(10)
        for rank in range(len(self.procs)):
            if self.pids_file(rank).exists():
                for pid in self.workers(rank):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[Pods]:
    made = Pods(tmp_path, tmp_path / "shared" / "job")
    try:
        yield made
    finally:
        made.end()


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _break(pods: Pods, rank: int, how: str) -> float:
    """Every process of that pod: stopped (a pod that hangs) or killed (a pod that dies); when."""
    for p in pods.tree(rank):
        p.suspend() if how == "frozen" else p.kill()
    return time.monotonic()


def _check_lost(pods: Pods, broke_at: float, how: str) -> dict[str, Any]:
    """Pod 0 failed within the bound, naming pod 1, its own agent and worker stopped; its record."""
    code = pods.procs[0].wait(BOUND_S + 30)
    took = time.monotonic() - broke_at
    log = pods.output(0)
    print(
        f"pod watchdog: pod 0 failed {took:.1f} s after pod 1 was {how} (interval {INTERVAL_S} s, timeout {TIMEOUT_S} s)"
    )
    assert code == 1, log
    assert took <= BOUND_S, (took, log)
    seen = json.loads((pods.job_dir / "liveness.json").read_text())
    assert seen["node_rank"] == 1 and seen["node"] == socket.gethostname(), seen
    assert seen["bound_s"] == TIMEOUT_S and seen["silent_s"] > TIMEOUT_S, seen
    assert seen["seen"] == f"no heartbeat for {seen['silent_s']} s", seen
    assert PREFIX + json.dumps(seen) in log.splitlines(), log
    assert all(_gone(pid) for pid in pods.workers(0)), "pod 0's agent and its worker are stopped"
    return dict(seen)


@pytest.mark.parametrize("how", ["frozen", "killed"])
def test_a_lost_pod_fails_the_others_within_the_bound(how: str, pods: Pods) -> None:
    pods.start(0)
    pods.start(1)
    pods.running(range(2))
    assert [p.poll() for p in pods.procs] == [None, None]  # healthy pods: torchrun runs on
    _check_lost(pods, _break(pods, 1, how), how)


@pytest.mark.parametrize("code", [0, 2, 130])
def test_a_healthy_run_ends_with_torchrun_s_own_code(code: int, pods: Pods) -> None:
    pods.start(0, 1, code)
    pods.start(1, 3, code)  # ends later: pod 0 waits for it, it is not lost
    assert [p.wait(30) for p in pods.procs] == [code, code], [pods.output(0), pods.output(1)]
    assert not (pods.job_dir / "liveness.json").exists()
    beats = pods.job_dir / "heartbeats" / "torchrun"
    assert [json.loads((beats / str(r)).read_text())["exit_code"] for r in range(2)] == [code, code]


def test_beats_left_by_an_earlier_attempt_count_for_nothing(pods: Pods) -> None:
    """A restarted job finds the last attempt's files; pod 1 ended there, and never starts here."""
    beats = pods.job_dir / "heartbeats" / "torchrun"
    beats.mkdir(parents=True)
    (beats / "1").write_text(json.dumps({"node": "old-pod", "node_rank": 1, "exit_code": 0}))
    started = time.monotonic()
    pods.start(0, 600, 0, "--join-timeout", str(TIMEOUT_S))
    code = pods.procs[0].wait(BOUND_S + 30)
    assert code == 1 and time.monotonic() - started <= BOUND_S + 2, pods.output(0)
    seen = json.loads((pods.job_dir / "liveness.json").read_text())
    assert seen["node"] == "node rank 1" and seen["seen"].startswith("no heartbeat since the job started"), (
        seen
    )
    assert seen["bound_s"] == TIMEOUT_S


def test_a_pod_whose_torchrun_failed_stops_the_others_stuck_in_a_collective(pods: Pods) -> None:
    pods.start(0)  # its worker would wait in a collective for pod 1 forever
    pods.start(1, 1, 3)
    pods.running(range(2))
    codes = [p.wait(BOUND_S + 30) for p in pods.procs]
    assert codes == [128 + signal.SIGTERM, 3], [pods.output(0), pods.output(1)]  # the agent dies of TERM
    assert "another node's torchrun failed" in pods.output(0)
    assert not (pods.job_dir / "liveness.json").exists()  # a failure, not a lost pod
    assert all(_gone(pid) for pid in pods.workers(0))


# ----------------------------------------------------------------------------- through the Lepton launcher


@pytest.fixture
def lep2(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Profiles `lep1` and `lep2` (1 and 2 pods of one GPU), whose shared mount is a folder here; its root."""
    cluster = tmp_path / "cluster"
    common = (
        f'extends = "lepton_rl"\ngpus_per_node = 1\npython = "{sys.executable}"\ncode_root = "{REPO}"\n'
        f'nemo_run_dir = "{cluster}/nemorun"\nartifacts_root = "{cluster}/artifacts"\n'
        f"heartbeat_interval_s = {INTERVAL_S}\nheartbeat_timeout_s = {TIMEOUT_S}\n"
    )
    (tmp_path / "env.toml").write_text(f"[lep1]\n{common}nodes = 1\n[lep2]\n{common}nodes = 2\n")
    monkeypatch.setenv("NEMOTRON_ENV_FILE", str(tmp_path / "env.toml"))
    monkeypatch.setenv("NEMOTRON_STEPS_PATH", str(RANKS_STEPS))
    return cluster


def _launch_files(lepton_api: Any) -> dict[str, str]:
    """What NeMo-Run's data mover unpacks into the job dir (a base64 tarball inside its command)."""
    mover = [j for j in lepton_api.created_jobs() if j["metadata"]["id"].startswith("data-mover-")][-1]
    command = mover["spec"]["container"]["command"][-1]
    data = base64.b64decode(re.search(r"echo (\S+) \| base64 -d", command).group(1))  # type: ignore[union-attr]
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {
            m.name.removeprefix("./"): tar.extractfile(m).read().decode(errors="replace")  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


def test_the_watchdog_wraps_every_pod_and_beats_on_several_only(nemotron: Any, lep2: Path) -> None:
    two = nemotron("steps", "run", "test/ranks", "-c", "tiny", "-b", "lep2", "--dry-run")
    assert two.code == 0, two.err
    watched = f"{sys.executable} -m nemotron.launch.pod_watchdog --job-dir {lep2}/nemorun/experiments/"
    assert (
        watched in two.out
        and (
            f" --node-rank $NODE_RANK --nodes 2 --interval {INTERVAL_S} --timeout {TIMEOUT_S} "
            f"--progress 600,5,1800,1800,1800 -- {sys.executable} -m nemotron.launch.torchrun_agent --nnodes 2 "
        )
        in two.out
    ), two.out
    # one pod: nothing to beat with, but its rank's progress is watched all the same
    one = nemotron("steps", "run", "test/ranks", "-c", "tiny", "-b", "lep1", "--dry-run")
    assert one.code == 0, one.err
    assert (
        f" --node-rank 0 --nodes 1 --interval {INTERVAL_S} --timeout {TIMEOUT_S} --progress 600,5,1800,1800,1800 "
        f"-- {sys.executable} -m nemotron.run_step "
    ) in one.out, one.out


def test_a_hung_pod_fails_the_lepton_job_and_stops_it(
    nemotron: Any, submitted: Callable[..., str], lep2: Path, home: Path, lepton_api: Any, pods: Pods
) -> None:
    """Frozen: the case only the watchdog can end (a killed pod is the same to it, tested above)."""
    how = "frozen"
    job_id = submitted("test/ranks", "-c", "tiny", "-b", "lep2")
    name = lepton.lepton_name(job_id)
    files = _launch_files(lepton_api)
    (line,) = [x for x in files["launch_script.sh"].splitlines() if "-m nemotron.launch.pod_watchdog" in x]
    watchdog, rest = line.split(" -- ", 1)
    job_dir = Path(shlex.split(watchdog)[4])
    assert rest.startswith(
        f"{sys.executable} -m nemotron.launch.torchrun_agent --nnodes 2 "
    ) and rest.endswith(lepton.EXIT_LINE)
    pods.job_dir = job_dir
    job_dir.mkdir(parents=True)
    # each pod runs the submitted command line, the torchrun in it played by the fake agent
    for rank in range(2):
        fake = shlex.join(pods.torchrun(rank, 600, 0))
        pods.run(["bash", "-c", f"{watchdog} -- {fake} {lepton.EXIT_LINE}"], {"NODE_RANK": str(rank)})
    pods.running(range(2))
    assert json.loads(nemotron("jobs", "status", job_id, "--json").out)["state"] == "running"

    seen = _check_lost(pods, _break(pods, 1, how), how)

    # Lepton's side: pod 0 failed (its log ends with the record and its code), pod 1 still holds its node
    lepton_api.replica_logs[name] = [pods.output(0), pods.output(1)]
    lepton_api.failed[name] = 1
    status = json.loads(nemotron("jobs", "status", job_id, "--json").out)
    assert status["state"] == "failed" and status["exit_code"] == 1, status
    assert status["error"] == f"node {seen['node']} stopped answering: {seen['seen']} (bound {TIMEOUT_S} s)"
    assert status["liveness"] == seen and "registered" not in status
    assert json.loads((home / "jobs" / job_id / "liveness.json").read_text()) == seen
    assert lepton_api.calls("DELETE", f"/jobs/{name}") and lepton_api.states[name] == "Stopped"  # freed
    listed = nemotron("jobs", "ls", "--json")
    (row,) = [r for r in json.loads(listed.out) if r["job_id"] == job_id]
    assert row["state"] == "failed", row


# ----------------------------------------------------------------------------- real torchrun

# each round, every rank adds its rank + 1 over gloo: a peer that hangs leaves the others waiting in all_reduce
RANKS = """
import time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
while True:
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    print(f"{dist.get_world_size()} ranks agree on {t.item():.0f}", flush=True)
    time.sleep(0.2)
"""


def test_real_torchrun_on_a_hung_pod_s_peer_is_stopped_within_the_bound(pods: Pods) -> None:
    """torch.distributed.run on two "pods" of one rank each: freezing one leaves the other's worker in a gloo
    all_reduce that would wait for 30 minutes; its watchdog stops the agent and the worker within the bound."""
    script = pods.tmp_path / "ranks.py"
    script.write_text(RANKS)
    port = free_port()
    for rank in range(2):
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1"]
        torchrun += ["--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port)]
        watchdog = [sys.executable, "-m", "nemotron.launch.pod_watchdog", "--job-dir", str(pods.job_dir)]
        watchdog += ["--node-rank", str(rank), "--nodes", "2", "--interval", str(INTERVAL_S)]
        pods.run(
            [*watchdog, "--timeout", str(TIMEOUT_S), "--", *torchrun, str(script)], {"OMP_NUM_THREADS": "1"}
        )
    deadline = time.monotonic() + 120
    while "2 ranks agree on 3" not in pods.output(0) + pods.output(1):
        assert time.monotonic() < deadline and None in [p.poll() for p in pods.procs], pods.output(0)
        time.sleep(0.5)
    time.sleep(2 * INTERVAL_S)
    survivors = [p.pid for p in pods.tree(0)[1:]]  # pod 0's torchrun agent and its worker
    assert len(survivors) >= 2, survivors
    broke_at = _break(pods, 1, "frozen")
    code = pods.procs[0].wait(BOUND_S + 30)
    took = time.monotonic() - broke_at
    print(f"pod watchdog: real torchrun, pod 0 failed {took:.1f} s after pod 1 was frozen")
    assert code == 1 and took <= BOUND_S, (took, pods.output(0)[-3000:])
    assert json.loads((pods.job_dir / "liveness.json").read_text())["node_rank"] == 1
    assert all(_gone(pid) for pid in survivors), "pod 0's torchrun agent and worker are stopped"


# a rank of a built-in step in miniature: three training steps through the beacon StepRun keeps, then a hang (as in
# a collective whose peer stopped); its pid recorded as FAKE_TORCHRUN's are
HUNG_RANK = """
import os, sys, time
from nemotron.runtime.progress import Beacon
open(sys.argv[1] + ".tmp", "w").write(f"{os.getpid()} {os.getpid()}")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
beacon = Beacon.from_env(rank=0)
for step in (1, 2, 3):
    time.sleep(0.2)
    beacon.beat(step)
time.sleep(600)
"""


def test_a_rank_that_stops_making_progress_fails_the_pod(pods: Pods) -> None:
    """One pod (nothing to beat with) and its rank's progress: past its allowance (the floor, 2 s), the watchdog
    fails the job naming the rank; a beacon an earlier attempt left overdue counts for nothing before that."""
    folder = pods.job_dir / "progress" / "torchrun"
    folder.mkdir(parents=True)
    (folder / "old-pod.1").write_text("1000 step 9 old-pod 0 1 990\n")  # long overdue
    rank = pods.tmp_path / "hung_rank.py"
    rank.write_text(HUNG_RANK)
    watchdog = [sys.executable, "-m", "nemotron.launch.pod_watchdog", "--job-dir", str(pods.job_dir)]
    watchdog += [
        "--node-rank",
        "0",
        "--nodes",
        "1",
        "--interval",
        str(INTERVAL_S),
        "--timeout",
        str(TIMEOUT_S),
    ]
    watchdog += ["--progress", "2,3,30,30,30", "--", sys.executable, str(rank), str(pods.pids_file(0))]
    started = time.monotonic()
    pods.run(watchdog, {})
    code = pods.procs[0].wait(60)
    took = time.monotonic() - started
    log = pods.output(0)
    assert code == 1, log
    seen = json.loads((pods.job_dir / "liveness.json").read_text())
    assert seen["kind"] == "progress" and (seen["rank"], seen["step"], seen["section"]) == (0, 3, "step"), (
        seen
    )
    assert seen["bound_s"] == 2 and seen["ranks"].startswith("rank 0 on ") and "old-pod" not in seen["ranks"]
    assert PREFIX + json.dumps(seen) in log.splitlines(), log
    # start-up and three 0.2 s steps, the 2 s floor, one look; far from the 30 s start-up allowance
    assert took < 20, (took, log)
    assert all(_gone(pid) for pid in pods.workers(0)), "the hung rank is stopped"


@pytest.mark.parametrize("term_exit", [None, "0"], ids=["killed-by-term", "ends-0-on-term"])
def test_a_pod_that_fails_during_start_up_stops_the_others_at_once(pods: Pods, term_exit: str | None) -> None:
    """Pod 1's torchrun exits during start-up; pod 0, whose ranks have not finished a step (no beacon past
    start-up), stops its own at the next look rather than `--timeout` later: it could only wait out its
    rendezvous. Stopped is not done: pod 0 ends 143 even where its torchrun ends 0 on TERM (CI once saw that
    race: the worker ended first and the agent returned its 0)."""
    progress = ("--progress", "600,5,1800,1800,1800")
    pods.start(0, 600, 0, *progress, env={"FAKE_TERM_EXIT": term_exit} if term_exit else None)
    pods.start(1, 0.5, 3, *progress)
    pods.running(range(1))
    beat = pods.job_dir / "heartbeats" / "torchrun" / "1"
    failed_at = ended_at = None
    deadline = time.monotonic() + TIMEOUT_S + 30
    while ended_at is None and time.monotonic() < deadline:
        if failed_at is None and beat.exists() and '"exit_code": 3' in beat.read_text():
            failed_at = time.monotonic()  # pod 1's torchrun failed
        if pods.procs[0].poll() is not None:
            ended_at = time.monotonic()
        time.sleep(0.05)
    codes = [p.wait(1) for p in pods.procs]
    assert codes == [128 + signal.SIGTERM, 3], [pods.output(0), pods.output(1)]
    assert "another node's torchrun failed" in pods.output(0)
    assert not (pods.job_dir / "liveness.json").exists()
    # at the next look, where the rule for a failure after start-up waits `--timeout` (3 s) first
    assert failed_at is not None and ended_at is not None and ended_at - failed_at < TIMEOUT_S, (
        failed_at,
        ended_at,
    )
