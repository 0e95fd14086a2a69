"""Progress beacons (nemotron.runtime.progress): the allowance worked out by hand, and the lines a rank writes as a
fake clock moves through start-up, steps, a checkpoint and a validation."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nemotron.runtime.progress import Beacon, Bounds, allowance

BOUNDS = Bounds(floor_s=10, pace_factor=3, startup_s=100, checkpoint_s=50, validation_s=70)


def test_allowance_by_section_and_pace() -> None:
    assert allowance("startup", None, BOUNDS) == 100
    assert allowance("checkpoint", 30.0, BOUNDS) == 50
    assert allowance("validation", 30.0, BOUNDS) == 70
    assert allowance("step", None, BOUNDS) == 10  # no step timed yet: the floor
    assert allowance("step", 2.0, BOUNDS) == 10  # 3 x 2 s = 6 s, under the floor
    assert allowance("step", 4.5, BOUNDS) == pytest.approx(13.5)  # 3 x 4.5 s
    assert allowance("serving", 4.5, BOUNDS) is None  # not watched


def test_bounds_travel_through_the_environment_unchanged() -> None:
    assert Bounds.decode(BOUNDS.encode()) == BOUNDS
    assert Bounds.decode(Bounds().encode()) == Bounds()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _line(beacon: Beacon) -> list[str]:
    assert beacon.path is not None
    return beacon.path.read_text().split()


def test_a_rank_writes_its_deadline_as_it_goes(tmp_path: Path) -> None:
    clock = Clock()
    beacon = Beacon(tmp_path / "attempt", rank=1, bounds=BOUNDS, node="node2", clock=clock)
    beacon._write("startup")
    # deadline section step node rank pid written
    deadline, section, step, node, rank, _pid, written = _line(beacon)
    assert (deadline, section, step, node, rank, written) == ("1100", "startup", "0", "node2", "1", "1000")

    clock.now = 1060.0  # the first step ends 60 s after the start: start-up, not a step's time
    beacon.beat(1)
    assert _line(beacon)[:3] == ["1070", "step", "1"]  # 1060 + the floor (no step timed yet)
    clock.now = 1064.0  # step 2 took 4 s: 3 x 4 = 12 s
    beacon.beat(2)
    assert _line(beacon)[:3] == ["1076", "step", "2"]
    clock.now = 1066.0  # a faster step keeps the slowest one's allowance
    beacon.beat(3)
    assert _line(beacon)[:3] == ["1078", "step", "3"]

    with beacon.section("checkpoint"):
        assert _line(beacon)[:3] == ["1116", "checkpoint", "3"]  # 1066 + 50
        clock.now = 1106.0  # a 40 s save
    # leaving it restarts the step clock: the save is not a step's time
    assert _line(beacon)[:3] == ["1118", "step", "3"]  # 1106 + 12
    clock.now = 1109.0
    beacon.beat(4)  # 3 s since the save ended, not 43 s: still 12 s
    assert _line(beacon)[:3] == ["1121", "step", "4"]

    with beacon.section("validation"):
        assert _line(beacon)[:2] == ["1179", "validation"]  # 1109 + 70
    beacon.unwatched("done")
    assert _line(beacon)[:2] == ["0", "done"]
    beacon.beat(5)  # for good
    assert _line(beacon)[:2] == ["0", "done"]


def test_a_validation_before_the_first_step_returns_to_start_up(tmp_path: Path) -> None:
    clock = Clock()
    beacon = Beacon(tmp_path, rank=0, bounds=BOUNDS, node="n", clock=clock)
    beacon._write("startup")
    with beacon.section("validation"):
        clock.now = 1030.0
    assert _line(beacon)[:2] == ["1130", "startup"]  # a fresh start-up allowance from the section's end


def test_without_a_folder_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NEMOTRON_PROGRESS_DIR", raising=False)
    beacon = Beacon.from_env(rank=0)
    beacon.beat(1)
    with beacon.section("checkpoint"):
        pass
    assert beacon.path is None
    monkeypatch.setenv("NEMOTRON_PROGRESS_DIR", str(tmp_path / "p"))
    monkeypatch.setenv("NEMOTRON_PROGRESS_BOUNDS", BOUNDS.encode())
    beacon = Beacon.from_env(rank=3)
    assert beacon.path == tmp_path / "p" / f"{beacon.node}.{os.getpid()}" and beacon.bounds == BOUNDS
    assert _line(beacon)[1] == "startup"


def test_the_verdict_over_every_rank(tmp_path: Path) -> None:
    """As the Slurm watchdog's shell loop decides (tests/launch/test_liveness_script.py): only once every watched
    rank is past its deadline, naming the newest."""
    from nemotron.runtime.progress import overdue

    lines = [
        "980 step 12 node1 0 11 968\n",
        "995 checkpoint 12 node2 1 22 945\n",
        "0 serving 0 node1 0 33 900\n",  # not watched
        "torn",
    ]
    assert overdue(lines, 990.0) is None  # rank 1 is within its checkpoint allowance
    seen = overdue(lines, 1000.0)
    assert seen is not None
    assert (seen["node"], seen["rank"], seen["section"], seen["step"]) == ("node2", 1, "checkpoint", 12)
    assert seen["silent_s"] == 55 and seen["bound_s"] == 50
    assert seen["ranks"] == "rank 0 on node1: step after step 12; rank 1 on node2: checkpoint after step 12"
    assert overdue(["0 done 40 node1 0 11 100\n"], 1e9) is None and overdue([], 1e9) is None
