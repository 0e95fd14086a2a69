"""What preflight checks of a step's trackers before anything is written. Light on purpose: it is on the dry-run's
start-up path, which imports no tracker library and none of the fan-out's threading (tracking/fanout.py)."""

from __future__ import annotations

import os
from collections.abc import Collection
from typing import Any

from nemotron.config.stepconfig import Tracking

NO_SERVER = (
    "tracking.mlflow.enabled is true but no tracking server is named: set tracking.mlflow.tracking_uri=http://HOST:PORT"
    " or $MLFLOW_TRACKING_URI"
)


def mlflow_uri(tracking: Tracking, environ: dict[str, str] | None = None) -> str | None:
    """Where MLflow logs go: tracking.mlflow.tracking_uri, else $MLFLOW_TRACKING_URI (of `environ`: a profile's
    env_vars reach the job too)."""
    env = os.environ if environ is None else environ
    return tracking.mlflow.tracking_uri or env.get("MLFLOW_TRACKING_URI") or None


def tracking_problems(config: Any, env_names: Collection[str] = (), inherits_shell: bool = True) -> list[str]:
    """What stops a validated step config's trackers from starting, found before anything is written (preflight):
    MLflow on with nowhere to log to. `env_names`: the variables the profile sets on the job; `inherits_shell`:
    whether the job also gets this shell's environment (a local job does; a Slurm or Lepton job gets only its
    profile's variables, so there $MLFLOW_TRACKING_URI in this shell names no server for it)."""
    tracking = getattr(config, "tracking", None)
    if not isinstance(tracking, Tracking) or not tracking.mlflow.enabled or tracking.mlflow.tracking_uri:
        return []
    if "MLFLOW_TRACKING_URI" in env_names or (inherits_shell and mlflow_uri(tracking)):
        return []
    if inherits_shell:
        return [NO_SERVER]
    return [
        "tracking.mlflow.enabled is true but no tracking server is named for the job: set "
        "tracking.mlflow.tracking_uri=http://HOST:PORT or MLFLOW_TRACKING_URI in the profile's env_vars (a cluster "
        "job does not get this shell's variables; without one the run would land in a ./mlruns on the node)"
    ]
