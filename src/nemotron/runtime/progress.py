"""Progress beacons: every rank of a watched job says when it last made progress and by when it promises more.

A heartbeat proves a node, not the work on it: a rank stuck in a collective, a hung filesystem call or a wedged
rollout keeps its node beating. So each rank of a built-in step keeps one small file, its beacon, in the folder the
launcher names (`NEMOTRON_PROGRESS_DIR`, one folder per attempt), rewritten at every training step and whenever it
enters a section with an allowance of its own (a checkpoint save, a validation):

    <deadline> <section> <step> <node> <rank> <pid> <written>

all whole epoch seconds but the words. `deadline` is when the rank will have written again if it is making
progress; 0 means "not watched" (a server waiting for requests). The launcher's watchdog (launch/liveness.py on
Slurm, launch/pod_watchdog.py on Lepton) fails the job once every rank's deadline has passed: the job as a whole
made no progress. Requiring every rank keeps a main rank's long validation from failing the ranks that wait for it
at the next collective; a frozen rank stops them all at that collective, so the job is still caught.

The allowance of a training step follows the job's own pace: `max(floor_s, pace_factor x the slowest step so far)`,
the floor covering the first steps (the time to the first one is `startup_s`: loading, compiling, rendezvous).
Sections have theirs (`checkpoint_s`, `validation_s`); leaving one restarts the step clock, so a save is never
counted as a slow step. Every bound is a profile key (config/profiles.py, docs/cluster.md "Progress").
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RECORD_FILE = (
    "liveness.json"  # what a watchdog saw when it failed the job, in its job dir (every launcher's name)
)
DIR_ENV = "NEMOTRON_PROGRESS_DIR"
BOUNDS_ENV = "NEMOTRON_PROGRESS_BOUNDS"  # Bounds.encode(): floor,factor,startup,checkpoint,validation
SECTIONS = ("startup", "step", "checkpoint", "validation")


@dataclass(frozen=True)
class Bounds:
    """How long a rank may go without progress, by what it is doing (seconds)."""

    floor_s: float = 600.0
    pace_factor: float = 5.0
    startup_s: float = 1800.0
    checkpoint_s: float = 1800.0
    validation_s: float = 1800.0

    def encode(self) -> str:
        return ",".join(
            f"{v:g}"
            for v in (self.floor_s, self.pace_factor, self.startup_s, self.checkpoint_s, self.validation_s)
        )

    @classmethod
    def decode(cls, text: str) -> Bounds:
        floor, factor, startup, checkpoint, validation = (float(v) for v in text.split(","))
        return cls(floor, factor, startup, checkpoint, validation)


def allowance(section: str, slowest_step_s: float | None, bounds: Bounds) -> float | None:
    """Seconds a rank in `section` may go before its next beacon; None: not watched (a section without a bound,
    such as serving). A step's allowance is the floor until a step's time is known, then the pace's."""
    if section == "step":
        return max(bounds.floor_s, bounds.pace_factor * (slowest_step_s or 0.0))
    fixed = {
        "startup": bounds.startup_s,
        "checkpoint": bounds.checkpoint_s,
        "validation": bounds.validation_s,
    }
    return fixed.get(section)


def beacon_line(
    deadline: float | None, section: str, step: int, node: str, rank: int, pid: int, now: float
) -> str:
    """One beacon: words a shell `read` splits (the watchdog on Slurm is a shell loop)."""
    return f"{int(deadline) if deadline is not None else 0} {section} {step} {node} {rank} {pid} {int(now)}\n"


class Beacon:
    """One rank's beacon. Without a folder (a job no launcher watches: a laptop run) every call does nothing."""

    def __init__(
        self,
        folder: Path | None,
        rank: int,
        bounds: Bounds,
        node: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.folder, self.rank, self.bounds, self.clock = folder, rank, bounds, clock
        self.node = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        self.slowest_step_s: float | None = None
        self.step = 0
        self._since: float | None = None  # when the step clock started (the last step's end, or a section's)
        self.section_name = "startup"
        self.final = False  # unwatched for good: later beats write nothing

    @classmethod
    def from_env(cls, rank: int) -> Beacon:
        folder = os.environ.get(DIR_ENV)
        encoded = os.environ.get(BOUNDS_ENV)
        bounds = Bounds.decode(encoded) if encoded else Bounds()
        beacon = cls(Path(folder) if folder else None, rank, bounds)
        beacon._write("startup")
        return beacon

    @property
    def path(self) -> Path | None:
        """One file per process (the node and pid name it): a served model beside the ranks, or a rank restarted
        in place, never overwrites another's beacon; a dead process's file only ages (every deadline counts)."""
        return self.folder / f"{self.node}.{os.getpid()}" if self.folder else None

    def beat(self, step: int) -> None:
        """Step `step` ended: the time since the last one ended (or since a section left) is a step's time."""
        now = self.clock()
        if self._since is not None:
            self.slowest_step_s = max(self.slowest_step_s or 0.0, now - self._since)
        self._since, self.step = now, step
        self._write("step", now)

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        """Inside, the rank has the section's allowance; after, the section it left, afresh (the section's time is
        not a step's)."""
        outer = self.section_name
        self._write(name)
        try:
            yield
        finally:
            if outer == "step":
                self._since = self.clock()
            self._write(outer)

    def unwatched(self, section: str) -> None:
        """From now on the rank makes no progress to watch (a server waiting for requests, a step that is done, one
        with no training steps): deadline 0, for good."""
        self._write(section)
        self.final = True

    def _write(self, section: str, now: float | None = None) -> None:
        self.section_name = section
        path = self.path
        if path is None or self.final:
            return
        now = self.clock() if now is None else now
        left = allowance(section, self.slowest_step_s, self.bounds)
        line = beacon_line(
            None if left is None else now + left, section, self.step, self.node, self.rank, os.getpid(), now
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(line)
        os.replace(tmp, path)  # the watchdog reads the old line or the new one, never half


def overdue(lines: list[str], now: float) -> dict[str, Any] | None:
    """The verdict on a job from its ranks' beacon lines (launch/liveness.py's shell loop applies the same rule):
    None while any watched rank is within its deadline (or none is watched); else the record, naming the rank
    that was last seen progressing (the newest deadline) and listing them all."""
    watched: list[tuple[int, str, int, str, int, int]] = []
    for line in lines:
        words = line.split()
        if len(words) != 7 or not words[0].isdigit() or int(words[0]) == 0:
            continue  # torn, or not watched (serving, done)
        try:
            deadline, step, rank, written = (int(words[i]) for i in (0, 2, 4, 6))
        except ValueError:
            continue
        watched.append((deadline, words[1], step, words[3], rank, written))
    if not watched or now <= max(w[0] for w in watched):
        return None
    deadline, section, step, node, rank, written = max(watched)
    return {
        "kind": "progress",
        "node": node,
        "rank": rank,
        "section": section,
        "step": step,
        "seen": f"no progress for {int(now - written)} s",
        "silent_s": int(now - written),
        "bound_s": deadline - written,
        "ranks": "; ".join(f"rank {w[4]} on {w[3]}: {w[1]} after step {w[2]}" for w in watched),
    }


def read_beacons(folder: Path) -> dict[str, str]:
    """The beacon lines of a progress folder, by file name (a file replaced while read is left out: it is read at
    the next look)."""
    found = {}
    for path in folder.glob("*") if folder.is_dir() else []:
        try:
            found[path.name] = path.read_text()
        except OSError:
            continue
    return found


def failure_text(seen: dict[str, Any]) -> str:
    """A watchdog's record (liveness.json) as the job's `error`: the ranks' progress (launch/liveness.py, the pod
    and local watchdogs), a Ray driver's log (launch/ray_watchdog.py), or a node's heartbeat."""
    bound = f"{seen.get('seen')} (bound {seen.get('bound_s')} s)"
    if seen.get("kind") == "progress" and "rank" in seen:
        return (
            f"no progress: {bound}; the last to progress was rank {seen.get('rank')} on {seen.get('node')} "
            f"({seen.get('section')} after step {seen.get('step')})"
        )
    if seen.get("kind") == "progress":
        return f"no progress: {bound}; its last line: {seen.get('last_line')!r}"
    return f"node {seen.get('node')} stopped answering: {bound}"
