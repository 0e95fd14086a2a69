"""`nemotron steps run ... -b/-r local_slurm` on the real local cluster: batch and attached runs, cancelling (jobs
cancel and Ctrl-C), the heterogeneous reward-server job, the tiny REINFORCE run with its artifact lineage, and the tiny
eval/policy run with its report's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.slurm.jobs import nemotron

REPO = Path(__file__).resolve().parents[2]
FIXTURE_STEPS = REPO / "tests" / "fixtures" / "steproot"
SERVED_STEPS = Path(__file__).resolve().parent / "steproot"

pytestmark = pytest.mark.slurm(group="single")  # one job of one or two one-CPU tasks at a time


@pytest.fixture
def env(home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "COLUMNS": "200",
        "NEMOTRON_STEPS_PATH": os.pathsep.join([str(FIXTURE_STEPS), str(SERVED_STEPS)]),
    }


def status_of(home: Path, job_id: str) -> dict[str, Any]:
    data = json.loads((home / "jobs" / job_id / "status.json").read_text())
    assert isinstance(data, dict)
    return data


def submit(env: dict[str, str], home: Path, *args: str) -> tuple[str, str]:
    """`steps run ... -b local_slurm`: (our job id, the Slurm job id)."""
    done = nemotron(env, "steps", "run", *args, "-b", "local_slurm")
    assert done.returncode == 0, done.stderr[-3000:]
    job_id = done.stdout.strip().splitlines()[-1]
    return job_id, str(status_of(home, job_id)["remote_id"])


def submitted_script(home: Path, job_id: str) -> str:
    (path,) = (home / "nemorun" / "experiments" / "nemotron" / f"nemotron_{job_id}").glob("*_sbatch.sh")
    return path.read_text()


def lineage_of(env: dict[str, str], ref: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """`artifacts lineage --json` (nodes and edges): the artifact's node, and its direct inputs' nodes by name."""
    graph = json.loads(nemotron(env, "artifacts", "lineage", ref, "--json").stdout)
    nodes = {n["ref"]: n for n in graph["nodes"]}
    return nodes[graph["root"]], {
        e["input"]: nodes[e["parent"]] for e in graph["edges"] if e["child"] == graph["root"]
    }


def test_batch_run_completes_and_registers_its_output_with_lineage(
    env: dict[str, str], home: Path, tmp_path: Path, slurm_cluster: Any
) -> None:
    numbers = tmp_path / "numbers.jsonl"
    numbers.write_text('{"prompt": "1"}\n')
    t0 = time.monotonic()
    job_id, slurm_id = submit(env, home, "test/count", "-c", "tiny", f"inputs.numbers={numbers}")
    assert time.monotonic() - t0 < 60  # detached: returns once sbatch accepted the job

    assert slurm_cluster.final_state(slurm_id) == "COMPLETED"
    shown = json.loads(nemotron(env, "jobs", "status", job_id, "--json").stdout)
    assert shown["state"] == "succeeded" and shown["exit_code"] == 0
    root, inputs = lineage_of(env, "count_result:latest")
    assert root["job_id"] == job_id and root["step"] == "test/count"
    assert inputs["numbers"]["type"] == "prompt_jsonl"  # the input file, registered as external
    logs = nemotron(env, "jobs", "logs", job_id).stdout
    assert "step 3/3 value=3" in logs
    # the script NeMo-Run submitted is the one job.yaml (and --dry-run) show
    launch = yaml.safe_load((home / "jobs" / job_id / "job.yaml").read_text())["launch"]
    assert launch[launch.index("#!/bin/bash") :] == submitted_script(home, job_id)


def test_attached_run_streams_the_log_and_exits_with_the_step_code(env: dict[str, str], home: Path) -> None:
    done = nemotron(env, "steps", "run", "test/count", "-c", "tiny", "trainer.fail_at=2", "-r", "local_slurm")
    assert done.returncode == 3, done.stderr[-3000:]  # the step's own exit code, read from the batch log
    assert "step 1/3 value=1" in done.stderr and "failing on purpose at step 2" in done.stderr
    (job_dir,) = (home / "jobs").iterdir()
    assert status_of(home, job_dir.name)["state"] == "failed"


def test_bad_input_found_by_the_step_is_exit_2_on_slurm_as_locally(env: dict[str, str], home: Path) -> None:
    """The step runs through nemotron.run_step on Slurm too: a UserError is one line and exit 2, no traceback."""
    done = nemotron(
        env, "steps", "run", "test/count", "-c", "tiny", "trainer.bad_input_at=1", "-r", "local_slurm"
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "error: bad input on purpose at step 1" in done.stderr and "Traceback" not in done.stderr
    local = nemotron(env, "steps", "run", "test/count", "-c", "tiny", "trainer.bad_input_at=1")
    assert local.returncode == 2 and "error: bad input on purpose at step 1" in local.stderr


def test_a_hostile_home_is_refused_before_anything_runs(env: dict[str, str], tmp_path: Path) -> None:
    """NeMo-Run's submission runs `mkdir -p <dir>` unquoted: a home with a space or `$(...)` is exit 2, nothing
    written, nothing run (it used to create the file on the submitting machine)."""
    home = tmp_path / "x $(touch PWNED);y" / "home"
    env = {**env, "NEMOTRON_HOME": str(home)}
    for flags in (["-r", "local_slurm"], ["-b", "local_slurm"], ["-b", "local_slurm", "--dry-run"]):
        done = subprocess.run(
            [sys.executable, "-m", "nemotron", "steps", "run", "test/count", "-c", "tiny", *flags],
            capture_output=True,
            text=True,
            env=env,
            timeout=180,
            cwd=tmp_path,
        )
        assert done.returncode == 2, done.stderr[-3000:]
        assert "NeMo-Run's Slurm submission cannot carry" in done.stderr and "Traceback" not in done.stderr
    assert not home.exists() and not list(tmp_path.rglob("PWNED"))


def _lines(stream: Any, seen: list[str], event: threading.Event, marker: str) -> None:
    for line in stream:
        seen.append(line)
        if marker in line:
            event.set()


def test_ctrl_c_on_an_attached_run_cancels_the_slurm_job(
    env: dict[str, str], home: Path, slurm_cluster: Any, nemotron_cmd: Any
) -> None:
    proc = subprocess.Popen(
        nemotron_cmd("steps", "run", "test/count", "-c", "tiny", "trainer.sleep_s=30", "-r", "local_slurm"),
        # the CLI as a user runs it, one process that gets the SIGINT itself: not forked from the suite's warm
        # server behind a client that forwards it (once, in a loaded whole-suite run, that Ctrl-C never arrived)
        env={**env, "NEMOTRON_WARM_CLI": "0"},
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    seen: list[str] = []
    started = threading.Event()
    reader = threading.Thread(target=_lines, args=(proc.stderr, seen, started, "step 1/3"), daemon=True)
    reader.start()
    try:
        assert started.wait(120), "".join(seen)[-3000:]
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        assert proc.wait(90) == 130, "".join(seen)[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    (job_dir,) = (home / "jobs").iterdir()
    status = status_of(home, job_dir.name)
    assert status["state"] == "cancelled"
    assert slurm_cluster.final_state(str(status["remote_id"])).startswith("CANCELLED")


def test_jobs_cancel_stops_a_batch_job(env: dict[str, str], home: Path, slurm_cluster: Any) -> None:
    job_id, slurm_id = submit(env, home, "test/count", "-c", "tiny", "trainer.sleep_s=30")
    done = nemotron(env, "jobs", "cancel", job_id)
    assert done.returncode == 0, done.stderr[-3000:]
    assert slurm_cluster.final_state(slurm_id).startswith("CANCELLED")
    assert json.loads(nemotron(env, "jobs", "status", job_id, "--json").stdout)["state"] == "cancelled"
    assert not (home / "jobs" / job_id / "outputs").exists()  # it never reached the end


def test_jobs_ls_shows_a_failed_batch_job_as_failed_without_jobs_status(
    env: dict[str, str], home: Path, slurm_cluster: Any
) -> None:
    """`jobs ls` used to show `pending` for a Slurm job that had FAILED until `jobs status` asked for it."""
    job_id, slurm_id = submit(env, home, "test/count", "-c", "tiny", "trainer.fail_at=1")
    assert slurm_cluster.final_state(slurm_id) == "FAILED"
    assert status_of(home, job_id)["state"] == "pending"  # nothing has asked Slurm yet
    (row,) = json.loads(nemotron(env, "jobs", "ls", "--json").stdout)
    assert row["job_id"] == job_id and row["state"] == "failed"
    assert status_of(home, job_id)["state"] == "failed"  # recorded: the next listing asks nobody


@pytest.fixture(scope="module")
def tiny_reward_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A random GPT-2 reward model and a word-level tokenizer, saved like a real reward_model_hf."""
    import torch

    from nemotron.models.tiny import tiny_model
    from nemotron.models.tokenizer import word_tokenizer

    torch.set_num_threads(1)
    tokenizer = word_tokenizer("the a movie plot was great awful fine".split())
    model = tiny_model(len(tokenizer), "reward_model", n_positions=32, n_embd=16, n_layer=1, eos_token_id=2)
    path = tmp_path_factory.mktemp("rm") / "reward_model"
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    yield path


def test_hetjob_serves_the_reward_model_beside_the_step(
    env: dict[str, str], home: Path, tiny_reward_model: Path, slurm_cluster: Any
) -> None:
    sentences = ["the movie was great", "the plot was awful", "fine"]
    job_id, slurm_id = submit(
        env, home, "test/served", "-c", "tiny", f"inputs.reward_model={tiny_reward_model}"
    )
    assert slurm_cluster.final_state(slurm_id) == "COMPLETED"
    assert json.loads(nemotron(env, "jobs", "status", job_id, "--json").stdout)["state"] == "succeeded"

    rows = [
        json.loads(line)
        for line in (home / "jobs" / job_id / "outputs" / "scores.jsonl").read_text().splitlines()
    ]
    # the scores are the model's own: the same model scored here, in-process, through the server's scorer
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from nemotron.reward.scorer import scorer_from_reward_model

    model = AutoModelForSequenceClassification.from_pretrained(tiny_reward_model)
    expected = scorer_from_reward_model(
        model, AutoTokenizer.from_pretrained(tiny_reward_model), 32
    ).score_sentences(sentences)
    assert [r["prompt"] for r in rows] == sentences
    assert [r["score"] for r in rows] == pytest.approx(list(expected), abs=1e-5)
    # group 0 (the server) and group 1 (the step) ran on different nodes
    server_node = rows[0]["server"].split("//")[1].split(":")[0]
    assert {server_node, rows[0]["client_node"]} == {"node1", "node2"}
    assert lineage_of(env, "served_scores:latest")[1]["reward_model"]["type"] == "reward_model_hf"

    secrets_file = home / "jobs" / job_id / ".secrets.env"
    assert oct(secrets_file.stat().st_mode & 0o777) == "0o600"
    token = secrets_file.read_text().split("NEMOTRON_REWARD_TOKEN=")[1].strip()
    assert len(token) >= 20
    written = [p for p in (home / "nemorun").rglob("*") if p.is_file()] + [
        home / "jobs" / job_id / "job.yaml"
    ]
    assert not [p for p in written if token in p.read_text(errors="replace")]
    launch = yaml.safe_load((home / "jobs" / job_id / "job.yaml").read_text())["launch"]
    assert launch[launch.index("#!/bin/bash") :] == submitted_script(home, job_id)


TINY = REPO / "src" / "nemotron" / "shipped" / "tiny"


@pytest.mark.slow
def test_tiny_reinforce_runs_on_slurm_and_registers_the_policy_with_lineage(
    env: dict[str, str], home: Path, slurm_cluster: Any
) -> None:
    job_id, slurm_id = submit(env, home, "rl/reinforce", "-c", "tiny")
    assert slurm_cluster.final_state(slurm_id, timeout_s=900) == "COMPLETED", nemotron(
        env, "jobs", "logs", job_id
    ).stdout[-3000:]
    assert json.loads(nemotron(env, "jobs", "status", job_id, "--json").stdout)["state"] == "succeeded"
    root, inputs = lineage_of(env, "tiny_reinforce_policy:latest")
    assert root["job_id"] == job_id and root["step"] == "rl/reinforce"
    assert set(inputs) == {"prompts", "policy", "reward_model"}


def test_tiny_eval_runs_on_slurm_and_registers_its_report_with_lineage(
    env: dict[str, str], home: Path, slurm_cluster: Any
) -> None:
    """eval/policy as a Slurm batch job: the SFT policy against itself with the tiny reward model as the judge
    wins exactly half, and the report's lineage names every input it read."""
    args = ("eval/policy", "-c", "tiny", "judge.kind=reward_model", "inputs.judge=pkg://tiny/reward_model")
    job_id, slurm_id = submit(env, home, *args)
    assert slurm_cluster.final_state(slurm_id, timeout_s=600) == "COMPLETED", nemotron(
        env, "jobs", "logs", job_id
    ).stdout[-3000:]
    assert json.loads(nemotron(env, "jobs", "status", job_id, "--json").stdout)["state"] == "succeeded"
    root, inputs = lineage_of(env, "tiny_eval_report:latest")
    assert root["job_id"] == job_id and root["step"] == "eval/policy" and root["type"] == "eval_report"
    assert set(inputs) == {"policy", "prompts", "baseline", "reward_model", "judge"}
    shown = json.loads(nemotron(env, "artifacts", "show", root["ref"], "--json").stdout)
    summary = json.loads((Path(shown["path"]) / "summary.json").read_text())
    assert summary["metrics"]["win_rate"] == {"mean": 0.5, "low": 0.5, "high": 0.5, "n": 16}
