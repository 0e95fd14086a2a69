"""A remote engine's registered artifacts into the job's trackers, from where they are registered: the end of a
NeMo-RL driver or NeMo-Aligner actor on the cluster (`python -m nemotron.artifacts.lineage`), where the job's
environment (tracking URI, credentials) is. The engine's own logger has sent the metrics to the same run (one run per
job: MLflow's `nemotron.job_id` tag, W&B's run id); this adds each registered artifact with its inputs. It never
fails the registration: a tracker that is down, or a tracker library that is not importable there, is one warning
line naming `nemotron jobs sync JOB_ID`, which adds what is missing later (docs/tracking.md)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from nemotron.artifacts.store import Artifact, ArtifactStore
from nemotron.errors import UserError
from nemotron.jobs.record import JobRecord
from nemotron.tracking.fanout import Trackers, build_trackers, sync_hint
from nemotron.tracking.job import job_tracking, logged_artifacts, run_info

log = logging.getLogger("nemotron")


def log_registered(
    record: JobRecord, job_dir: Path, store: ArtifactStore, artifacts: Sequence[Artifact]
) -> dict[str, bool]:
    """Log `artifacts` (and their inputs) to every tracker the job's config enables, through the same fan-out as a
    running step: each tracker on its own thread, retried, at most Trackers' finish wait in all. Tracker name ->
    whether it took everything; {} when the job tracks nothing or its trackers cannot be set up here."""
    if not artifacts:
        return {}
    try:
        config, tracking = job_tracking(job_dir)
        makers = build_trackers(tracking, job_dir, live=False)
    except (UserError, OSError) as e:
        log.warning(
            "tracking: the registered artifacts were not logged here: %s; %s", e, sync_hint(record.job_id)
        )
        return {}
    if not makers:
        return {}
    fanout = Trackers(makers, tracking.retries, record.job_id)
    fanout.start(run_info(record, job_dir, config))
    fanout.log_artifacts(logged_artifacts(store, artifacts))
    # the job got here only after the engine's command succeeded (the driver script runs under `set -e`)
    return fanout.finish(ok=True)
