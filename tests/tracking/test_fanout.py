"""The fan-out's promises with small trackers of our own protocol (tracking.base.Tracker): calls arrive in order,
a failing call is retried with doubling backoff, a tracker that still fails is warned about once and skipped while
the others go on, and the training thread never waits on a tracker beyond the finish bound."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from nemotron.config.stepconfig import Tracking
from nemotron.errors import UserError
from nemotron.tracking.base import LoggedArtifact, RunInfo, Tracker
from nemotron.tracking.checks import tracking_problems
from nemotron.tracking.fanout import Trackers, build_trackers

pytestmark = pytest.mark.xdist_group("mlflow")

RUN = RunInfo("rl-ppo-20261127-000000-abcd", "rl/ppo", "tiny", "/tmp/job", {"trainer": {"max_steps": 3}})


class Recording:
    """Records every call with its time; its first `fail_first` calls raise, and with `always_fail` every one."""

    def __init__(
        self, name: str, fail_first: int = 0, always_fail: bool = False, block: threading.Event | None = None
    ):
        self.name = name
        self.fail_first = fail_first
        self.always_fail = always_fail
        self.block = block
        self.calls: list[tuple[str, Any]] = []
        self.attempts: list[float] = []

    def _call(self, what: str, arg: Any) -> None:
        self.attempts.append(time.monotonic())
        if self.block is not None:
            self.block.wait()
        if self.always_fail or len(self.attempts) <= self.fail_first:
            raise ConnectionError(f"{self.name} is down")
        self.calls.append((what, arg))

    def start(self, run: RunInfo) -> None:
        self._call("start", run.job_id)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self._call("log_metrics", (step, metrics))

    def log_artifacts(self, artifacts: list[LoggedArtifact]) -> None:
        self._call("log_artifacts", len(artifacts))

    def finish(self, ok: bool) -> None:
        self._call("finish", ok)


def fanout(*trackers: Tracker, retries: int = 3, backoff_s: float = 0.01, wait_s: float = 5.0) -> Trackers:
    return Trackers({t.name: (lambda t=t: t) for t in trackers}, retries, RUN.job_id, backoff_s, wait_s)


def test_every_call_arrives_in_order_after_transient_failures(caplog: pytest.LogCaptureFixture) -> None:
    flaky = Recording("flaky", fail_first=2)  # start fails twice, then the server answers
    t = fanout(flaky, retries=3)
    t.start(RUN)
    for step in (1, 2, 3):
        t.log_metrics(step, {"rewards": float(step), "kl": float("nan")})
    t.log_artifacts([])
    assert t.finish(ok=True) == {"flaky": True}
    assert flaky.calls == [
        ("start", RUN.job_id),
        ("log_metrics", (1, {"rewards": 1.0})),  # nan is what metrics.jsonl writes as null: not sent
        ("log_metrics", (2, {"rewards": 2.0})),
        ("log_metrics", (3, {"rewards": 3.0})),
        ("log_artifacts", 0),
        ("finish", True),
    ]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_tracker_that_stays_down_is_retried_warned_once_and_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    down, up = Recording("down", always_fail=True), Recording("up")
    t = fanout(down, up, retries=3, backoff_s=0.02)
    t.start(RUN)
    for step in range(1, 11):
        t.log_metrics(step, {"rewards": 1.0})
    assert t.finish(ok=False) == {"down": False, "up": True}
    # 1 try + 3 retries of start, then nothing more reaches it
    assert len(down.attempts) == 4
    gaps = [b - a for a, b in zip(down.attempts, down.attempts[1:], strict=False)]
    assert all(g >= want * 0.9 for g, want in zip(gaps, (0.02, 0.04, 0.08), strict=True)), gaps  # doubling
    assert [c[0] for c in up.calls] == ["start", *["log_metrics"] * 10, "finish"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert (
        "down" in warnings[0] and "start failed 4 times" in warnings[0] and "ConnectionError" in warnings[0]
    )
    assert f"nemotron jobs sync {RUN.job_id}" in warnings[0]


def test_the_training_thread_never_waits_past_the_finish_bound(caplog: pytest.LogCaptureFixture) -> None:
    """A tracker that hangs (a server that accepts and never answers): every call returns at once, finish gives
    up after its bound and says so once."""
    hang = threading.Event()
    stuck = Recording("stuck", block=hang)
    t = fanout(stuck, wait_s=0.5)
    began = time.monotonic()
    t.start(RUN)
    for step in range(1, 101):
        t.log_metrics(step, {"rewards": 1.0})
    queued = time.monotonic() - began
    done = t.finish(ok=True)
    total = time.monotonic() - began
    hang.set()
    assert queued < 0.2, f"queueing 101 calls took {queued:.3f} s"
    assert done == {"stuck": False}
    assert 0.5 <= total < 1.5, f"finish waited {total:.2f} s against a 0.5 s bound"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "within 0 s" not in warnings[0] and "stuck" in warnings[0], warnings


def test_a_tracker_that_cannot_be_made_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> Tracker:
        raise ImportError("no module named mlflow.entities")

    ok = Recording("ok")
    t = Trackers({"broken": broken, "ok": lambda: ok}, 3, RUN.job_id, 0.01, 5)
    t.start(RUN)
    assert t.finish(ok=True) == {"broken": False, "ok": True}
    assert [c[0] for c in ok.calls] == ["start", "finish"]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "broken" in warning and "could not be set up" in warning


def test_finish_runs_once() -> None:
    rec = Recording("rec")
    t = fanout(rec)
    t.start(RUN)
    t.finish(ok=True)
    assert t.finish(ok=False) == {}
    assert [c for c in rec.calls if c[0] == "finish"] == [("finish", True)]


def test_mlflow_without_a_server_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    on = Tracking.model_validate({"mlflow": {"enabled": True}})
    with pytest.raises(UserError, match=r"tracking\.mlflow\.tracking_uri"):
        build_trackers(on, tmp_path)

    class Config:
        tracking = on

    assert tracking_problems(Config()) and "MLFLOW_TRACKING_URI" in tracking_problems(Config())[0]
    assert tracking_problems(Config(), {"MLFLOW_TRACKING_URI"}) == []  # a profile's env_vars
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    assert tracking_problems(Config()) == []  # a local job inherits this shell's variable
    (remote,) = tracking_problems(Config(), inherits_shell=False)  # a cluster job does not
    assert "in the profile's env_vars" in remote
    assert tracking_problems(Config(), {"MLFLOW_TRACKING_URI"}, inherits_shell=False) == []
    assert list(build_trackers(on, tmp_path)) == ["mlflow"]
    assert build_trackers(Tracking(), tmp_path) == {}  # nothing enabled: nothing made, nothing imported


# A step process whose tracker library, like wandb, registers an atexit hook at start that tears its client down
# (wandb's stops its service process). The job's last calls are still queued when the step's main thread returns.
STEP_THAT_ENDS = """
import atexit, sys, time
from nemotron.tracking.fanout import Trackers
from nemotron.tracking.job import StepTracking
from nemotron.tracking.base import RunInfo

class TornDownAtExit:
    name = "torn"
    down = False

    def start(self, run):
        atexit.register(self.teardown)

    def teardown(self):
        self.down = True
        print("teardown", flush=True)

    def _call(self, what):
        time.sleep(0.3)  # a slow call: the main thread has ended by now
        if self.down:
            raise ConnectionError("the client was torn down")
        print(what, flush=True)

    def log_metrics(self, step, metrics):
        self._call(f"log_metrics {step}")

    def log_artifacts(self, artifacts):
        self._call("log_artifacts")

    def finish(self, ok):
        self._call(f"finish ok={ok}")

tracking = StepTracking(Trackers({"torn": TornDownAtExit}, 0, "job-1", 0.01, 10.0))
tracking.trackers.start(RunInfo("job-1", "rl/ppo", None, "/tmp", {}))
time.sleep(0.3)  # the tracker has started (its atexit hook is registered)
tracking.log_metrics(1, {"rewards": 1.0})
if sys.argv[1] == "fail":
    raise RuntimeError("training failed")
tracking.log_outputs(None, [])
"""


@pytest.mark.parametrize("ending", ["ok", "fail"])
def test_a_step_sends_its_last_calls_before_its_tracker_library_tears_down(ending: str) -> None:
    """The run ends when the step's main thread does, before any library's atexit hook: its outputs and the run's
    end reach the tracker (an atexit hook of ours ran after wandb's, whose service was gone by then)."""
    done = subprocess.run(
        [sys.executable, "-c", STEP_THAT_ENDS, ending], capture_output=True, text=True, timeout=60
    )
    assert "skipped" not in done.stdout + done.stderr, done.stderr
    if ending == "ok":
        assert done.returncode == 0, done.stderr
        assert done.stdout.split("\n") == ["log_metrics 1", "log_artifacts", "finish ok=True", "teardown", ""]
    else:
        assert done.returncode == 1 and "training failed" in done.stderr
        assert done.stdout.split("\n") == ["log_metrics 1", "finish ok=False", "teardown", ""]
