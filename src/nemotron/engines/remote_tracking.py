"""`tracking.*` on the external engines: NeMo-RL v0.7.0's `logger.*` keys, NeMo-Aligner v0.7.0's exp_manager
loggers (NeMo v2.1.0's `exp_manager.create_*_logger` and their kwargs), and the variables each run's trainer process
needs for what neither config can say. Pure, like the compilers that call it: a refusal for each key the engine
cannot honour, never a silent drop. docs/tracking.md ("NeMo-RL and NeMo-Aligner jobs") is the user's table.

Credentials are never here: MLFLOW_TRACKING_TOKEN / _USERNAME / _PASSWORD and WANDB_API_KEY reach the job as the
profile's env_vars, which every executor keeps out of rendered scripts (a secret name goes to the job's 0600
secrets file, nemotron.core.redact)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from nemotron.compile import Job
    from nemotron.config.stepconfig import Tracking
    from nemotron.engines.refusals import Refusals

URI_ENV = "MLFLOW_TRACKING_URI"
# MLflow's run-context provider merges this JSON object into the tags of every run started in the process
# (mlflow.tracking.context.system_environment_context, a @developer_stable name since MLflow 2.x).
MLFLOW_TAGS_ENV = "MLFLOW_RUN_CONTEXT"
# How many times MLflow's client re-sends an HTTP request that failed (mlflow.environment_variables).
MLFLOW_RETRIES_ENV = "MLFLOW_HTTP_REQUEST_MAX_RETRIES"
WANDB_MODE_ENV = "WANDB_MODE"  # wandb.sdk.wandb_settings reads both when wandb.init is not given them
WANDB_TAGS_ENV = "WANDB_TAGS"  # comma-separated
# wandb.init given no id reads the run id and the resume mode from these (wandb.env.RUN_ID / RESUME, wandb 0.31):
# the engine's run is then the run our own tracker and `nemotron jobs sync` open for the job (one run per job).
WANDB_RUN_ID_ENV = "WANDB_RUN_ID"
WANDB_RESUME_ENV = "WANDB_RESUME"
# A key Hydra's override grammar reads bare inside a dict (`{nemotron.job_id:x}`), and MLflow takes as a tag name.
_HYDRA_DICT_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]*$")
_RETRIES_WANDB_ONLY = (
    "under this engine it sets MLflow's HTTP retries only (MLFLOW_HTTP_REQUEST_MAX_RETRIES); W&B's client "
    "retries by its own rules, so with W&B alone it would do nothing"
)


@runtime_checkable
class Tracked(Protocol):
    """A training step's config: its schema has the tracking group."""

    tracking: Tracking


@dataclass(frozen=True)
class RunLabels:
    """What names a tracker run besides the config: the job, its step and preset."""

    job_id: str
    step: str
    preset: str = ""

    @classmethod
    def of(cls, job: Job) -> RunLabels:
        return cls(job.job_id, job.step_id, job.preset)

    @classmethod
    def from_job_dir(cls, job_dir: str, step: str) -> RunLabels:
        """A compiler called without a Job (tests, tools): the job id is the job dir's name, as jobs_dir() lays
        them out; no profile variables."""
        return cls(PurePosixPath(job_dir).name, step)

    def mlflow_tags(self, user: dict[str, str]) -> dict[str, str]:
        ours = {"nemotron.job_id": self.job_id, "nemotron.step": self.step}
        if self.preset:
            ours["nemotron.preset"] = self.preset
        return {**user, **ours}

    def wandb_tags(self, user: list[str]) -> list[str]:
        ours = [self.step, *([self.preset] if self.preset else [])]
        return [*user, *(t for t in ours if t not in user)]


def _common(t: Tracking, refuse: Refusals, labels: RunLabels) -> None:
    # MLflow with no server named for the job is refused for every engine in preflight (tracking_problems)
    if t.wandb.enabled and any("," in tag for tag in t.wandb.tags):
        refuse(
            "tracking.wandb.tags",
            "a tag may not hold a comma (the job gets them as comma-separated WANDB_TAGS)",
        )
    if not t.mlflow.enabled:
        refuse.unless_default("tracking.retries", _RETRIES_WANDB_ONLY)


def nemo_rl_logger(t: Tracking, refuse: Refusals, labels: RunLabels) -> tuple[dict[str, Any], dict[str, str]]:
    """(the keys of NeMo-RL's `logger:` section that tracking sets, the driver's environment). NeMo-RL's logger
    runs in the driver process (grpo.py / ppo.py setup: Logger(master_config["logger"])), so the driver's
    environment is the trackers' environment.

    Only keys of NeMo-RL's LoggerConfig, MLflowConfig and WandbConfig TypedDicts (nemo_rl/utils/logger.py) are
    emitted: W&B's mode and tags and MLflow's tags go through the variables their clients read."""
    _common(t, refuse, labels)
    logger: dict[str, Any] = {"mlflow_enabled": t.mlflow.enabled, "wandb_enabled": t.wandb.enabled}
    env: dict[str, str] = {}
    if t.mlflow.enabled:
        # tracking_uri null, not absent: the base YAML (grpo_math_1B.yaml) names http://localhost:5000, and only a
        # null lets MLflowLogger fall back to $MLFLOW_TRACKING_URI
        logger["mlflow"] = {
            "experiment_name": t.mlflow.experiment,
            "run_name": t.mlflow.run_name or labels.job_id,
            "tracking_uri": t.mlflow.tracking_uri,
        }
        env[MLFLOW_TAGS_ENV] = json.dumps(labels.mlflow_tags(t.mlflow.tags), sort_keys=True)
        env[MLFLOW_RETRIES_ENV] = str(t.retries)
    if t.wandb.enabled:
        wandb: dict[str, Any] = {"project": t.wandb.project, "name": t.wandb.name or labels.job_id}
        if t.wandb.entity:
            wandb["entity"] = t.wandb.entity
        logger["wandb"] = wandb
        env[WANDB_TAGS_ENV] = ",".join(labels.wandb_tags(t.wandb.tags))
        # NeMo-RL's WandbLogger calls wandb.init(**logger.wandb, dir=...) with no id, and WandbConfig declares
        # none: the id reaches wandb as the variables it reads then
        env[WANDB_RUN_ID_ENV] = wandb_run_id(labels.job_id)
        env[WANDB_RESUME_ENV] = "allow"
        if t.wandb.mode == "offline":
            env[WANDB_MODE_ENV] = "offline"
    return logger, env


def wandb_run_id(job_id: str) -> str:
    """The job's W&B run id, the one nemotron's own tracker uses (wandb_tracker.run_id; imported here, not at the
    top, so a compiler's import stays light)."""
    from nemotron.tracking.wandb_tracker import run_id

    return run_id(job_id)


# Hydra refuses a key its YAML lacks unless it is prefixed: `++` adds it or sets it, whichever applies.
ADD = "++"


def aligner_exp_manager(
    t: Tracking, refuse: Refusals, labels: RunLabels, from_env: Callable[[str], Any]
) -> tuple[list[tuple[str, Any]], dict[str, str]]:
    """(the actor's Hydra overrides of `exp_manager.*`, the actor group's environment). NeMo's exp_manager
    (nemo/utils/exp_manager.py at v2.1.0) builds Lightning's WandbLogger(version=..., **wandb_logger_kwargs), a
    free dict, and MLFlowLogger(run_name=version, **mlflow_logger_kwargs), an MLFlowParams. Keys the actor
    YAMLs lack are prefixed `++`. `from_env(NAME)`: the override value that reads variable NAME on the node
    (nemo_aligner.config.Env)."""
    _common(t, refuse, labels)
    overrides: list[tuple[str, Any]] = []
    env: dict[str, str] = {}
    if t.wandb.enabled:
        overrides += [
            ("exp_manager.create_wandb_logger", True),
            ("exp_manager.wandb_logger_kwargs.project", t.wandb.project),
            ("exp_manager.wandb_logger_kwargs.name", t.wandb.name or labels.job_id),
            # Lightning's WandbLogger(id=...) opens that run, with resume="allow" of its own; NeMo passes its log
            # version too, but `version or id` wins for id while the version is empty (our explicit log dir)
            (f"{ADD}exp_manager.wandb_logger_kwargs.id", wandb_run_id(labels.job_id)),
        ]
        if t.wandb.entity:
            overrides.append((f"{ADD}exp_manager.wandb_logger_kwargs.entity", t.wandb.entity))
        # Lightning's WandbLogger hands keys it does not name to wandb.init(tags=...)
        overrides.append((f"{ADD}exp_manager.wandb_logger_kwargs.tags", labels.wandb_tags(t.wandb.tags)))
        if t.wandb.mode == "offline":
            env[WANDB_MODE_ENV] = "offline"
    if t.mlflow.enabled:
        if t.mlflow.run_name:
            refuse(
                "tracking.mlflow.run_name",
                "NeMo names the MLflow run by its log version, which is empty under the explicit log dir our "
                "jobs use; the run carries the job id as the tag nemotron.job_id instead",
            )
        bad = sorted(
            k for k in t.mlflow.tags if not _HYDRA_DICT_KEY.match(k) or k in ("true", "false", "null")
        )
        if bad:
            refuse("tracking.mlflow.tags", f"tag names {bad} are not plain words Hydra reads in a dict")
        overrides += [
            (f"{ADD}exp_manager.create_mlflow_logger", True),
            (f"{ADD}exp_manager.mlflow_logger_kwargs.experiment_name", t.mlflow.experiment),
            # unset: the variable, read on the node; MLFlowParams' tracking_uri=None would mean ./mlruns there
            (
                f"{ADD}exp_manager.mlflow_logger_kwargs.tracking_uri",
                t.mlflow.tracking_uri or from_env(URI_ENV),
            ),
            (f"{ADD}exp_manager.mlflow_logger_kwargs.tags", labels.mlflow_tags(t.mlflow.tags)),
        ]
        env[MLFLOW_RETRIES_ENV] = str(t.retries)
    return overrides, env
