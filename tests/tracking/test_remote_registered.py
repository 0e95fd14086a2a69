"""A remote engine's registered artifacts reach the job's trackers from where they are registered
(`python -m nemotron.artifacts.lineage`, the end of a NeMo-RL driver or NeMo-Aligner actor on the cluster), into the
one run the engine's own logger made for the job; a tracker that is down changes nothing but one warning line.
The job dir is a real NeMo-Aligner submission's (our Slurm submit with the scheduler call replaced), the trackers a
real `mlflow server` and wandb offline."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient
from tests.engines import test_nemo_aligner as aligner  # its NeMo-Aligner job builders
from tests.tracking import wandb_records as rec

from nemotron.core.procs import free_port
from nemotron.jobs.record import read_status
from nemotron.launch import slurm, slurm_script, submit
from nemotron.tracking.wandb_tracker import run_id


def _submitted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *tracking: str
) -> tuple[Path, dict[str, str]]:
    """A submitted rl/ppo NeMo-Aligner job's dir, and its outputs, written as the actor leaves them."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    nemo = aligner._nemo_file(tmp_path / "sft.nemo")
    job = aligner._job(
        "rl/ppo",
        f"inputs.prompts={prompts}",
        f"inputs.policy={nemo}",
        f"inputs.reward_model={nemo}",
        *tracking,
    )

    def fake_submit(job: Any, job_dir: Path, plan: slurm.SlurmPlan) -> dict[str, Any]:
        return {"handle": "slurm_tunnel://nemo_run/1", "remote_id": "1", "remote_dir": str(tmp_path)}

    monkeypatch.setattr(slurm_script, "submit_job", fake_submit)
    assert submit.submit(job) == 0
    job_dir = Path(os.environ["NEMOTRON_HOME"]) / "jobs" / job.job_id
    outputs: dict[str, str] = read_status(job_dir)["register"]
    for path in outputs.values():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(b"trained " + path.encode())
    return job_dir, outputs


def _register(
    job_dir: Path, outputs: dict[str, str], without: str | None = None
) -> subprocess.CompletedProcess[str]:
    """What the actor's register lines run on the cluster; `without`: a tracker library that Python there cannot
    import (the name made unimportable in that process, as Python does for a name set to None in sys.modules)."""
    cmd = [sys.executable, "-m", "nemotron.artifacts.lineage", "--job-dir", str(job_dir)]
    if without:
        hide = f"import runpy, sys; sys.modules[{without!r}] = None; "
        hide += "runpy.run_module('nemotron.artifacts.lineage', run_name='__main__')"
        cmd[1:3] = ["-c", hide]
    cmd += [f"{name}={path}" for name, path in sorted(outputs.items())]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))}
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env={**env, "WANDB_SILENT": "true"}
    )


def test_registered_artifacts_join_the_engine_s_run_in_both_trackers_once(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mlflow_server: str
) -> None:
    experiment = "remote-registered"
    job_dir, outputs = _submitted(
        tmp_path,
        monkeypatch,
        "tracking.mlflow.enabled=true",
        f"tracking.mlflow.tracking_uri={mlflow_server}",
        f"tracking.mlflow.experiment={experiment}",
        "tracking.wandb.enabled=true",
        "tracking.wandb.mode=offline",
    )
    job_id = job_dir.name
    client = MlflowClient(mlflow_server)
    # the run NeMo's MLflow logger made on the actor, tagged through exp_manager.mlflow_logger_kwargs.tags
    exp_id = client.create_experiment(experiment)
    engine_run = client.create_run(exp_id, tags={"nemotron.job_id": job_id}, run_name="")
    client.log_metric(engine_run.info.run_id, "reward", 0.5, step=1)
    client.set_terminated(engine_run.info.run_id)

    done = _register(job_dir, outputs)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING" not in done.stderr, done.stderr[-3000:]
    runs = client.search_runs([exp_id], filter_string=f"tags.`nemotron.job_id` = '{job_id}'")
    assert [r.info.run_id for r in runs] == [engine_run.info.run_id]  # one run per job
    models = client.search_logged_models(
        [exp_id], filter_string=f"source_run_id = '{engine_run.info.run_id}'"
    )
    by_name = {m.name: m for m in models}
    assert set(by_name) == {"ppo_policy", "ppo_critic"}
    policy = by_name["ppo_policy"]
    assert policy.tags["nemotron.ref"] == "ppo_policy:v1" and policy.tags["nemotron.job_id"] == job_id
    assert {k for k in policy.params if k.startswith("nemotron.input.")} == {
        "nemotron.input.prompts",
        "nemotron.input.policy",
        "nemotron.input.reward_model",
    }
    # W&B: the run id is the job's, the one the engine's WandbLogger got; the outputs are its artifacts
    (first,) = rec.run_files(job_dir)
    (run,) = rec.of_type(first, "run")
    assert run.run_id == run_id(job_id)
    assert {a.name for a in rec.of_type(first, "artifact")} == {"ppo_policy", "ppo_critic"}

    again = _register(job_dir, outputs)  # a requeued actor registers again: nothing doubles
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(client.search_logged_models([exp_id])) == 2


def test_a_down_tracker_is_one_warning_and_the_registration_stands(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()  # nothing listens there: every connection refused
    job_dir, outputs = _submitted(
        tmp_path,
        monkeypatch,
        "tracking.mlflow.enabled=true",
        f"tracking.mlflow.tracking_uri=http://127.0.0.1:{port}",
        "tracking.retries=1",
    )
    done = _register(job_dir, outputs)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("nemotron: registered ") and "ppo_policy:v1" in done.stdout
    warned = [ln for ln in done.stderr.splitlines() if "WARNING" in ln]
    assert len(warned) == 1, done.stderr[-3000:]
    assert "mlflow is skipped" in warned[0] and f"nemotron jobs sync {job_dir.name}" in warned[0]


def test_a_tracker_library_missing_on_the_cluster_is_one_warning(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_dir, outputs = _submitted(
        tmp_path,
        monkeypatch,
        "tracking.mlflow.enabled=true",
        "tracking.mlflow.tracking_uri=http://127.0.0.1:9",
    )
    done = _register(job_dir, outputs, without="mlflow")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("nemotron: registered ") and "ppo_policy:v1" in done.stdout
    warned = [ln for ln in done.stderr.splitlines() if "WARNING" in ln]
    assert len(warned) == 1, done.stderr[-3000:]
    assert "needs the mlflow client" in warned[0] and f"nemotron jobs sync {job_dir.name}" in warned[0]
