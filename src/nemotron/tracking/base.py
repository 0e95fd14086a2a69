"""What every experiment tracker does for a job (docs/tracking.md). Implementations: mlflow_tracker.MlflowTracker,
wandb_tracker.WandbTracker. Nothing here imports a tracker library: those are optional extras
(`pip install nemotron[tracking]`) and stay off the CLI's start-up path."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from nemotron.artifacts.store import Artifact


@dataclass(frozen=True)
class RunInfo:
    """The job a tracker run stands for. `job_id` is the run's identity in every tracker, so a later
    `nemotron jobs sync` finds the same run and adds to it instead of starting another."""

    job_id: str
    step: str
    preset: str | None
    job_dir: str
    config: dict[str, Any]  # the job's resolved config, secrets already redacted


@dataclass(frozen=True)
class LoggedArtifact:
    """One registered output and the artifacts it was made from (input name -> parent), for the tracker's own
    lineage view."""

    artifact: Artifact
    inputs: list[tuple[str, Artifact]]


class Tracker(Protocol):
    """One tracker's calls for one job. Each may raise on a tracker that is down; the caller retries, warns and
    skips the tracker for the rest of the job (training never fails because of a tracker)."""

    name: str  # "mlflow" or "wandb": what warnings and docs call it

    def start(self, run: RunInfo) -> None:
        """Open (or, for a job already logged, reopen) the job's run and log its config as params."""

    def log_metrics(self, step: int, metrics: dict[str, float]) -> bool:
        """One row of metrics.jsonl: the same names, at the same step. False when nothing was sent: the run has
        the row already (a requeued job's earlier attempt, an earlier `jobs sync`)."""

    def log_artifacts(self, artifacts: list[LoggedArtifact]) -> None:
        """The job's registered outputs, each referencing our artifact (name:vN, sha256, path) and its inputs."""

    def finish(self, ok: bool) -> None:
        """Close the run, marked finished (ok) or failed."""
