"""The Engine and Executor interfaces: registries instead of if-chains, refusals before anything is written,
and outputs of a remote engine registered (with lineage) once its scheduler says the job succeeded."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal

import pytest
import yaml

from nemotron.artifacts.store import ArtifactStore
from nemotron.engines.base import ENGINES, engine_named
from nemotron.errors import UserError
from nemotron.launch import remote
from nemotron.launch.executor import EXECUTORS, executor_named
from nemotron.launch.records import RemoteRecord, RemoteState

SRC = Path(__file__).resolve().parents[2] / "src" / "nemotron"


def test_every_registered_engine_and_executor_loads() -> None:
    for name in ENGINES:
        assert engine_named(name).name == name
    for kind in EXECUTORS:
        ex = executor_named(kind)
        assert ex.kind == kind
        for method in ("placement", "render", "submit", "refresh", "print_logs", "cancel"):
            assert callable(getattr(ex, method))


def test_unknown_names_get_a_suggestion() -> None:
    with pytest.raises(UserError, match="did you mean 'nemo_rl'"):
        engine_named("nemo-rl")
    with pytest.raises(UserError, match="did you mean 'slurm'"):
        executor_named("slurmm")


def test_no_engine_or_executor_if_chains_outside_the_registries() -> None:
    chain = re.compile(
        r"""(\.executor|\(["'](executor|backend)["']\)|\[["'](executor|backend)["']\])\s*(==|!=|in\s*\()"""
    )
    offenders = []
    for path in SRC.rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if chain.search(line) and "remote=profile.executor" not in line:
                offenders.append(f"{path.relative_to(SRC)}:{n}: {line.strip()}")
    assert offenders == []


class Ended(RemoteRecord):
    """A job record whose scheduler says the job ended in `answer` (a record's answers, nothing else)."""

    shape: Literal["process"] = "process"
    answer: str

    def state(self) -> RemoteState:
        return RemoteState(self.answer)

    def exit_code(self) -> int | None:
        return None

    def log_reader(self, job_dir: Path, role: str | None = None) -> remote.LogTail:
        return remote.LogTail(lambda: [])

    def cancel(self) -> None:
        raise AssertionError("not cancelled here")


def ended_in(state: str) -> remote.Reader:
    """Read a job's record from its status.json as a job that ended in `state`."""
    return lambda status, job_dir: Ended.model_validate({**status, "answer": state})


def _remote_job(home: Path, policy_input: Path, output: Path) -> Path:
    """A job record as `create_job_dir` writes it, for a run whose engine registers nothing itself."""
    job_dir = home / "jobs" / "rl-ppo-20260101-000000-abcd"
    job_dir.mkdir(parents=True)
    record = {
        "job_id": job_dir.name,
        "step": "rl/ppo",
        "preset": "default",
        "config_hash": "c0ffee",
        "executor": "slurm",
        "created_at": "2026-01-01T00:00:00+00:00",
        "mode": "batch",
        "config": {},
        "launch": "#!/bin/bash\n",
        "profile": {},
        "inputs": [
            {
                "name": "policy",
                "kind": "path",
                "path": str(policy_input),
                "artifact_id": None,
                "ref": str(policy_input),
                "actual_type": "checkpoint_hf",
                "expected_type": "checkpoint_hf",
            }
        ],
        "outputs": {"policy": {"artifact": "ppo_policy", "type": "checkpoint_hf"}},
    }
    (job_dir / "job.yaml").write_text(yaml.safe_dump(record))
    status = {
        "state": "running",
        "handle": "h",
        "remote_id": "7",
        "submitted_at": "2026-01-01T00:00:00+00:00",
        "register": {"policy": str(output)},
    }
    (job_dir / "status.json").write_text(json.dumps(status))
    return job_dir


def _model_dir(path: Path, text: str) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "gpt2", "note": text}))
    (path / "model.safetensors").write_bytes(text.encode())
    return path


def test_a_remote_run_that_succeeded_registers_its_outputs_with_lineage(home: Path, tmp_path: Path) -> None:
    sft = _model_dir(tmp_path / "sft", "sft")
    out = _model_dir(tmp_path / "run" / "outputs" / "policy", "aligned")
    job_dir = _remote_job(home, sft, out)

    status = remote.refresh_status(job_dir, ended_in("succeeded"))

    assert (
        status["state"] == "succeeded"
        and status["exit_code"] == 0
        and status["registered"] == ["ppo_policy:v1"]
    )
    store = ArtifactStore(home / "artifacts")
    art = store.resolve("ppo_policy")
    assert Path(art.path) == out and art.type == "checkpoint_hf"
    ((edge, parent),) = store.parents(art.id)
    assert edge == "policy" and Path(parent.path) == sft
    assert remote.refresh_status(job_dir, ended_in("succeeded"))["registered"] == [
        "ppo_policy:v1"
    ]  # once only
    assert [a.ref for a in store.list_artifacts(name="ppo_policy")] == ["ppo_policy:v1"]


def test_a_run_that_ended_without_its_outputs_fails_and_registers_nothing(home: Path, tmp_path: Path) -> None:
    job_dir = _remote_job(home, _model_dir(tmp_path / "sft", "sft"), tmp_path / "never-written")

    status = remote.refresh_status(job_dir, ended_in("succeeded"))

    assert status["state"] == "failed" and status["exit_code"] == 1 and "never-written" in status["error"]
    assert (
        not ArtifactStore(home / "artifacts").exists()
        or not ArtifactStore(home / "artifacts").list_artifacts()
    )


def test_a_failed_run_registers_nothing(home: Path, tmp_path: Path) -> None:
    out = _model_dir(tmp_path / "out", "half-trained")
    job_dir = _remote_job(home, _model_dir(tmp_path / "sft", "sft"), out)

    assert remote.refresh_status(job_dir, ended_in("failed"))["state"] == "failed"
    assert (
        not ArtifactStore(home / "artifacts").exists()
        or not ArtifactStore(home / "artifacts").list_artifacts()
    )


def test_outputs_the_run_registered_on_the_cluster_are_recorded_not_registered_twice(
    home: Path, tmp_path: Path
) -> None:
    from nemotron.artifacts.lineage import main as register_main

    sft = _model_dir(tmp_path / "sft", "sft")
    out = _model_dir(tmp_path / "run" / "outputs" / "policy", "aligned")
    job_dir = _remote_job(home, sft, out)
    assert (
        register_main(["--job-dir", str(job_dir), f"policy={out}"]) == 0
    )  # what the driver script runs last
    assert register_main(["--job-dir", str(job_dir), f"policy={out}"]) == 0  # again: nothing twice

    status = remote.refresh_status(job_dir, ended_in("succeeded"))

    assert status["state"] == "succeeded" and status["registered"] == ["ppo_policy:v1"]
    assert [a.ref for a in ArtifactStore(home / "artifacts").list_artifacts(name="ppo_policy")] == [
        "ppo_policy:v1"
    ]


def test_outputs_on_storage_this_machine_cannot_see_are_not_called_missing(
    home: Path, tmp_path: Path
) -> None:
    job_dir = _remote_job(
        home, _model_dir(tmp_path / "sft", "sft"), Path("/lustre/nowhere/jobs/x/outputs/policy")
    )

    status = remote.refresh_status(job_dir, ended_in("succeeded"))

    assert status["state"] == "succeeded" and "does not see" in status["registration"]
