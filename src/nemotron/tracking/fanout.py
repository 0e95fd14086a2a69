"""One job's trackers behind one object: each tracker's calls run on its own thread, in order, retried with
exponential backoff; a tracker that still fails is warned about once and skipped for the rest of the job. The
training thread only queues calls, and waits for the trackers at most FINISH_WAIT_S when the job ends, so a tracker
that is down or slow never fails training and never holds it for long (docs/tracking.md)."""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from nemotron.config.stepconfig import Tracking
from nemotron.errors import UserError
from nemotron.tracking.base import LoggedArtifact, RunInfo, Tracker
from nemotron.tracking.checks import NO_SERVER, mlflow_uri

log = logging.getLogger("nemotron")

# The first backoff; each retry doubles it (0.5, 1, 2 s for the default 3 retries).
BACKOFF_S = 0.5
# How long the end of a job waits for the trackers to send what is queued (then they are left behind, with a
# warning that names `jobs sync`).
FINISH_WAIT_S = 20.0
# MLflow's own HTTP client retries a refused connection 7 times with backoff up to two minutes and waits 120 s for an
# answer; ours retries (tracking.retries), so its own is cut to one try with a short deadline (unless the user set
# these variables).
MLFLOW_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
INSTALL_HINT = "pip install 'nemotron[tracking]'"


def build_trackers(
    tracking: Tracking, job_dir: Path, only: Sequence[str] | None = None, live: bool = True
) -> dict[str, Callable[[], Tracker]]:
    """How to make each tracker `tracking` enables (or each named in `only`, enabled or not: `jobs sync --to`).
    `live`: a running job (system metrics on), not a replay. A missing library or MLflow without a server is exit
    2 here; the library itself is imported by the maker, which runs on the tracker's own thread, so its import
    (MLflow's takes seconds) overlaps the step's own start."""
    wanted = (
        set(only)
        if only is not None
        else {
            name
            for name, on in (("mlflow", tracking.mlflow.enabled), ("wandb", tracking.wandb.enabled))
            if on
        }
    )
    makers: dict[str, Callable[[], Tracker]] = {}
    if "mlflow" in wanted:
        uri = mlflow_uri(tracking)
        if not uri:
            raise UserError(NO_SERVER)
        _require("mlflow", "tracking.mlflow")
        for key, value in MLFLOW_HTTP_DEFAULTS.items():
            os.environ.setdefault(key, value)

        def mlflow_tracker() -> Tracker:
            from nemotron.tracking.mlflow_tracker import MlflowTracker

            return MlflowTracker(tracking.mlflow, uri, system_metrics=live)

        makers["mlflow"] = mlflow_tracker
    if "wandb" in wanted:
        _require("wandb", "tracking.wandb")

        def wandb_tracker() -> Tracker:
            from nemotron.tracking.wandb_tracker import WandbTracker

            return WandbTracker(tracking.wandb, job_dir)  # type: ignore[no-any-return,unused-ignore]

        makers["wandb"] = wandb_tracker
    return makers


def _require(module: str, key: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise UserError(f"{key} needs the {module} client, which is not installed: {INSTALL_HINT}")


def sync_hint(job_id: str) -> str:
    return f"run `nemotron jobs sync {job_id}` once it is back"


@dataclass
class _Call:
    what: str  # "start", "log_metrics", ...: named in the warning
    fn: Callable[[Tracker], object]


class TrackerLane:
    """One tracker's calls, sent in order on one thread. A call that fails is re-sent `retries` times (backoff
    BACKOFF_S, doubling); one that still fails makes the lane drop every later call (warned about once)."""

    def __init__(
        self, name: str, make: Callable[[], Tracker], retries: int, job_id: str, backoff_s: float = BACKOFF_S
    ) -> None:
        self.name = name
        self._make = make
        self.tracker: Tracker | None = None  # made on the lane's thread, by its first call
        self.retries = retries
        self.job_id = job_id
        self.backoff_s = backoff_s
        self.failed: str | None = None  # what failed, once the tracker is skipped
        self._queue: queue.Queue[_Call | None] = queue.Queue()
        self._closing = threading.Event()  # cuts a backoff short once the job has ended and waits no more
        self._thread = threading.Thread(target=self._run, name=f"tracker-{name}", daemon=True)
        self._thread.start()

    def send(self, what: str, fn: Callable[[Tracker], object]) -> None:
        """Queue `fn(tracker)`; nothing once the tracker is skipped."""
        if self.failed is None:
            self._queue.put(_Call(what, fn))

    def close(self, wait_s: float, bound_s: float) -> bool:
        """Send what is queued within `wait_s` (what is left of the job's `bound_s`); False when the tracker
        failed or did not finish in time."""
        self._queue.put(None)
        self._thread.join(wait_s)
        if self._thread.is_alive():
            self._closing.set()
            self._skip(f"it did not take the job's last calls within {bound_s:g} s")
            return False
        return self.failed is None

    def _run(self) -> None:
        try:
            self.tracker = self._make()
        except Exception as e:  # its library failed to load: the job goes on without it
            self._skip(f"it could not be set up ({type(e).__name__}: {_first_line(e)})")
        while (call := self._queue.get()) is not None:
            if self.failed is None:
                self._send(call)

    def _send(self, call: _Call) -> None:
        for attempt in range(self.retries + 1):
            try:
                call.fn(self.tracker)  # type: ignore[arg-type]  # set, or the lane failed
                return
            except Exception as e:  # any failure of a tracker library: training goes on without it
                error = e
            if attempt < self.retries and self._closing.wait(self.backoff_s * 2**attempt):
                break
        self._skip(
            f"{call.what} failed {self.retries + 1} times ({type(error).__name__}: {_first_line(error)})"
        )

    def _skip(self, why: str) -> None:
        if self.failed is not None:
            return
        self.failed = why
        log.warning(
            "tracking: %s is skipped for the rest of this job: %s; %s",
            self.name,
            why,
            sync_hint(self.job_id),
        )


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:160] if text else ""


class Trackers:
    """The job's trackers (the Tracker protocol fanned out): every call returns at once; `finish` waits at most
    `finish_wait_s` for all of them together."""

    def __init__(
        self,
        makers: dict[str, Callable[[], Tracker]],
        retries: int,
        job_id: str,
        backoff_s: float = BACKOFF_S,
        finish_wait_s: float = FINISH_WAIT_S,
    ) -> None:
        self.lanes = [TrackerLane(name, make, retries, job_id, backoff_s) for name, make in makers.items()]
        self.finish_wait_s = finish_wait_s
        self.finished = False

    def start(self, run: RunInfo) -> None:
        for lane in self.lanes:
            lane.send("start", lambda t: t.start(run))

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        # a copy (the caller may reuse its dict), without what metrics.jsonl writes as null (inf, nan)
        row = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        for lane in self.lanes:
            lane.send(f"log_metrics(step {step})", lambda t: t.log_metrics(step, row))

    def log_artifacts(self, artifacts: list[LoggedArtifact]) -> None:
        for lane in self.lanes:
            lane.send("log_artifacts", lambda t: t.log_artifacts(artifacts))

    def finish(self, ok: bool) -> dict[str, bool]:
        """Close every run; tracker name -> whether it got everything. Called once; later calls do nothing."""
        if self.finished:
            return {}
        self.finished = True
        for lane in self.lanes:
            lane.send("finish", lambda t: t.finish(ok))
        deadline = time.monotonic() + self.finish_wait_s
        return {
            lane.name: lane.close(max(0.0, deadline - time.monotonic()), self.finish_wait_s)
            for lane in self.lanes
        }
