"""How a job's MLflow run ends when the job does not succeed, with the counting fixture step (no model, seconds):
a step that exits 3 part way and a job cancelled with SIGTERM leave a FAILED run holding the metrics logged until
then; a secret in the config never reaches MLflow's params."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

pytestmark = pytest.mark.xdist_group("mlflow")

COUNT = ("steps", "run", "test/count", "-c", "tiny")
SECRET = "s3cret-value-never-logged"


def tracked(uri: str) -> list[str]:
    return [
        "tracking.mlflow.enabled=true",
        f"tracking.mlflow.tracking_uri={uri}",
        "tracking.mlflow.experiment=endings",
    ]


def run_of(client: MlflowClient, job_id: str, ended: bool = True, timeout_s: float = 60) -> Any:
    """The job's run, once it has ended (a cancelled job's step finishes its run as it exits). A detached job's
    tracker makes the experiment itself, on its own thread: until then there is none to search (the first test of
    the file to reach this may be that job's, when the tests run in another order or on another worker)."""
    deadline = time.monotonic() + timeout_s
    while True:
        exp = client.get_experiment_by_name("endings")
        runs = (
            client.search_runs([exp.experiment_id], filter_string=f"tags.`nemotron.job_id` = '{job_id}'")
            if exp is not None
            else []
        )
        if runs and (not ended or runs[0].info.status != "RUNNING"):
            assert len(runs) == 1
            return runs[0]
        assert time.monotonic() < deadline, f"no ended run for {job_id}"
        time.sleep(0.5)


def steps_of(client: MlflowClient, run: Any, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run.info.run_id, key))


def test_a_step_that_fails_leaves_a_failed_run_and_no_secret(
    mlflow_server: str, home: Path, fixture_steps: Path, run_cli: Any
) -> None:
    r = run_cli(
        *COUNT, "trainer.max_steps=5", "trainer.fail_at=3", f"server.token={SECRET}", *tracked(mlflow_server)
    )
    assert r.code == 3, r.err
    (job_dir,) = (home / "jobs").iterdir()
    client = MlflowClient(mlflow_server)
    run = run_of(client, job_dir.name)
    assert run.info.status == "FAILED"
    assert steps_of(client, run, "value") == [1, 2]
    assert run.data.params["server.token"] == "***"
    assert not [k for k, v in run.data.params.items() if SECRET in v]


def test_a_cancelled_job_ends_its_run_failed(
    mlflow_server: str, home: Path, fixture_steps: Path, run_cli: Any
) -> None:
    r = run_cli(
        # 5 rows a second: a rate any MLflow server keeps up with, so the step's last calls fit in the cancel's
        # 10 s grace before SIGKILL (at 20 rows a second a busy CI runner's one-worker server fell behind)
        *COUNT,
        "trainer.max_steps=1000",
        "trainer.sleep_s=0.2",
        "-b",
        "local",
        *tracked(mlflow_server),
    )
    assert r.code == 0, r.err
    job_id = r.out.strip()
    client = MlflowClient(mlflow_server)
    deadline = time.monotonic() + 60
    while len(steps_of(client, run_of(client, job_id, ended=False), "value")) < 3:  # logged live
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert run_cli("jobs", "cancel", job_id).code == 0  # SIGTERM to the step
    run = run_of(client, job_id)
    assert run.info.status == "FAILED"
    rows = [json.loads(line) for line in (home / "jobs" / job_id / "metrics.jsonl").read_text().splitlines()]
    assert steps_of(client, run, "value") == [
        row["step"] for row in rows
    ]  # every row it wrote, sent before the end


def test_sync_into_a_tracker_the_job_did_not_enable(
    mlflow_server: str, home: Path, fixture_steps: Path, run_cli: Any
) -> None:
    r = run_cli(*COUNT, "trainer.max_steps=3")
    assert r.code == 0, r.err
    (job_dir,) = (home / "jobs").iterdir()
    none = run_cli("jobs", "sync", job_dir.name)
    assert none.code == 2 and "logs to no tracker" in none.err and "--to mlflow|wandb|all" in none.err
    bad = run_cli("jobs", "sync", job_dir.name, "--to", "tensorboard")
    assert bad.code == 2 and "not a tracker" in bad.err
    done = run_cli("jobs", "sync", job_dir.name, "--to", "mlflow", "--mlflow-uri", mlflow_server)
    assert done.code == 0, done.err
    client = MlflowClient(mlflow_server)
    exp = client.get_experiment_by_name("nemotron")  # the default experiment of a config that set none
    (run,) = client.search_runs(
        [exp.experiment_id], filter_string=f"tags.`nemotron.job_id` = '{job_dir.name}'"
    )
    assert run.info.status == "FINISHED"
    assert steps_of(client, run, "value") == [1, 2, 3]
    (model,) = client.search_logged_models(
        [exp.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'"
    )
    assert model.name == "count_result" and model.tags["nemotron.ref"] == "count_result:v1"


def test_a_param_longer_than_mlflow_takes_is_cut_with_a_marker() -> None:
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    from nemotron.tracking.mlflow_tracker import TRUNCATED, flat_params

    params = dict(flat_params({"a": {"long": "x" * 7000, "list": [1, 2], "n": 4, "none": None, "empty": {}}}))
    assert len(params["a.long"]) == MAX_PARAM_VAL_LENGTH and params["a.long"].endswith(TRUNCATED)
    assert params["a.long"].startswith("x" * 100)
    assert params == {**params, "a.list": "[1, 2]", "a.n": "4", "a.none": "null", "a.empty": "{}"}
