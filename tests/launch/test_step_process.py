"""Our step process as each executor renders it, from the one place that builds it (launch/step_process.py): the
same `-m nemotron.run_step STEP --job-dir DIR overrides...` everywhere, under each executor's torchrun launcher
and rendezvous when the step is distributed; the same NEMOTRON_* variables; a wrapper goes first, whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemotron.catalog import Catalog
from nemotron.compile import Job, compile_job
from nemotron.core.paths import bundled_root
from nemotron.launch import slurm_executor
from nemotron.launch.lepton import EXIT_LINE, LeptonExecutor
from nemotron.launch.render import local_command
from nemotron.launch.step_process import step_command, step_env

PROFILES = """
[two_local]
extends = "local"
nproc_per_node = 2

[two_slurm]
extends = "local_slurm"
nodes = 2
gpus_per_node = 1

[two_lepton]
extends = "lepton_rl"
nodes = 2
gpus_per_node = 4
"""
TAIL = ["-m", "nemotron.run_step"]


@pytest.fixture
def profiles(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "env.toml").write_text(PROFILES)
    monkeypatch.setenv("NEMOTRON_ENV_FILE", str(tmp_path / "env.toml"))


def sft(profile: str) -> Job:
    """sft, with words for the step itself after its own (`passthrough`)."""
    return compile_job(Catalog(), "sft", "tiny", [], profile_name=profile, passthrough=["--note", "a b"])


def test_every_executor_runs_the_same_step_under_its_own_torchrun(profiles: None, home: Path) -> None:
    entry = str(bundled_root() / "steps" / "sft" / "step.py")

    assert local_command(sft("two_local"), "/j", "py") == [
        "py", "-m", "nemotron.launch.torchrun_agent", "--standalone", "--nproc-per-node=2",
        *TAIL, entry, "--job-dir", "/j", "--note", "a b",
    ]  # fmt: skip

    job = sft("two_slurm")
    (group,) = slurm_executor.slurm_plan(job).groups
    assert group.command.words()[1:] == [
        "-m", "nemotron.launch.torchrun_agent", "--nnodes", "2", "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "$head_node_ip:$((20000+SLURM_JOB_ID%10000))", "--rdzv-id", "$SLURM_JOB_ID",
        *TAIL, entry, "--job-dir", f"{home}/jobs/{job.job_id}", "--note", "'a b'",
    ]  # fmt: skip

    plan = LeptonExecutor().plan(sft("two_lepton"))
    assert list(plan.command) == [
        # every pod under the pod watchdog (launch/pod_watchdog.py): 2 nodes, the profile's default beats and progress
        "python", "-m", "nemotron.launch.pod_watchdog", "--job-dir", plan.job_dir, "--node-rank", "$NODE_RANK",
        "--nodes", "2", "--interval", "30", "--timeout", "90", "--progress", "600,5,1800,1800,1800", "--",
        "python", "-m", "nemotron.launch.torchrun_agent", "--nnodes", "2", "--nproc-per-node", "4",
        "--node-rank", "$NODE_RANK", "--master-addr", "$MASTER_ADDR", "--master-port", "$MASTER_PORT",
        *TAIL, "/nemotron/code/steps/sft/step.py", "--job-dir", plan.job_dir, "--note", "'a b'", EXIT_LINE,
    ]  # fmt: skip


def test_a_wrapper_goes_first_and_only_the_step_s_own_words_are_quoted(profiles: None) -> None:
    entry = str(bundled_root() / "steps" / "sft" / "step.py")
    job = sft("two_lepton")
    words = step_command(
        job, python="$PY", job_dir="/a b", torchrun=("--rdzv", "$HOST:1"), nodes=2, wrapper=("watch", "--")
    ).words()
    assert words == [
        "watch", "--", "$PY", "-m", "nemotron.launch.torchrun_agent", "--rdzv", "$HOST:1",
        *TAIL, entry, "--job-dir", "'/a b'", "--note", "'a b'",
    ]  # fmt: skip
    # one process in all: run_step itself, whatever torchrun flags the executor has
    one = step_command(job, python="py", job_dir="/j", torchrun=("--rdzv", "x"), nodes=1, nproc=1)
    assert one.words() == ["py", *TAIL, entry, "--job-dir", "/j", "--note", "'a b'"]


def test_the_environment_is_nemotron_s_then_the_profile_s_with_its_secrets_apart(profiles: None) -> None:
    env_vars = {"ZED": "z", "EMPTY": "", "HF_TOKEN": "hf_x", "WANDB_API_KEY": "k", "ALPHA": "a"}
    profile = sft("two_slurm").profile.model_copy(update={"env_vars": env_vars, "artifacts_root": None})
    env = step_env(profile, "/h", "/h/jobs/j")
    assert env.variables == (
        ("NEMOTRON_HOME", "/h"),
        ("NEMOTRON_ARTIFACTS_ROOT", "/h/artifacts"),
        ("NEMOTRON_JOB_DIR", "/h/jobs/j"),
        ("ALPHA", "a"),
        ("ZED", "z"),
    )
    assert env.secrets == ("HF_TOKEN", "WANDB_API_KEY")
    shared = profile.model_copy(update={"artifacts_root": "/store"})
    assert step_env(shared, "/h", "/j").variables[1] == ("NEMOTRON_ARTIFACTS_ROOT", "/store")
