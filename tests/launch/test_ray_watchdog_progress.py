"""The Ray watchdog's progress rule (launch/ray_watchdog.py), worked out by hand: the driver's log is its progress,
its step lines its pace, and a node Ray declares dead fails the job. The real thing runs on the local Slurm
(tests/slurm/test_liveness.py) and against Lepton's stub (tests/lepton/test_lepton_liveness.py)."""

from __future__ import annotations

import io

import pytest

from nemotron.engines.nemo_rl.engine import STEP_LINE
from nemotron.launch.ray_watchdog import Lines, _dead, log_deadline
from nemotron.runtime.progress import Bounds

# floor 10, pace x3, start-up 100, checkpoint 20, validation 15
BOUNDS = Bounds(10, 3, 100, 20, 15).encode()


def test_the_deadline_by_hand() -> None:
    # before any step line: the start-up allowance from the start, or the allowance after the last line if later
    assert log_deadline(1000, 1010, None, False, BOUNDS) == 1100  # max(1000 + 100, 1010 + 20)
    assert log_deadline(1000, 1095, None, False, BOUNDS) == 1115  # 1095 + max(10, 20, 15)
    # stepping: the allowance only; the pace once it exceeds the sections' allowances
    assert log_deadline(1000, 1010, 5.0, True, BOUNDS) == 1030  # 1010 + max(10, 20, 15, 15)
    assert log_deadline(1000, 1010, 12.0, True, BOUNDS) == 1046  # 1010 + 3 x 12


def test_lines_time_the_steps_by_the_engines_step_line() -> None:
    lines = Lines(io.BytesIO(b""), STEP_LINE)
    lines.started = lines.last = 1000.0
    lines.seen("loading the model\n", 1040.0)  # no step yet: start-up
    assert lines.step_at is None and lines.deadline(BOUNDS) == 1100
    lines.seen("========================= Step 1/50 =========================\n", 1050.0)  # NeMo-RL's
    lines.seen("  loss: 0.4\n", 1055.0)
    lines.seen("step 2/50 fake_grpo_loss=0.500\n", 1062.0)  # the fake driver's, lower case
    assert lines.slowest_step == pytest.approx(12.0)
    assert lines.deadline(BOUNDS) == pytest.approx(1062 + 36)
    lines.seen("Step 3/50\n", 1066.0)  # a faster step keeps the slowest one's pace
    assert lines.slowest_step == pytest.approx(12.0) and lines.text == "Step 3/50"


def test_without_a_step_line_the_start_up_allowance_holds_throughout() -> None:
    lines = Lines(io.BytesIO(b""), "")
    lines.started = 1000.0
    lines.seen("Step 1/50\n", 1001.0)
    assert lines.step_at is None and lines.deadline(BOUNDS) == 1100


def test_a_node_that_joined_and_is_now_dead_is_named() -> None:
    known = {"a": {"node": "node1"}, "b": {"node": "node2"}}
    assert _dead([{"NodeID": "a", "Alive": True}, {"NodeID": "b", "Alive": True}], known) is None
    assert _dead([{"NodeID": "a", "Alive": True}, {"NodeID": "b", "Alive": False}], known) == "b"
    # a node that was never seen alive (an earlier attempt's, dead before we started) is not ours to judge
    assert _dead([{"NodeID": "old", "Alive": False}], known) is None
