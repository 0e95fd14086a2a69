"""`nemotron jobs sync` of a NeMo-RL job replays its metrics from the TensorBoard events NeMo-RL's TensorboardLogger
left (`<job_dir>/logs/nemo_rl/tensorboard/`, written here by the real torch SummaryWriter as NeMo-RL v0.7.0 writes
them), under NeMo-RL's names, adding only the steps the engine's own MLflow logger did not send; against a real
`mlflow server`. The job dir is a real NeMo-RL submission's (our Slurm Ray submit with NeMo-Run's call replaced)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from nemotron.catalog import Catalog
from nemotron.compile import compile_job
from nemotron.jobs.dirs import update_status
from nemotron.launch import ray_slurm, submit
from nemotron.tracking.tb_events import NEMO_RL_EVENTS

EXPERIMENT = "nemo-rl-sync"


def _nemo_rl_job(home: Path, monkeypatch: pytest.MonkeyPatch, mlflow_server: str) -> Path:
    job = compile_job(
        Catalog(),
        "rl/ppo",
        "default",
        [
            "backend=nemo_rl",
            "tracking.mlflow.enabled=true",
            f"tracking.mlflow.tracking_uri={mlflow_server}",
            f"tracking.mlflow.experiment={EXPERIMENT}",
        ],
        profile_name="slurm_rlhf",
        mode="batch",
    )

    def fake_submit(job: Any, job_dir: Path, plan: ray_slurm.RayPlan, launch: Any) -> ray_slurm.SlurmRay:
        return ray_slurm.SlurmRay(
            handle=f"ray://{plan.cluster.name}",
            remote_id="1",
            remote_dir=str(job_dir),
            roles=[plan.role],
            ray_name=plan.cluster.name,
            ray_root=plan.cluster.root,
            outputs=dict(launch.outputs),
            profile=job.profile,
        )

    monkeypatch.setattr(ray_slurm, "submit", fake_submit)
    assert submit.submit(job) == 0
    job_dir = home / "jobs" / job.job_id
    update_status(job_dir, state="succeeded", exit_code=0)
    return job_dir


def _write_events(log_dir: Path, steps: range, loss_at: dict[int, float] | None = None) -> None:
    """What NeMo-RL's TensorboardLogger.log_metrics does: add_scalar(name, value, step), names as its algorithms
    give them (train/..., validation/...)."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(log_dir))
    for step in steps:
        writer.add_scalar("train/loss", (loss_at or {}).get(step, 1.0 / step), step)
        writer.add_scalar("train/reward", 0.1 * step, step)
        if step % 2 == 0:
            writer.add_scalar("validation/accuracy", 0.5 + step / 100, step)
    writer.add_scalar("train/grad_norm", float("nan"), steps[-1])  # MLflow takes no nan: left out
    writer.close()


def test_sync_replays_nemo_rl_s_tensorboard_events_and_only_the_steps_the_run_lacks(
    home: Path, monkeypatch: pytest.MonkeyPatch, mlflow_server: str, run_cli: Any
) -> None:
    job_dir = _nemo_rl_job(home, monkeypatch, mlflow_server)
    job_id = job_dir.name
    events = job_dir / NEMO_RL_EVENTS
    _write_events(events, range(1, 4))
    # a requeued attempt resumed from its step-2 checkpoint: its own writer, in the same dir, steps 3 to 5
    _write_events(events, range(3, 6), loss_at={3: 0.3})
    assert len(list(events.glob("events.out.tfevents.*"))) >= 1
    client = MlflowClient(mlflow_server)
    exp_id = client.create_experiment(EXPERIMENT)
    # the engine's MLflow logger (tagged through MLFLOW_RUN_CONTEXT) sent steps 1 and 2, then its server went away
    engine = client.create_run(exp_id, tags={"nemotron.job_id": job_id}, run_name=job_id)
    for step in (1, 2):
        client.log_metric(engine.info.run_id, "train/loss", 1.0 / step, step=step)
    client.set_terminated(engine.info.run_id, "FAILED")

    for _ in range(2):  # a second sync adds nothing
        synced = run_cli("jobs", "sync", job_id, timeout=300)
        assert synced.code == 0, synced.err[-3000:]
        runs = client.search_runs([exp_id], filter_string=f"tags.`nemotron.job_id` = '{job_id}'")
        assert [r.info.run_id for r in runs] == [engine.info.run_id]  # the engine's run, not another
        run = client.get_run(engine.info.run_id)
        assert run.info.status == "FINISHED"
        assert set(run.data.metrics) == {"train/loss", "train/reward", "validation/accuracy"}
        history = {
            name: [
                (m.step, round(m.value, 6))
                for m in sorted(client.get_metric_history(run.info.run_id, name), key=lambda m: m.step)
            ]
            for name in run.data.metrics
        }
        # steps 1, 2 of train/loss were the engine's; 3 is the resumed attempt's value, as TensorBoard draws it
        assert history["train/loss"] == [(1, 1.0), (2, 0.5), (3, 0.3), (4, 0.25), (5, 0.2)]
        assert history["train/reward"] == [(s, round(0.1 * s, 6)) for s in range(1, 6)]
        assert history["validation/accuracy"] == [(2, 0.52), (4, 0.54)]
