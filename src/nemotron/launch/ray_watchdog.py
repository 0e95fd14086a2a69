"""Liveness of a Ray job whose cluster nemotron does not script node by node (NeMo-RL on Lepton): this file is
shipped in the Ray job's working_dir and runs on the head as the job's entrypoint, around the driver. It needs
only the standard library and `ray` (the engine's image has it), never nemotron itself.

- Every node of the Ray cluster gets one heartbeat actor pinned to it (no CPU, no GPU), which touches
  `<job dir>/heartbeats/<run>/<node id>` on the shared mount every `--interval` seconds. A node that dies takes
  its actor with it; a node that hangs (its processes stopped) stops touching its file. Nodes are picked up as
  they join, so the driver's own wait for the cluster is untouched.
- Every interval the watchdog checks each file. Once one is older than `--timeout`, it writes
  `<job dir>/liveness.json` (the node, what was seen, the bound), prints the record on one line starting
  `nemotron: liveness: ` (the Ray job's log, which nemotron reads back on Lepton), stops the driver's whole
  process group and exits 1: the Ray job ends FAILED, nothing is registered.
- Otherwise it exits with the driver's own code once the driver ends.

Bound: `--timeout + --interval` after a node's last beat, plus up to 10 s for the driver to stop.
docs/cluster.md, "Liveness". `report` and `stop` serve launch/pod_watchdog.py too (the built-in engine's torchrun
across Lepton pods), so both watchdogs write one record and stop their command alike.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RECORD_FILE = "liveness.json"  # as launch/liveness.py: one name on every launcher
PREFIX = "nemotron: liveness: "
STOP_GRACE_S = 10


class Beater:
    """Touches one file every interval, from a thread of an actor pinned to one node."""

    def __init__(self, path: str, interval_s: float) -> None:
        self.path, self.interval_s = Path(path), interval_s
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()
        threading.Thread(target=self._beat, daemon=True).start()

    def _beat(self) -> None:
        while True:
            time.sleep(self.interval_s)
            self.path.touch()

    def pid(self) -> int:
        return os.getpid()


def _args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv:
        raise SystemExit("usage: ray_watchdog.py --job-dir D --interval S --timeout S -- DRIVER...")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="ray_watchdog.py")
    parser.add_argument("--job-dir", required=True)
    parser.add_argument("--interval", type=float, required=True)
    parser.add_argument("--timeout", type=float, required=True)
    return parser.parse_args(argv[:split]), argv[split + 1 :]


def _descendants(pid: int) -> list[int]:
    """Every live process below `pid`, from /proc (Linux: the pods and nodes these watchdogs run on)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def _signal_groups(groups: set[int], sig: int) -> bool:
    """Send `sig` to each group; whether any of them still had a process (signal 0 sends nothing)."""
    alive = False
    for group in groups:
        try:
            os.killpg(group, sig)
            alive = True
        except (ProcessLookupError, PermissionError):
            pass
    return alive


def stop(proc: subprocess.Popen[bytes]) -> None:
    """`proc`, started in a session of its own, and everything it started: TERM, then KILL after a grace. Its
    process group and the groups of its descendants, looked up before the first signal: torchrun starts each
    worker in a session of its own, where its group alone would not reach."""
    groups = {proc.pid}
    for pid in _descendants(proc.pid):
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            pass
    groups.discard(os.getpgrp())  # never this watchdog's own
    _signal_groups(groups, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline:
        proc.poll()  # reaped, it no longer counts in its group
        if not _signal_groups(groups, 0):
            return
        time.sleep(0.2)
    _signal_groups(groups, signal.SIGKILL)  # what did not end on TERM (a stopped process never does)
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass


def now_utc() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def report(job_dir: Path, seen: dict[str, Any]) -> None:
    """What the watchdog saw: `<job dir>/liveness.json`, and one line starting PREFIX in the log nemotron reads
    back where it does not see the job dir."""
    (job_dir / f"{RECORD_FILE}.tmp").write_text(json.dumps(seen) + "\n")
    (job_dir / f"{RECORD_FILE}.tmp").replace(job_dir / RECORD_FILE)
    print(PREFIX + json.dumps(seen), file=sys.stderr, flush=True)


def _silent(beats: Path, known: dict[str, dict[str, Any]], timeout_s: float) -> tuple[str, float] | None:
    now = time.time()
    for node_id in known:
        try:
            silent = now - (beats / node_id).stat().st_mtime
        except FileNotFoundError:
            continue
        if silent > timeout_s:
            return node_id, silent
    return None


def main(argv: list[str]) -> int:
    args, driver_cmd = _args(argv)
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    job_dir = Path(args.job_dir)
    beats = job_dir / "heartbeats" / f"ray-{int(time.time())}-{os.getpid()}"
    beats.mkdir(parents=True, exist_ok=True)
    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), log_to_driver=False)
    remote_beater = ray.remote(num_cpus=0, max_restarts=0)(Beater)
    driver = subprocess.Popen(driver_cmd, start_new_session=True)  # its own group: stopped whole
    known: dict[str, dict[str, Any]] = {}  # node id -> what the record says about it
    actors: list[Any] = []
    while True:
        nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
        for node in nodes:
            node_id = str(node["NodeID"])
            if node.get("Alive") and node_id not in known:
                known[node_id] = {
                    "node": node.get("NodeManagerHostname"),
                    "address": f"{node.get('NodeManagerAddress')}:{node.get('NodeManagerPort')}",
                }
                strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
                actors.append(
                    remote_beater.options(scheduling_strategy=strategy).remote(
                        str(beats / node_id), args.interval
                    )
                )
        try:
            code = driver.wait(args.interval)
            for actor in actors:
                ray.kill(actor)
            return code
        except subprocess.TimeoutExpired:
            pass
        found = _silent(beats, known, args.timeout)
        if found is None:
            continue
        node_id, silent = found
        seen = {
            **known[node_id],
            "node_id": node_id,
            "seen": f"no heartbeat for {int(silent)} s",
            "silent_s": int(silent),
            "bound_s": int(args.timeout),
            "at": now_utc(),
        }
        report(job_dir, seen)
        stop(driver)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
