"""MLflow tracking end to end against a real `mlflow server` (tests/conftest.py `mlflow_server`), read back with
MlflowClient: a tiny rl/ppo run's params, metrics (metrics.jsonl's names and steps), system metrics and its policy
and critic as logged models naming their inputs; a run whose tracker is down finishes with one warning and is filled
afterwards by `nemotron jobs sync`, twice without duplicates; the cost of a tracker that never answers is bounded."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from nemotron.config.stepconfig import Tracking
from nemotron.core.procs import free_port
from nemotron.tracking.base import RunInfo
from nemotron.tracking.fanout import Trackers, build_trackers

from .tiny_ppo import MLFLOW_EXPERIMENT as EXPERIMENT
from .tiny_ppo import SHORT, expected_steps, job_dirs

# one worker under xdist: the session's first run (conftest.py, test_wandb_run.py reads it too) is shared, and so is
# the session mlflow server
pytestmark = pytest.mark.xdist_group("mlflow")


def the_run(client: MlflowClient, job_id: str) -> Any:
    exp = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`nemotron.job_id` = '{job_id}'")
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return runs[0]


def models_of(client: MlflowClient, run: Any) -> dict[str, Any]:
    found = client.search_logged_models(
        [run.info.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'"
    )
    return {m.name: m for m in found}


def logged_state(client: MlflowClient, run_id: str) -> tuple[dict[str, list[int]], int, dict[str, str]]:
    """Every metric's steps, the number of logged models, and the params: what a sync must not add to twice."""
    run = client.get_run(run_id)
    history = {k: sorted(m.step for m in client.get_metric_history(run_id, k)) for k in run.data.metrics}
    return history, len(models_of(client, run)), dict(run.data.params)


@pytest.fixture(scope="module")
def first_run(tracked_ppo_run: Any) -> Path:
    """The job dir of the tiny rl/ppo run that logged live to the mlflow server (and to an offline W&B run)."""
    job_dir: Path = tracked_ppo_run.job_dir
    return job_dir


def test_a_tiny_ppo_run_shows_in_mlflow(mlflow_server: str, first_run: Path) -> None:
    client = MlflowClient(mlflow_server)
    run = the_run(client, first_run.name)
    assert run.info.status == "FINISHED" and run.info.run_name == first_run.name
    assert run.data.tags["nemotron.step"] == "rl/ppo" and run.data.tags["nemotron.preset"] == "tiny"
    assert run.data.tags["team"] == "alignment"
    params = run.data.params
    assert params["trainer.max_steps"] == "4" and params["ppo.ppo_epochs"] == "2"
    assert params["outputs.policy"] == "tiny_ppo_policy"

    # metrics.jsonl's names, each at exactly its steps there
    want = expected_steps(first_run)
    assert {"rewards", "critic_loss", "eval_rm_after"} <= set(want)
    for name, steps in want.items():
        got = sorted(m.step for m in client.get_metric_history(run.info.run_id, name))
        assert got == sorted(steps), name
    assert len(want["rewards"]) == 4
    assert any(k.startswith("system/cpu_utilization") for k in run.data.metrics), sorted(run.data.metrics)

    # the registered policy and critic, each naming our ref, content hash, path and inputs
    models = models_of(client, run)
    assert set(models) == {"tiny_ppo_policy", "tiny_ppo_critic"}
    policy, critic = models["tiny_ppo_policy"], models["tiny_ppo_critic"]
    assert (
        policy.tags["nemotron.ref"] == "tiny_ppo_policy:v1"
        and critic.tags["nemotron.ref"] == "tiny_ppo_critic:v1"
    )
    assert policy.params["nemotron.path"] == str(first_run / "outputs" / "policy")
    assert policy.model_type == "checkpoint_hf" and str(policy.status).endswith("READY")
    shown = json.loads((first_run / "status.json").read_text())
    assert shown["state"] == "succeeded"
    for m in (policy, critic):
        assert m.params["nemotron.input.policy"] == "external.sft_policy:v1"
        assert m.params["nemotron.input.reward_model"] == "external.reward_model:v1"
        assert m.params["nemotron.input.prompts"] == "external.prompts.jsonl:v1"
    outputs = client.get_run(run.info.run_id).outputs.model_outputs
    assert {o.model_id for o in outputs} == {policy.model_id, critic.model_id}


def test_a_down_tracker_never_fails_the_job_and_sync_fills_the_run(
    mlflow_server: str, first_run: Path, tracked_home: dict[str, str], run_cli: Any
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    r = run_cli(
        "steps", "run", "rl/ppo", "-c", "tiny", *SHORT, "inputs.policy=tiny_ppo_policy:v1",
        "tracking.mlflow.enabled=true", f"tracking.mlflow.tracking_uri={dead}",
        f"tracking.mlflow.experiment={EXPERIMENT}", env=tracked_home, timeout=600,
    )  # fmt: skip
    assert r.code == 0, r.err[-3000:]
    text = r.out + r.err
    warned = [line for line in text.splitlines() if "tracking:" in line]
    assert len(warned) == 1, warned
    job_dir = job_dirs(tracked_home)[-1]
    assert "mlflow is skipped" in warned[0] and f"nemotron jobs sync {job_dir.name}" in warned[0]
    assert "Traceback" not in text

    # still down: exit 3, one clear line
    still = run_cli("jobs", "sync", job_dir.name, env=tracked_home, timeout=120)
    assert still.code == 3 and still.err.startswith("error: could not sync"), still.err

    synced = run_cli(
        "jobs", "sync", job_dir.name, "--mlflow-uri", mlflow_server, env=tracked_home, timeout=300
    )
    assert synced.code == 0, synced.err[-3000:]
    sent = re.search(r"synced to mlflow \((\d+) metric rows sent;", synced.out)
    assert sent and int(sent[1]) > 0, synced.out  # every row: the run had none
    client = MlflowClient(mlflow_server)
    run = the_run(client, job_dir.name)
    assert run.info.status == "FINISHED"
    want = expected_steps(job_dir)
    history, n_models, params = logged_state(client, run.info.run_id)
    assert history == {k: sorted(v) for k, v in want.items()}
    assert n_models == 2 and params["inputs.policy"] == str(first_run / "outputs" / "policy")  # as bound

    # the input was logged to this server by the first job: its logged model is linked by id
    parent = models_of(client, the_run(client, first_run.name))["tiny_ppo_policy"]
    policy = models_of(client, run)["tiny_ppo_policy"]
    assert policy.params["nemotron.input.policy"] == "tiny_ppo_policy:v1"
    assert policy.tags["nemotron.input.policy.model_id"] == parent.model_id
    assert parent.model_id in {i.model_id for i in client.get_run(run.info.run_id).inputs.model_inputs}

    # twice more, and once over the live-logged first run: nothing is added
    for target in (job_dir, job_dir, first_run):
        before = logged_state(client, the_run(client, target.name).info.run_id)
        again = run_cli(
            "jobs", "sync", target.name, "--mlflow-uri", mlflow_server, env=tracked_home, timeout=300
        )
        assert again.code == 0, again.err[-3000:]
        assert logged_state(client, the_run(client, target.name).info.run_id) == before
        # and it says so: it counts what it sent, not what the job has
        assert re.search(
            r"synced to mlflow \(0 of \d+ metric rows sent: the run had the others;", again.out
        ), again.out


def test_mlflow_without_a_server_is_refused_before_anything_is_written(
    home: Path, run_cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    r = run_cli("steps", "run", "rl/ppo", "-c", "tiny", "tracking.mlflow.enabled=true")
    assert r.code == 2
    assert r.err.strip().splitlines() == [
        "error: tracking.mlflow.enabled is true but no tracking server is named: set "
        "tracking.mlflow.tracking_uri=http://HOST:PORT or $MLFLOW_TRACKING_URI"
    ]
    assert not home.exists()


def test_sync_of_an_unknown_job_is_exit_2(home: Path, run_cli: Any) -> None:
    r = run_cli("jobs", "sync", "rl-ppo-nope")
    assert r.code == 2 and "no job 'rl-ppo-nope'" in r.err


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A server that accepts connections and never answers (a hung host behind a live port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_tracker_that_never_answers_costs_training_at_most_the_finish_bound(
    silent_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The real MlflowTracker against a server that never answers: each call returns at once on the training
    thread, and the job's end waits no longer than the bound before it moves on with one warning."""
    for key in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.setenv(key, "restored after the test")
        monkeypatch.delenv(key)  # our defaults apply, as in a step process
    tracking = Tracking.model_validate({"mlflow": {"enabled": True, "tracking_uri": silent_server}})
    bound = 3.0
    trackers = Trackers(
        build_trackers(tracking, tmp_path), tracking.retries, "job-silent", finish_wait_s=bound
    )
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "10"
    began = time.monotonic()
    trackers.start(RunInfo("job-silent", "rl/ppo", "tiny", str(tmp_path), {}))
    for step in range(1, 51):
        trackers.log_metrics(step, {"rewards": 0.5})
    queued = time.monotonic() - began
    with caplog.at_level(logging.WARNING, logger="nemotron"):
        done = trackers.finish(ok=True)
    total = time.monotonic() - began
    assert queued < 0.5, f"the training thread waited {queued:.2f} s to queue 51 calls"
    assert done == {"mlflow": False}
    assert bound <= total < bound + 1.5, f"finish took {total:.2f} s against a {bound} s bound"
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "mlflow is skipped" in warning and "within 3 s" in warning
