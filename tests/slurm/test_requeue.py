"""Preemption on the real local Slurm: a built-in job requeued mid-run (`scontrol requeue`, what preemption with
requeue does) resumes from its own newest checkpoint and ends bitwise equal to an uninterrupted run; the same
job requeued after it finished trains nothing and registers no second version."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.slurm.jobs import fake_nemo_rl_profile, nemotron, wait_for

pytestmark = pytest.mark.slurm

# in_process rewards locally, the served reward model on Slurm: both score alike, so the weights must agree
ARGS = (
    "rl/reinforce -c tiny trainer.max_steps=8 checkpoint.save_interval=3 reward.source=in_process "
    "trainer.num_prompts_per_step=8 eval.num_prompts=0"
).split()


def policy_sha(env: dict[str, str]) -> str:
    shown = nemotron(env, "artifacts", "show", "tiny_reinforce_policy:latest", "--json")
    assert shown.returncode == 0, shown.stderr[-2000:]
    return str(json.loads(shown.stdout)["sha256"])


@pytest.fixture(scope="module")
def uninterrupted_sha(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The same run, uninterrupted, on this machine."""
    env = {**os.environ, "NEMOTRON_HOME": str(tmp_path_factory.mktemp("ref") / "home")}
    done = nemotron(env, "steps", "run", *ARGS)
    assert done.returncode == 0, done.stderr[-2000:]
    return policy_sha(env)


def requeue_now(slurm_id: str) -> None:
    """`scontrol requeue`, then start it at once: Slurm holds a requeued job for about two minutes otherwise
    (its BeginTime), which a real preemption waits out too."""
    subprocess.run(["scontrol", "requeue", slurm_id], check=True, capture_output=True)

    def pending() -> bool:  # back in the queue: only then does a new StartTime hold
        state = subprocess.run(["squeue", "-h", "-j", slurm_id, "-o", "%T"], capture_output=True, text=True)
        return "PENDING" in state.stdout

    wait_for(pending, 60, "the requeued job pending")
    subprocess.run(
        ["scontrol", "update", f"jobid={slurm_id}", "StartTime=now"], check=True, capture_output=True
    )


def steps_logged(job_dir: Path) -> list[int]:
    path = job_dir / "metrics.jsonl"
    return [json.loads(x)["step"] for x in path.read_text().splitlines()] if path.is_file() else []


def _submit(env: dict[str, str], home: Path, submitted: list[str]) -> tuple[str, Path, str]:
    """ARGS submitted to local_slurm in `env`: (job id, job dir, Slurm id), the Slurm id added to `submitted`."""
    done = nemotron(env, "steps", "run", *ARGS, "-b", "local_slurm")
    assert done.returncode == 0, done.stderr[-3000:]
    job_id = done.stdout.strip().splitlines()[-1]
    job_dir = home / "jobs" / job_id
    slurm_id = str(json.loads((job_dir / "status.json").read_text())["remote_id"])
    submitted.append(slurm_id)
    return job_id, job_dir, slurm_id


@pytest.fixture
def submitted(home: Path) -> Iterator[list[str]]:
    """Slurm ids of the jobs a test submitted, cancelled at teardown whatever happened (the cluster is shared)."""
    ids: list[str] = []
    yield ids
    for slurm_id in ids:
        subprocess.run(["scancel", slurm_id], capture_output=True)


@pytest.mark.slurm(group="single")
def test_a_job_requeued_before_its_first_checkpoint_starts_over_and_logs_each_step_once(
    home: Path, slurm_cluster: Any, uninterrupted_sha: str, submitted: list[str]
) -> None:
    """Issue 43: requeued at step 2 (the first checkpoint is step 3's), the restart trains from step 1 again, and
    metrics.jsonl held steps 1-2 twice; it now starts over with the file."""
    env = {**os.environ, "NEMOTRON_FAULT": "stall@3", "NEMOTRON_FAULT_STALL_S": "300"}
    _, job_dir, slurm_id = _submit(env, home, submitted)
    wait_for(lambda: 2 in steps_logged(job_dir), 240, "the run reaching step 2")
    requeue_now(slurm_id)
    assert slurm_cluster.final_state(slurm_id, timeout_s=240) == "COMPLETED"
    assert steps_logged(job_dir) == list(range(1, 9))  # each step once, the lost run's 1-2 gone
    assert (
        policy_sha({k: v for k, v in env.items() if not k.startswith("NEMOTRON_FAULT")}) == uninterrupted_sha
    )


@pytest.mark.slurm(group="single")  # the built-in engine: one one-CPU task
def test_a_requeued_job_resumes_from_its_checkpoint_and_a_finished_one_is_not_retrained(
    home: Path, slurm_cluster: Any, uninterrupted_sha: str, submitted: list[str]
) -> None:
    env = {**os.environ, "NEMOTRON_FAULT": "stall@5", "NEMOTRON_FAULT_STALL_S": "300"}
    job_id, job_dir, slurm_id = _submit(env, home, submitted)

    # step 3's checkpoint is written and the run hangs in step 5 (on its first start only): requeue it there
    wait_for(lambda: 4 in steps_logged(job_dir), 240, "the run reaching step 4")
    requeue_now(slurm_id)
    assert slurm_cluster.final_state(slurm_id, timeout_s=240) == "COMPLETED"
    env = {k: v for k, v in env.items() if not k.startswith("NEMOTRON_FAULT")}
    assert json.loads(nemotron(env, "jobs", "status", job_id, "--json").stdout)["state"] == "succeeded"
    assert steps_logged(job_dir) == list(range(1, 9))  # resumed after step 3, not from step 1, no step twice
    assert policy_sha(env) == uninterrupted_sha

    # requeued once finished: the restart sees its registered output and exits 0 without training
    logs = Path(json.loads((job_dir / "status.json").read_text())["remote_dir"])
    requeue_now(slurm_id)
    wait_for(
        lambda: any("already finished and registered" in p.read_text() for p in logs.glob("log-*_2.out")),
        180,
        "the second restart",
    )
    assert slurm_cluster.final_state(slurm_id, timeout_s=120) == "COMPLETED"
    versions = json.loads(nemotron(env, "artifacts", "ls", "--json").stdout)
    assert [a["ref"] for a in versions if a["ref"].startswith("tiny_reinforce_policy:")] == [
        "tiny_reinforce_policy:v1"
    ]
    assert steps_logged(job_dir) == list(range(1, 9))


def test_a_requeued_nemo_rl_job_resumes_from_its_newest_step(
    home: Path, tmp_path: Path, slurm_cluster: Any, submitted: list[str]
) -> None:
    """backend=nemo_rl: the requeued job runs the same driver with the same checkpointing.checkpoint_dir, where
    NeMo-RL's CheckpointManager finds the newest step_N and continues after it (the fake driver does the same:
    tests/fixtures/fake_nemo_rl). One checkpoint every 2 steps, one second a step."""
    (tmp_path / "env.toml").write_text(fake_nemo_rl_profile("ray2_steps", FAKE_NEMO_RL_STEP_S="1"))
    env = {**os.environ, "NEMOTRON_ENV_FILE": str(tmp_path / "env.toml")}
    args = [
        "rl/reinforce",
        "-c",
        "tiny",
        "backend=nemo_rl",
        "eval.task=null",
        "reinforce.kl_in=reward_sequence_mean",
    ]
    done = nemotron(
        env, "steps", "run", *args, "trainer.max_steps=12", "checkpoint.save_interval=2", "-b", "ray2_steps"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    job_id = done.stdout.strip().splitlines()[-1]
    job_dir = home / "jobs" / job_id
    status = json.loads((job_dir / "status.json").read_text())
    slurm_id = str(status["remote_id"])
    submitted.append(slurm_id)
    checkpoints = job_dir / "checkpoints" / "nemo_rl"

    wait_for(lambda: (checkpoints / "step_4").is_dir(), 240, "NeMo-RL's step_4")
    requeue_now(slurm_id)
    assert slurm_cluster.final_state(slurm_id, timeout_s=240) == "COMPLETED"
    shown = json.loads(nemotron(env, "jobs", "status", job_id, "--json").stdout)
    assert shown["state"] == "succeeded" and shown["registered"] == ["tiny_reinforce_policy:v1"], shown

    log = "".join(p.read_text() for p in Path(status["remote_dir"]).glob("log-*driver*.out"))
    resumed = int(log.rsplit("resuming from step_", 1)[1].split()[0])
    assert resumed >= 4
    after = log.rsplit("resuming from step_", 1)[1]
    ran = [int(line.split()[1].split("/")[0]) for line in after.splitlines() if line.startswith("step ")]
    assert ran == list(range(resumed + 1, 13))  # the rest, not from step 1
    assert (checkpoints / "step_12" / "training_info.json").is_file()


@pytest.mark.slurm(group="single")  # the built-in engine: one one-CPU task
def test_the_time_limit_warning_checkpoints_requeues_and_the_job_resumes(
    home: Path, slurm_cluster: Any, uninterrupted_sha: str, submitted: list[str]
) -> None:
    """What `#SBATCH --signal=USR1@N` does before the time limit, sent now (`scancel --signal=USR1`, to the job's
    steps as Slurm does): the step saves at the end of the step it is in (5: no periodic save there), requeues its
    own job, and the restart resumes there; the reward server beside it ignores the signal."""
    env = {**os.environ, "NEMOTRON_FAULT": "stall@5", "NEMOTRON_FAULT_STALL_S": "15"}
    job_id, job_dir, slurm_id = _submit(env, home, submitted)

    # time in the queue (behind another test's job) is not what is bounded
    slurm_cluster.wait_running(slurm_id)
    wait_for(lambda: 4 in steps_logged(job_dir), 240, "the run reaching step 4")
    subprocess.run(["scancel", "--signal=USR1", slurm_id], check=True, capture_output=True)

    def requeued() -> bool:
        state = subprocess.run(["squeue", "-h", "-j", slurm_id, "-o", "%T"], capture_output=True, text=True)
        return "PENDING" in state.stdout

    wait_for(requeued, 120, "the job to requeue itself")
    assert (job_dir / "checkpoints" / "step_000005" / "state.json").is_file()
    subprocess.run(
        ["scontrol", "update", f"jobid={slurm_id}", "StartTime=now"], check=True, capture_output=True
    )
    assert slurm_cluster.final_state(slurm_id, timeout_s=240) == "COMPLETED"
    env = {k: v for k, v in env.items() if not k.startswith("NEMOTRON_FAULT")}
    assert json.loads(nemotron(env, "jobs", "status", job_id, "--json").stdout)["state"] == "succeeded"
    assert steps_logged(job_dir) == list(range(1, 9))
    assert policy_sha(env) == uninterrupted_sha
