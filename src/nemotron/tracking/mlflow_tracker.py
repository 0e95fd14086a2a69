"""A job as one MLflow run, through MlflowClient with explicit run ids (no fluent global state, so nothing leaks
between jobs or threads): config as params, metrics.jsonl's rows, system metrics, and each registered artifact as an
MLflow logged model naming our ref and its inputs (docs/tracking.md). Imported only when tracking.mlflow is on."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import LoggedModelInput, LoggedModelOutput, LoggedModelStatus, Metric, Param, RunTag
from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

from nemotron.artifacts.store import Artifact
from nemotron.config.stepconfig import MlflowTracking
from nemotron.tracking.base import LoggedArtifact, RunInfo

log = logging.getLogger("nemotron")

JOB_TAG = "nemotron.job_id"  # the run's identity: a resumed job and `jobs sync` find the run by it
REF_TAG = "nemotron.ref"  # name:vN of our artifact on its logged model
TRUNCATED = "...[truncated]"
# System metrics are sampled this often (seconds) unless $MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL says otherwise.
SYSTEM_METRICS_INTERVAL_S = 10.0
MONITOR_LOGGER = "mlflow.system_metrics.system_metrics_monitor"


class ServerGone(logging.Filter):
    """Drops MLflow's system-metrics monitor's own warning that the server stopped answering ("Failed to get mlflow
    run", "Failed to log system metrics"): the monitor then stops by itself, and the job's one warning about the
    tracker (tracking.fanout, with the `jobs sync` that fills the run) is already said, or is about to be."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not message.startswith(("Failed to get mlflow run", "Failed to log system metrics"))


_SERVER_GONE = ServerGone()


def flat_params(tree: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(dotted key, value text) of every leaf: `trainer.max_steps` -> "40"; lists as JSON. A value longer than
    MLflow takes (6000 characters) is cut and ends in `...[truncated]`."""
    if isinstance(tree, dict) and tree:
        for k, v in tree.items():
            yield from flat_params(v, f"{prefix}{k}.")
        return
    text = tree if isinstance(tree, str) else json.dumps(tree)
    if len(text) > MAX_PARAM_VAL_LENGTH:
        text = text[: MAX_PARAM_VAL_LENGTH - len(TRUNCATED)] + TRUNCATED
    yield prefix.rstrip("."), text


class MlflowTracker:
    """The Tracker (tracking.base) for MLflow. Every MLflow error reaches the caller (tracking.fanout), which retries
    and then skips MLflow for the rest of the job. Credentials are MLflow's own environment variables."""

    name = "mlflow"

    def __init__(self, settings: MlflowTracking, tracking_uri: str, system_metrics: bool = True) -> None:
        self.settings = settings
        self.system_metrics = system_metrics  # off for `jobs sync`: the replaying process's load is no metric
        self.client = MlflowClient(tracking_uri)
        self.tracking_uri = tracking_uri
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self._reopened = False  # the run existed: log only the metric steps it lacks
        self._last_step: dict[str, int] = {}  # metric -> the highest step the run has
        self._system: Any = None

    # ------------------------------------------------------------------ the run
    def start(self, run: RunInfo) -> None:
        exp = self.client.get_experiment_by_name(self.settings.experiment)
        self.experiment_id = (
            exp.experiment_id if exp else self.client.create_experiment(self.settings.experiment)
        )
        found = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.`{JOB_TAG}` = '{run.job_id}'", max_results=1
        )
        tags = {
            JOB_TAG: run.job_id,
            "nemotron.step": run.step,
            "nemotron.preset": run.preset or "",
            "nemotron.job_dir": run.job_dir,
            **self.settings.tags,
        }
        if found:
            self.run_id, self._reopened = found[0].info.run_id, True
            have = set(found[0].data.params)
            if found[0].info.status != "RUNNING":
                self.client.update_run(self.run_id, status="RUNNING")
        else:
            created = self.client.create_run(
                self.experiment_id,
                start_time=_started_ms(run),
                tags={JOB_TAG: run.job_id},
                run_name=self.settings.run_name or run.job_id,
            )
            self.run_id, have = created.info.run_id, set()
        params = [Param(k, v) for k, v in flat_params(run.config) if k not in have]
        for i in range(0, max(len(params), 1), MAX_PARAMS_TAGS_PER_BATCH):
            batch_tags = [RunTag(k, v) for k, v in tags.items()] if i == 0 else []
            self.client.log_batch(
                self.run_id, params=params[i : i + MAX_PARAMS_TAGS_PER_BATCH], tags=batch_tags
            )
        if self.system_metrics:
            self._start_system_metrics()

    def log_metrics(self, step: int, metrics: dict[str, float]) -> bool:
        assert self.run_id is not None, "start() first"
        at = int(time.time() * 1000)
        points = [Metric(k, float(v), at, step) for k, v in metrics.items() if step > self._have_until(k)]
        if points:
            self.client.log_batch(self.run_id, metrics=points)
            for p in points:
                self._last_step[p.key] = step
        return bool(points)

    def _have_until(self, key: str) -> int:
        """The highest step of `key` the run already has (-1: none). Asked of the server once per key, and only
        for a run this job logged to before (a requeued job, `jobs sync`)."""
        if key not in self._last_step:
            history = self.client.get_metric_history(self.run_id, key) if self._reopened else []
            self._last_step[key] = max((m.step for m in history), default=-1)
        return self._last_step[key]

    def log_artifacts(self, artifacts: list[LoggedArtifact]) -> None:
        assert self.run_id is not None and self.experiment_id is not None, "start() first"
        for logged in artifacts:
            self._log_model(logged)

    def finish(self, ok: bool) -> None:
        if self._system is not None:
            self._system.finish()
            self._system = None
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, "FINISHED" if ok else "FAILED")

    # ------------------------------------------------------------------ artifacts as logged models
    def _logged_model_of(self, artifact: Artifact) -> str | None:
        """The id of the logged model that stands for `artifact` in this experiment (same ref and content)."""
        found = self.client.search_logged_models(
            [self.experiment_id],
            filter_string=f"tags.`{REF_TAG}` = '{artifact.ref}' AND tags.`nemotron.sha256` = '{artifact.sha256}'",
            max_results=1,
        )
        return found[0].model_id if found else None

    def _log_model(self, logged: LoggedArtifact) -> None:
        a = logged.artifact
        run_id = self.run_id
        assert run_id is not None
        model_id = self._logged_model_of(a)
        if model_id is None:
            inputs = {name: (parent, self._logged_model_of(parent)) for name, parent in logged.inputs}
            identity = {
                REF_TAG: a.ref,
                "nemotron.sha256": a.sha256,
                "nemotron.path": a.path,
                "nemotron.type": a.type,
                "nemotron.job_id": a.job_id or "",
            }
            params = {**identity, **{f"nemotron.input.{n}": p.ref for n, (p, _) in inputs.items()}}
            tags = {
                **identity,
                **{f"nemotron.input.{n}.model_id": mid for n, (_, mid) in inputs.items() if mid},
            }
            model = self.client.create_logged_model(
                self.experiment_id,
                name=a.name,
                source_run_id=run_id,
                tags=tags,
                params=params,
                model_type=a.type,
            )
            model_id = model.model_id
            used = [LoggedModelInput(mid) for _, mid in inputs.values() if mid]
            if used:  # MLflow's own lineage: this run consumed those models
                self.client.log_inputs(run_id, models=used)
            self.client.finalize_logged_model(model_id, LoggedModelStatus.READY)
        run = self.client.get_run(run_id)
        if model_id not in {m.model_id for m in (run.outputs.model_outputs if run.outputs else [])}:
            self.client.log_outputs(
                run_id, [LoggedModelOutput(model_id, int(a.metadata.get("steps", 0) or 0))]
            )

    # ------------------------------------------------------------------ system metrics
    def _start_system_metrics(self) -> None:
        """MLflow's own SystemMetricsMonitor (CPU, memory, disk, network; GPU with pynvml): it takes a run id and a
        tracking URI, so it works without fluent state, on its own thread, and stops by itself once the server
        stops answering."""
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
        except ImportError as e:  # psutil is not in mlflow-skinny's requirements
            log.warning("tracking: no system metrics in MLflow (%s is not installed)", e.name)
            return
        logging.getLogger(MONITOR_LOGGER).addFilter(_SERVER_GONE)  # a filter is added once, however often
        self._system = SystemMetricsMonitor(
            self.run_id,
            sampling_interval=SYSTEM_METRICS_INTERVAL_S,
            resume_logging=self._reopened,
            tracking_uri=self.tracking_uri,
        )
        self._system.start()


def _started_ms(run: RunInfo) -> int | None:
    """When the job was created (its job.yaml is written once, then), so a run made later by `jobs sync` starts
    at the job's time, not the sync's."""
    try:
        return int((Path(run.job_dir) / "job.yaml").stat().st_mtime * 1000)
    except OSError:
        return None
