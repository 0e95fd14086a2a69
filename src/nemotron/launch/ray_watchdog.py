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

- Ray's own view: a node that was alive and that Ray now declares dead fails the job at the next check (Ray marks a
  hung node dead about a minute after it stops answering its health checks).
- Progress (`--progress`, the profile's bounds as runtime/progress.py encodes them): the driver's output passes
  through the watchdog line by line. Once no line came for longer than the allowance, the job fails as above with
  the last line in the record: the engine's own log is the progress nemotron can see of a driver it did not write.
  The allowance is `max(floor, checkpoint, validation, pace_factor x the longest silence so far)` (a log does
  not say when a save or a validation starts, so each may take its whole allowance), and never ends before
  `startup` seconds from the driver's start.

Bound: `--timeout + --interval` after a node's last beat (`--timeout 0`: no heartbeats, the launcher has its own),
the allowance plus `--interval` after the driver's last line, plus up to 10 s for the driver to stop.
docs/cluster.md, "Liveness". `report` and `stop` serve launch/pod_watchdog.py too (the built-in engine's torchrun
across Lepton pods), so both watchdogs write one record and stop their command alike.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SCRIPT = "ray_watchdog.py"  # its name where it is shipped (the Ray job's working dir, the job dir on Slurm)
RECORD_FILE = (
    "liveness.json"  # as runtime/progress.py: one name on every launcher (this file imports no nemotron)
)
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
    parser.add_argument("--progress", default="", help="floor,factor,startup,checkpoint,validation (seconds)")
    parser.add_argument(
        "--step-line", default="", help="a regular expression matching the driver's step lines"
    )
    return parser.parse_args(argv[:split]), argv[split + 1 :]


def log_deadline(
    started: float, last_line: float, slowest_step: float | None, stepping: bool, bounds: str
) -> float:
    """When a driver whose last line came at `last_line` has been silent too long (`bounds` as
    runtime.progress.Bounds.encode writes them). The allowance after the last line is
    `max(floor, checkpoint, validation, factor x the slowest step so far)`: a log does not say when a save or a
    validation runs, so either may take its whole allowance. Until the first step line (`stepping`), the
    start-up allowance from the driver's start holds too."""
    floor, factor, startup, checkpoint, validation = (float(v) for v in bounds.split(","))
    allowance = max(floor, checkpoint, validation, factor * (slowest_step or 0.0))
    return last_line + allowance if stepping else max(started + startup, last_line + allowance)


class Lines:
    """The driver's output, passed through line by line (to this process's stdout, the job's log): when it last
    said something, and the time between its step lines (those `step_line` matches)."""

    def __init__(self, stream: Any, step_line: str) -> None:
        self.started = self.last = time.time()
        self.step_line = re.compile(step_line) if step_line else None
        self.step_at: float | None = None  # the last step line's time
        self.slowest_step: float | None = None
        self.text = ""
        self.reader = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.reader.start()

    def _read(self, stream: Any) -> None:
        for raw in iter(stream.readline, b""):
            sys.stdout.buffer.write(raw)
            sys.stdout.buffer.flush()
            self.seen(raw.decode(errors="replace"), time.time())

    def seen(self, line: str, now: float) -> None:
        self.last = now
        self.text = line.strip()[:300] or self.text
        if self.step_line is not None and self.step_line.search(line):
            if self.step_at is not None:
                self.slowest_step = max(self.slowest_step or 0.0, now - self.step_at)
            self.step_at = now

    def deadline(self, bounds: str) -> float:
        return log_deadline(self.started, self.last, self.slowest_step, self.step_at is not None, bounds)


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


def _dead(nodes: list[dict[str, Any]], known: dict[str, dict[str, Any]]) -> str | None:
    """A node that joined alive and that Ray now declares dead (its id), if any."""
    for node in nodes:
        node_id = str(node["NodeID"])
        if node_id in known and not node.get("Alive"):
            return node_id
    return None


def _failure(
    args: argparse.Namespace,
    beats: Path,
    known: dict[str, dict[str, Any]],
    nodes: list[dict[str, Any]],
    lines: Lines | None,
) -> dict[str, Any] | None:
    """What fails the job now, as its record: a dead node, a silent heartbeat, a silent driver; else None."""
    dead = _dead(nodes, known)
    if dead is not None:
        return {**known[dead], "node_id": dead, "seen": "Ray declared the node dead", "silent_s": 0,
                "bound_s": int(args.interval), "at": now_utc()}  # fmt: skip
    found = _silent(beats, known, args.timeout) if args.timeout else None
    if found is not None:
        node_id, silent = found
        return {**known[node_id], "node_id": node_id, "seen": f"no heartbeat for {int(silent)} s",
                "silent_s": int(silent), "bound_s": int(args.timeout), "at": now_utc()}  # fmt: skip
    deadline = lines.deadline(args.progress) if lines is not None else None
    if lines is not None and deadline is not None and time.time() > deadline:
        silent = time.time() - lines.last
        bound = deadline - lines.last
        head = next((k for k in known.values() if k.get("head")), {})
        return {"kind": "progress", "node": head.get("node"), "seen": f"no log line from the driver for {int(silent)} s",
                "silent_s": int(silent), "bound_s": int(bound), "last_line": lines.text, "at": now_utc()}  # fmt: skip
    return None


def main(argv: list[str]) -> int:
    args, driver_cmd = _args(argv)
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    job_dir = Path(args.job_dir)
    beats = job_dir / "heartbeats" / f"ray-{int(time.time())}-{os.getpid()}"
    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), log_to_driver=False)
    remote_beater = ray.remote(num_cpus=0, max_restarts=0)(Beater)
    # its own group: stopped whole; its output through this process when its log is its progress
    out = subprocess.PIPE if args.progress else None
    err = subprocess.STDOUT if args.progress else None
    driver = subprocess.Popen(driver_cmd, start_new_session=True, stdout=out, stderr=err)
    lines = Lines(driver.stdout, args.step_line) if args.progress else None
    here = ray.get_runtime_context().get_node_id()
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
                    **({"head": True} if node_id == here else {}),
                }
                if args.timeout:
                    strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
                    beats.mkdir(parents=True, exist_ok=True)
                    actors.append(
                        remote_beater.options(scheduling_strategy=strategy).remote(
                            str(beats / node_id), args.interval
                        )
                    )
        try:
            code = driver.wait(args.interval)
            if lines is not None:
                lines.reader.join(10)  # the driver's last lines, to the log
            for actor in actors:
                ray.kill(actor)
            return code
        except subprocess.TimeoutExpired:
            pass
        seen = _failure(args, beats, known, nodes, lines)
        if seen is None:
            continue
        seen.pop("head", None)
        report(job_dir, seen)
        stop(driver)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
