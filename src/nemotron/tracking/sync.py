"""`nemotron jobs sync JOB_ID`: replay a finished job (config.yaml, metrics.jsonl, its registered artifacts) into
its trackers. Each tracker finds the job's run again by its id and adds only what the run lacks, so a sync after a
live run that lost its tracker part way, or a second sync, duplicates nothing."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar

from nemotron.artifacts.lineage import job_store
from nemotron.config.backends import KEEPS_TENSORBOARD_METRICS
from nemotron.config.stepconfig import engine_name
from nemotron.errors import ServiceError, UserError
from nemotron.jobs.dirs import read_metrics
from nemotron.jobs.record import load_record, read_status
from nemotron.tracking.base import LoggedArtifact, RunInfo, Tracker
from nemotron.tracking.fanout import BACKOFF_S, build_trackers
from nemotron.tracking.job import job_tracking, logged_artifacts, run_info

T = TypeVar("T")
TRACKERS = ("mlflow", "wandb")
ENDED = ("succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class Synced:
    tracker: str
    metric_rows: int  # the rows this sync sent: a row the run had already is not sent again
    of_rows: int  # the job's rows
    artifacts: list[str]


def retried(fn: Callable[[], T], retries: int, backoff_s: float = BACKOFF_S) -> T:
    """`fn()`, re-run up to `retries` times with exponential backoff; the last failure is raised."""
    for attempt in range(retries + 1):
        try:
            return fn()
        except Exception:
            if attempt == retries:
                raise
            time.sleep(backoff_s * 2**attempt)
    raise AssertionError("unreachable")


def replay(
    tracker: Tracker,
    info: RunInfo,
    rows: list[tuple[int, dict[str, float]]],
    outputs: list[LoggedArtifact],
    ok: bool,
    retries: int,
) -> int:
    """One tracker's whole replay, each call retried; the first call that still fails ends it. Returns how many
    of `rows` it sent (those the run lacked)."""
    retried(partial(tracker.start, info), retries)
    sent = sum(retried(partial(tracker.log_metrics, step, metrics), retries) for step, metrics in rows)
    if outputs:
        retried(partial(tracker.log_artifacts, outputs), retries)
    retried(partial(tracker.finish, ok), retries)
    return sent


def sync_job(job_dir: Path, to: str | None = None, mlflow_uri: str | None = None) -> list[Synced]:
    """Replay the job into the trackers its config enables, or `to` (mlflow, wandb, all); `mlflow_uri` in place
    of the config's tracking.mlflow.tracking_uri (a server that moved). Exit 2 for a job still running or one
    that names no tracker; ServiceError (exit 3) when a tracker still fails after the job's tracking.retries."""
    record = load_record(job_dir)
    state = read_status(job_dir).get("state")
    if state not in ENDED:
        raise UserError(f"job {record.job_id} has not ended ({state}): sync it once it has")
    config, tracking = job_tracking(job_dir)
    if mlflow_uri:
        tracking = tracking.model_copy(
            update={"mlflow": tracking.mlflow.model_copy(update={"tracking_uri": mlflow_uri})}
        )
    only = None if to is None else (list(TRACKERS) if to == "all" else [to])
    makers = build_trackers(tracking, job_dir, only, live=False)
    if not makers:
        raise UserError(
            f"job {record.job_id} logs to no tracker (tracking.mlflow.enabled and tracking.wandb.enabled are "
            "false): name one with --to mlflow|wandb|all"
        )
    info = run_info(record, job_dir, config)
    rows = [
        (int(r["step"]), {k: float(v) for k, v in r.items() if k not in ("step", "time") and v is not None})
        for r in read_metrics(job_dir)
        if "step" in r
    ]
    if not rows and engine_name(config) in KEEPS_TENSORBOARD_METRICS:
        # NeMo-RL keeps its metrics as TensorBoard events, under its own names (train/loss, ...)
        from nemotron.tracking.tb_events import NEMO_RL_EVENTS, tensorboard_rows

        rows = tensorboard_rows(job_dir / NEMO_RL_EVENTS)
    store = job_store(record)
    outputs = logged_artifacts(store, store.by_job(record.job_id)) if store.exists() else []
    done, failed = [], []
    for name, make in makers.items():
        try:
            sent = replay(make(), info, rows, outputs, state == "succeeded", tracking.retries)
        except Exception as e:  # the tracker's own failure, after the retries
            first = str(e).strip().splitlines()
            failed.append(f"{name}: {type(e).__name__}: {first[0][:200] if first else ''}")
            continue
        done.append(Synced(name, sent, len(rows), [o.artifact.ref for o in outputs]))
    if failed:
        raise ServiceError(
            f"could not sync {record.job_id} after {tracking.retries} retries: " + "; ".join(failed)
        )
    return done
