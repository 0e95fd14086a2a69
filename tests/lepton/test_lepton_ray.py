"""backend=nemo_rl on Lepton through NeMo-Run's LeptonRayJob, against the loopback stub of the Lepton API: the
RayCluster spec it receives is the one --dry-run prints, the job's files travel as its Ray working_dir, the job
state maps to ours, and cancel stops the job and deletes the cluster."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nemotron.launch import ray_lepton

PROFILES = '[lep4]\nextends = "lepton_rl"\nnodes = 4\n'


@pytest.fixture
def profiles(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The `lep4` profile: lepton_rl on 4 nodes."""
    (tmp_path / "env.toml").write_text(PROFILES)
    monkeypatch.setenv("NEMOTRON_ENV_FILE", str(tmp_path / "env.toml"))


EVEN = "grpo.num_prompts_per_step=48"


def test_submit_creates_the_rendered_cluster_and_runs_the_driver_once(
    nemotron: Any, submitted: Callable[..., str], profiles: None, home: Path, lepton_api: Any
) -> None:
    # 4 nodes less the GenRM's one: 24 data-parallel ranks, which 48 x 8 responses a step split evenly
    job_id = submitted("rl/rlhf", "-c", "default", "-b", "lep4", EVEN)

    (cluster,) = lepton_api.clusters.values()
    spec = cluster["spec"]
    assert spec["image"] == "nvcr.io/nvidia/nemo-rl:v0.7.0"
    assert spec["head_group_spec"]["min_replicas"] == 1 and spec["worker_group_specs"][0]["min_replicas"] == 3
    assert spec["head_group_spec"]["affinity"] == {"allowed_dedicated_node_groups": ["ng-0123"]}
    # the dry-run's spec is this one, but for what only the workspace knows (node group id, default Ray version)
    shown = nemotron("steps", "run", "rl/rlhf", "-c", "default", "-b", "lep4", EVEN, "--dry-run").out
    rendered = json.loads(shown.split("/rayclusters (then wait until it is Ready)\n")[1].split("\n# ----")[0])
    rendered["metadata"] = cluster["metadata"]
    for group in [rendered["spec"]["head_group_spec"], *rendered["spec"]["worker_group_specs"]]:
        group["affinity"] = {"allowed_dedicated_node_groups": ["ng-0123"]}
        for e in group["envs"]:
            if e["name"] == "NEMOTRON_JOB_DIR":
                e["value"] = next(
                    x["value"] for x in spec["head_group_spec"]["envs"] if x["name"] == "NEMOTRON_JOB_DIR"
                )
            if "value_from" in e:
                e["value_from"] = {"secret_name_ref": "wandb-api-key"}  # masked in the dry-run
    rendered["spec"]["ray_version"] = spec["ray_version"]
    assert {k: v for k, v in spec.items() if v not in (None, [], {})} == {
        k: v for k, v in rendered["spec"].items() if v not in (None, [], {})
    }

    (ray_job,) = lepton_api.ray_jobs.values()
    assert (
        ray_job["entrypoint"].endswith("/ray_driver.sh") and "NEMOTRON_RAY_NODES=4" in ray_job["entrypoint"]
    )
    (package,) = lepton_api.packages.values()
    files = zipfile.ZipFile(io.BytesIO(package)).namelist()
    assert {"nemo_rl_config.yaml", "ray_driver.sh"} <= set(files)
    assert "run_grpo_nemo_gym.py" in zipfile.ZipFile(io.BytesIO(package)).read("ray_driver.sh").decode()

    status = json.loads((home / "jobs" / job_id / "status.json").read_text())
    assert status["shape"] == "ray" and status["submission_id"] == ray_job["submission_id"]
    assert json.loads(nemotron("jobs", "status", job_id, "--json").out)["state"] == "running"

    # the record as the version before `shape` wrote it ("launch": "ray") reads as a Ray job all the same: its
    # cancel stops the Ray job and deletes the cluster (a Lepton job's cancel would do neither)
    old = {k: v for k, v in status.items() if k != "shape"} | {"launch": "ray"}
    (home / "jobs" / job_id / "status.json").write_text(json.dumps(old))
    cancelled = nemotron("jobs", "cancel", job_id)
    assert cancelled.code == 0, cancelled.err[-3000:]
    assert ray_job["status"] == "STOPPED" and lepton_api.clusters == {}  # the job stopped, the nodes freed
    assert json.loads((home / "jobs" / job_id / "status.json").read_text())["state"] == "cancelled"


def test_the_ray_job_states_map_to_ours() -> None:
    assert ray_lepton.STATES == {
        "PENDING": "pending",
        "RUNNING": "running",
        "SUCCEEDED": "succeeded",
        "FAILED": "failed",
        "STOPPED": "cancelled",
    }
