"""What a running step (runtime.StepRun) and `nemotron jobs sync` tell the trackers about one job: its run info,
its metrics, its registered outputs with their inputs, and how it ended."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from nemotron.artifacts.store import Artifact, ArtifactStore
from nemotron.config.stepconfig import Tracking
from nemotron.core.redact import redact_tree, redact_values, secret_values
from nemotron.errors import UserError
from nemotron.jobs.record import JobRecord
from nemotron.tracking.base import LoggedArtifact, RunInfo
from nemotron.tracking.fanout import Trackers, build_trackers


def run_info(record: JobRecord, job_dir: Path, config: dict[str, Any]) -> RunInfo:
    """The run a job stands for, with its config's secrets masked (by name, and by value wherever else they
    appear)."""
    masked = redact_values(redact_tree(config), secret_values(config))
    return RunInfo(record.job_id, record.step, record.preset, str(job_dir), masked)


def logged_artifacts(store: ArtifactStore, artifacts: Sequence[Artifact]) -> list[LoggedArtifact]:
    """Each artifact with what it was made from (input name -> parent), as the store's lineage edges say."""
    return [LoggedArtifact(a, store.parents(a.id)) for a in artifacts]


def job_tracking(job_dir: Path) -> tuple[dict[str, Any], Tracking]:
    """The job's config (as config.yaml holds it: secrets masked) and its tracking group."""
    config = yaml.safe_load((job_dir / "config.yaml").read_text()) or {}
    try:
        return config, Tracking.model_validate(config.get("tracking") or {})
    except ValidationError as e:
        raise UserError(
            f"{job_dir / 'config.yaml'}: its tracking group is not one nemotron can read: {e}"
        ) from None


class StepTracking:
    """A running step's trackers (main rank only). The run ends when the step's main thread does: finished once the
    step has registered its outputs, failed otherwise (an exception, SIGTERM, exit 2 or 3)."""

    def __init__(self, trackers: Trackers) -> None:
        self.trackers = trackers
        self.registered = False
        # Not an atexit hook: tracker libraries register their own at start (wandb's tears its service process
        # down), and atexit runs the latest first, so the job's last calls (its outputs, the run's end) would reach
        # a torn-down client. A non-daemon thread is joined before any atexit hook runs.
        threading.Thread(target=self._finish_after_main, name="tracking-finish").start()

    def _finish_after_main(self) -> None:
        threading.main_thread().join()
        self.finish()

    @classmethod
    def open(cls, config: BaseModel, record: JobRecord, job_dir: Path) -> StepTracking | None:
        """The trackers of a validated step config, started; None when the step tracks nothing. Exit 2 before
        training when a tracker's library is missing or MLflow has no server."""
        tracking = getattr(config, "tracking", None)
        if not isinstance(tracking, Tracking):
            return None
        trackers = build_trackers(tracking, job_dir)
        if not trackers:
            return None
        fanout = Trackers(trackers, tracking.retries, record.job_id)
        fanout.start(run_info(record, job_dir, config.model_dump(mode="json")))
        return cls(fanout)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.trackers.log_metrics(step, metrics)

    def log_outputs(self, store: ArtifactStore, artifacts: Sequence[Artifact]) -> None:
        self.trackers.log_artifacts(logged_artifacts(store, artifacts))
        self.registered = True

    def finish(self) -> None:
        self.trackers.finish(ok=self.registered)
