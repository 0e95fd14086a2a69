"""What every DGX Cloud Lepton launch of a job (our step as a Lepton job, launch/lepton.py; an engine's Ray
cluster, launch/ray_lepton.py) takes from its profile: the names Kubernetes accepts, the job root on the shared
mount, NeMo-Run's LeptonExecutor fields, and the environment, of which no secret may reach a job spec."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from nemotron.config.profiles import LeptonProfile
from nemotron.errors import UserError
from nemotron.launch import step_process

# The profile's fields that NeMo-Run's LeptonExecutor takes under the same name, for a job and a Ray cluster alike
EXECUTOR_FIELDS = {
    "gpus_per_node",
    "resource_shape",
    "node_group",
    "secret_vars",
    "mounts",
    "image_pull_secrets",
}


def executor_fields(profile: LeptonProfile, *more: str) -> dict[str, Any]:
    """The profile's EXECUTOR_FIELDS and `more`, as NeMo-Run's LeptonExecutor takes them (mounts as dicts)."""
    return profile.model_dump(by_alias=True, include=EXECUTOR_FIELDS | set(more))


def lepton_name(job_id: str) -> str:
    """A Kubernetes-safe id of <= 35 characters that keeps the job id's time stamp and random suffix."""
    m = re.match(r"(.*)-(\d{8}-\d{6}-[0-9a-f]+)$", job_id)
    head, stamp = (m.group(1), m.group(2)) if m else (job_id, "")
    clean = re.sub(r"[^a-z0-9-]+", "-", head.lower()).strip("-")
    room = 35 - len(stamp) - 1
    return f"{clean[:room].rstrip('-')}-{stamp}" if stamp else clean[:35]


_SHELL_SAFE = re.compile(r"^[A-Za-z0-9/._+@:,=-]+$")


def nemo_run_dir(profile: LeptonProfile) -> str:
    if profile.nemo_run_dir:
        root = profile.nemo_run_dir.rstrip("/")
    elif not profile.mounts:
        raise UserError(
            f"profile '{profile.name}': Lepton needs shared storage: add a mount (from, path, mount_path) or nemo_run_dir"
        )
    else:
        root = f"{profile.mounts[0].mount_path.rstrip('/')}/nemorun"
    if not _SHELL_SAFE.match(root):
        # NeMo-Run's LeptonExecutor pastes the job dir into the pod's shell command unquoted.
        raise UserError(
            f"profile '{profile.name}': the job root {root!r} holds characters the pod's shell command cannot "
            "carry; use letters, digits and / . _ + @ : , = -"
        )
    return root


def lepton_env(profile: LeptonProfile, job_dir: str) -> tuple[tuple[str, str], ...]:
    """The step's environment on Lepton (step_process.step_env): NEMOTRON_HOME is the parent of the mount's job
    root. A secret among the profile's variables is refused: the spec would carry its value; Lepton workspace
    secrets (`secret_vars`) reach the pods instead."""
    env = step_process.step_env(profile, str(Path(nemo_run_dir(profile)).parent), job_dir)
    if env.secrets:
        raise UserError(
            f"profile '{profile.name}': {', '.join(env.secrets)} would be sent in the job spec; store each in a "
            "Lepton workspace secret and name it in secret_vars instead"
        )
    return env.variables


def refuse_config_secrets(job_dir: Path) -> None:
    """A config that holds secrets (the job's .secrets.json) cannot reach a Lepton job but through its files."""
    if json.loads((job_dir / ".secrets.json").read_text() or "{}"):
        raise UserError(
            "this config holds secrets; on Lepton pass them as environment variables from workspace secrets "
            "(profile secret_vars), never in the job's files"
        )
