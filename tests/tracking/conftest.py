"""What the tracking tests' tiny rl/ppo runs share: one NEMOTRON_HOME (tiny_ppo.py has the run's arguments and how
its job dir is read back), and the one tracked run test_mlflow.py and test_wandb_run.py both read."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from . import wandb_records as rec
from .tiny_ppo import MLFLOW_EXPERIMENT, SHORT, WANDB_OFFLINE, job_dirs


@pytest.fixture(scope="session")
def tracked_home(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One NEMOTRON_HOME for the tracking tests of a worker (those that use it share the xdist group `mlflow`):
    a later run consumes the first run's registered policy, and `jobs sync` replays its jobs. The trackers sample
    system metrics every second, so the short run holds a few samples."""
    root = tmp_path_factory.mktemp("tracked")
    return {
        "NEMOTRON_HOME": str(root / "home"),
        "NEMOTRON_CACHE_DIR": str(root / "cache"),
        "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "1",
        "WANDB_X_STATS_SAMPLING_INTERVAL": "1",
    }


@dataclass(frozen=True)
class TrackedRun:
    """The tracked run's job dir, and the offline W&B run's `.wandb` file the job itself wrote (a `jobs sync` of
    the job adds others beside it)."""

    job_dir: Path
    wandb_file: Path


@pytest.fixture(scope="session")
def tracked_ppo_run(mlflow_server: str, tracked_home: dict[str, str], run_cli: Any) -> TrackedRun:
    """The first job of `tracked_home`: a short tiny rl/ppo (tiny_ppo.SHORT) logging live to the session's MLflow
    server (experiment MLFLOW_EXPERIMENT, tag team=alignment) and to an offline W&B run at once; it registers
    tiny_ppo_policy:v1 and tiny_ppo_critic:v1. Made once per worker for test_mlflow.py and test_wandb_run.py, which
    read it: the run itself must print no warning, and leave one offline W&B run."""
    argv = [
        "steps", "run", "rl/ppo", "-c", "tiny", *SHORT, "tracking.mlflow.enabled=true",
        f"tracking.mlflow.tracking_uri={mlflow_server}", f"tracking.mlflow.experiment={MLFLOW_EXPERIMENT}",
        "tracking.mlflow.tags={team: alignment}", *WANDB_OFFLINE,
    ]  # fmt: skip
    r = run_cli(*argv, env=tracked_home, timeout=600)
    assert r.code == 0, r.err[-3000:] + r.out[-3000:]
    assert "WARNING" not in r.out + r.err, r.out[-3000:]
    (job_dir,) = job_dirs(tracked_home)
    (live,) = rec.run_files(job_dir)
    return TrackedRun(job_dir, live)
