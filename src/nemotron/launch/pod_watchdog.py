"""Liveness of the built-in engine's torchrun across the pods of a Lepton job: `python -m
nemotron.launch.pod_watchdog --job-dir D --node-rank R --nodes N --interval S --timeout S -- TORCHRUN...` runs in
every pod around that pod's torchrun. No pod is in charge; each watches all the others (a frozen pod stops its own
watchdog too, so no single watcher could be trusted).

- Every pod beats: a thread touches `<job dir>/heartbeats/torchrun/<node rank>` on the shared mount every
  `--interval` seconds (the file holds the pod's host name, and its torchrun's exit code once it ended).
- Every interval each pod looks at the others' files. A look counts a beat only when the file changed since the
  previous look, timed by this pod's clock alone: pods need not agree on the time (nor with the file server), and a
  file left by an earlier attempt of the same job counts for nothing until it is touched again, so a restarted
  job never sees stale beats.
- A pod that has not beaten for `--timeout` seconds, or never beat within `--join-timeout` of this watchdog's
  start (torchrun's own static rendezvous waits as long), is lost: the watchdog writes `<job dir>/liveness.json`
  (the node, what was seen, the bound), prints it on one line starting `nemotron: liveness: ` (the pod's log,
  which nemotron reads back from the Lepton API), stops torchrun with all its workers and exits 1.
- When torchrun ends, its code goes into the beat file and the watchdog waits for the other pods to end too (a
  pod that hangs after this one finished would hold the job) before it exits with that code. A pod whose torchrun
  failed leaves the others stuck in a collective: they stop theirs `--timeout` seconds after seeing it end, or at
  once while no rank of theirs is past start-up (with `--progress`): a pod that never started is a rendezvous the
  others would wait out.

- Progress (`--progress`, the profile's bounds): the ranks write their beacons into `<job dir>/progress/torchrun`
  (runtime/progress.py), and every look judges them as the Slurm watchdog does: once every watched rank is past
  its deadline, the job made no progress and fails as above. A beacon left by an earlier attempt counts for
  nothing until it changes.

Bound: a lost pod is noticed at most `--timeout + 2 * --interval` after its last beat (one interval until a look
sees that beat, one between looks), a stall at most `--interval` after the last rank's deadline; then its torchrun
gets 10 s to stop. docs/cluster.md, "Liveness" and "Progress".
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from math import ceil
from pathlib import Path
from types import FrameType
from typing import Any

from nemotron.launch.liveness import HEARTBEATS, PROGRESS
from nemotron.launch.ray_watchdog import now_utc, report, stop
from nemotron.runtime.progress import BOUNDS_ENV, DIR_ENV, overdue, read_beacons

BEATS = "torchrun"  # <job dir>/heartbeats/torchrun/<node rank>
JOIN_TIMEOUT_S = (
    600  # torch.distributed.elastic's static rendezvous: how long torchrun itself waits for a node
)
ENDED_POLL_S = 5  # how often a pod whose torchrun ended looks for the others' ends


def _args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        raise SystemExit(
            "usage: python -m nemotron.launch.pod_watchdog --job-dir D --node-rank R --nodes N --interval S "
            "--timeout S [--join-timeout S] -- COMMAND..."
        )
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m nemotron.launch.pod_watchdog")
    parser.add_argument("--job-dir", type=Path, required=True)
    parser.add_argument("--node-rank", type=int, required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--interval", type=float, required=True)
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--join-timeout", type=float, default=JOIN_TIMEOUT_S)
    parser.add_argument("--progress", default="", help="the ranks' progress bounds (runtime.progress.Bounds)")
    return parser.parse_args(argv[:split]), argv[split + 1 :]


class Beacons:
    """The ranks' progress beacons of this attempt: the files of the folder whose content changed since this
    watchdog first looked (what an earlier attempt left stays out until a rank rewrites it)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.baseline = read_beacons(folder)

    def _fresh(self) -> list[str]:
        return [text for name, text in read_beacons(self.folder).items() if self.baseline.get(name) != text]

    def verdict(self, now: float) -> dict[str, Any] | None:
        return overdue(self._fresh(), now)

    def starting(self) -> bool:
        """Whether no rank of this attempt has finished a training step yet (or left start-up otherwise)."""
        return all(text.split()[1:2] == ["startup"] for text in self._fresh())


class Beat:
    """This pod's file: rewritten whole when its content changes (atomically: the others may read it), touched
    every interval from a thread in between."""

    def __init__(self, path: Path, node_rank: int, interval_s: float) -> None:
        self.path, self.interval_s = path, interval_s
        self.content: dict[str, Any] = {"node": socket.gethostname(), "node_rank": node_rank}
        path.parent.mkdir(parents=True, exist_ok=True)
        self.write()
        threading.Thread(target=self._beat, daemon=True).start()

    def write(self, **more: Any) -> None:
        self.content |= more
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            tmp.write_text(json.dumps(self.content) + "\n")
            tmp.replace(self.path)
        except OSError:  # the mount failed: the others see this pod fall silent, which is what it is to them
            if not self.path.exists():
                raise

    def _beat(self) -> None:
        while True:
            time.sleep(self.interval_s)
            try:
                self.path.touch()
            except OSError:  # the mount stalled: a missed beat, the others judge it
                pass


@dataclass
class Peer:
    """Another pod, as this one has seen its file."""

    node_rank: int
    path: Path
    stamp: tuple[int, int, int] | None  # (mtime, inode, size) at the previous look
    beat_at: float | None = None  # this pod's monotonic clock when a look last saw the file change
    node: str | None = None
    exit_code: int | None = None  # once its torchrun ended
    ended_at: float | None = None  # when a look first saw that

    def look(self, now: float) -> None:
        # opened, not stat'ed: an NFS client revalidates a file's attributes on open, where a stat may answer
        # from its attribute cache for up to a minute
        try:
            with self.path.open("rb") as f:
                st = os.fstat(f.fileno())
                stamp = (st.st_mtime_ns, st.st_ino, st.st_size)
                if stamp == self.stamp:
                    return
                self.stamp, self.beat_at = stamp, now
                content = json.loads(f.read())
        except (OSError, ValueError):
            return  # absent, or torn by a stalled mount (a change still counts as a beat)
        self.node, self.exit_code = content.get("node"), content.get("exit_code")
        if self.exit_code is not None and self.ended_at is None:
            self.ended_at = now

    def lost(self, now: float, started: float, args: argparse.Namespace) -> dict[str, Any] | None:
        """What was seen, if this pod is lost: silent too long while its torchrun runs, or never seen at all."""
        if self.exit_code is not None:
            return None
        if self.beat_at is None:
            waited = now - started
            if waited <= args.join_timeout:
                return None
            seen, silent, bound = (
                f"no heartbeat since the job started {ceil(waited)} s ago",
                waited,
                args.join_timeout,
            )
        else:
            silent = now - self.beat_at
            if silent <= args.timeout:
                return None
            seen, bound = f"no heartbeat for {ceil(silent)} s", args.timeout
        return {
            "node": self.node or f"node rank {self.node_rank}",
            "node_rank": self.node_rank,
            "seen": seen,
            "silent_s": ceil(silent),
            "bound_s": int(bound),
            "at": now_utc(),
            "seen_by": socket.gethostname(),
        }

    def failed_for(self, now: float) -> float:
        """How long ago this pod's torchrun was seen ending non-zero (0 if it did not)."""
        return now - self.ended_at if self.exit_code and self.ended_at is not None else 0.0


def _exit_code(returncode: int) -> int:
    """As a shell reports it: a process ended by signal N is 128 + N."""
    return returncode if returncode >= 0 else 128 - returncode


def main(argv: list[str]) -> int:
    args, command = _args(argv)
    beats = args.job_dir / HEARTBEATS / BEATS
    beats.mkdir(parents=True, exist_ok=True)
    peers = [Peer(rank, beats / str(rank), None) for rank in range(args.nodes) if rank != args.node_rank]
    for peer in peers:  # what an earlier attempt left: the baseline, not a beat
        peer.look(0.0)
        peer.beat_at = peer.node = peer.exit_code = peer.ended_at = None
    started = time.monotonic()
    beat = Beat(beats / str(args.node_rank), args.node_rank, args.interval)
    progress = Beacons(args.job_dir / PROGRESS / BEATS) if args.progress else None
    env = {**os.environ, DIR_ENV: str(args.job_dir / PROGRESS / BEATS), BOUNDS_ENV: args.progress}
    torchrun = subprocess.Popen(
        command, start_new_session=True, env=env if progress else None
    )  # stopped whole
    cancelled = stopped = False

    def forward(signum: int, frame: FrameType | None) -> None:
        # Lepton stops a pod with SIGTERM: torchrun stops its workers, the watchdog then ends with its code
        nonlocal cancelled
        cancelled = True
        try:
            os.killpg(torchrun.pid, signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code: int | None = None
    while True:
        try:
            torchrun.wait(args.interval if code is None else min(args.interval, ENDED_POLL_S))
        except subprocess.TimeoutExpired:
            pass
        if code is None and torchrun.returncode is not None:
            code = _exit_code(torchrun.returncode)
            if stopped and code == 0:  # its worker ended on TERM before the agent did: stopped is not done
                code = 128 + signal.SIGTERM
            beat.write(exit_code=code)
        now = time.monotonic()
        for peer in peers:
            peer.look(now)
        if code is not None and (cancelled or all(peer.exit_code is not None for peer in peers)):
            return code
        seen = next((s for peer in peers if (s := peer.lost(now, started, args))), None)
        if seen is None and code is None and progress is not None:
            seen = progress.verdict(time.time())
            if seen is not None:
                seen |= {"at": now_utc(), "seen_by": socket.gethostname()}
        if seen is not None:
            report(args.job_dir, seen)
            if code is None:
                stop(torchrun)
                beat.write(exit_code=1)
            return 1
        # that pod's torchrun failed long enough ago for this one to have failed with it: it hangs; during
        # start-up (no rank past it) it cannot start without that pod, and would wait out its rendezvous
        grace = 0.0 if progress is not None and progress.starting() else args.timeout
        if code is None and any(peer.failed_for(now) > grace for peer in peers):
            print(
                "nemotron: another node's torchrun failed; stopping this one's", file=sys.stderr, flush=True
            )
            stop(torchrun)
            stopped = True


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
