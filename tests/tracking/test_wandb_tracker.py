"""WandbTracker against the real wandb library in offline mode: a job is driven through the Tracker protocol, then
the run's `.wandb` file is read back as wandb's own Records (wandb_records.py) and checked. One wandb service
process serves the whole module (wandb starts it once per Python process)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import wandb

from nemotron.artifacts.store import Artifact, ArtifactStore
from nemotron.config.stepconfig import WandbTracking
from nemotron.tracking.base import LoggedArtifact, RunInfo
from nemotron.tracking.wandb_tracker import LAST_STEP_FILE, WandbTracker, reference_artifact, run_id

from . import wandb_records as rec

JOB_ID = "rl-ppo-20261127-020000-ab12"
CONFIG = {"algo": {"kl_coef": 0.05, "epochs": 2}, "model": {"name": "tiny"}, "secret_token": "<redacted>"}
# Five steps of metrics.jsonl's names (two rows at step 2 merge into one W&B step)
ROWS: list[tuple[int, dict[str, float]]] = [
    (0, {"reward/mean": 0.1, "loss/policy": 1.5}),
    (1, {"reward/mean": 0.2, "loss/policy": 1.25}),
    (2, {"reward/mean": 0.3, "loss/policy": 1.0}),
    (2, {"eval_rm_mean": 0.35}),
    (3, {"reward/mean": 0.4, "loss/policy": 0.75}),
    (4, {"reward/mean": 0.5, "loss/policy": 0.5}),
]
API_KEY = "k" * 36 + "CAFE"


@dataclass
class Job:
    dir: Path
    sft: Artifact
    policy: Artifact
    critic: Artifact


def _offline(**kw: Any) -> WandbTracking:
    return WandbTracking(enabled=True, mode="offline", project="nemotron-test", tags=["team-a"], **kw)


def _register(tmp: Path) -> tuple[Artifact, Artifact, Artifact]:
    """A real store: the SFT policy a PPO job read, and the policy and critic it made from it."""
    store = ArtifactStore(tmp / "home")
    store.root.mkdir(parents=True)
    for d, files in {
        "sft": ["model.safetensors", "config.json"],
        "ppo": ["model.safetensors"],
        "critic": ["v.pt"],
    }.items():
        (tmp / d).mkdir()
        for f in files:
            (tmp / d / f).write_bytes(f"{d}/{f}".encode() * 100)
    (sft,) = store.register(
        [("tiny_sft_policy", "policy", tmp / "sft", {})], job_id="sft-20261127-010000-0000"
    )
    policy, critic = store.register(
        [("tiny_ppo_policy", "policy", tmp / "ppo", {}), ("tiny_ppo_critic", "critic", tmp / "critic", {})],
        job_id=JOB_ID,
        parents=[("policy", sft.id)],
    )
    return sft, policy, critic


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    """One whole job, logged once for the module: start, metrics rows, the two outputs with their input, finish."""
    tmp = tmp_path_factory.mktemp("wandb")
    sft, policy, critic = _register(tmp)
    mp = pytest.MonkeyPatch()
    mp.setenv("WANDB_API_KEY", API_KEY)
    # The environment asks wandb to drop system metrics and to sample them fast: the tracker must keep them on,
    # and the test needs a sample within its second.
    mp.setenv("WANDB_X_DISABLE_STATS", "true")
    mp.setenv("WANDB_X_STATS_SAMPLING_INTERVAL", "0.2")
    job_dir = tmp / "job"
    tracker = WandbTracker(_offline(), job_dir)
    tracker.start(RunInfo(job_id=JOB_ID, step="rl/ppo", preset="tiny", job_dir=str(job_dir), config=CONFIG))
    for step, metrics in ROWS:
        tracker.log_metrics(step, metrics)
    time.sleep(0.6)
    tracker.log_artifacts(
        [LoggedArtifact(policy, inputs=[("policy", sft)]), LoggedArtifact(critic, inputs=[("policy", sft)])]
    )
    tracker.finish(ok=True)
    mp.undo()
    yield Job(job_dir, sft, policy, critic)


def test_the_run_is_the_job_with_its_config_tags_and_metrics(job: Job) -> None:
    (path,) = rec.run_files(job.dir)
    (run,) = rec.of_type(path, "run")
    assert (run.run_id, run.project, run.display_name, run.job_type) == (
        JOB_ID,
        "nemotron-test",
        JOB_ID,
        "rl/ppo",
    )
    assert list(run.tags) == ["team-a", "rl/ppo", "tiny"]
    assert rec.config(path) == CONFIG
    assert rec.history(path) == {
        0: {"reward/mean": 0.1, "loss/policy": 1.5},
        1: {"reward/mean": 0.2, "loss/policy": 1.25},
        2: {"reward/mean": 0.3, "loss/policy": 1.0, "eval_rm_mean": 0.35},
        3: {"reward/mean": 0.4, "loss/policy": 0.75},
        4: {"reward/mean": 0.5, "loss/policy": 0.5},
    }
    assert (job.dir / "wandb" / LAST_STEP_FILE).read_text() == "4\n"


def test_system_metrics_are_on_even_when_the_environment_turns_them_off(job: Job) -> None:
    (path,) = rec.run_files(job.dir)
    keys = {i.key for s in rec.of_type(path, "stats") for i in s.item}
    assert {"memory_percent", "proc.memory.rssMB", "proc.cpu.threads"} <= keys, keys


def test_each_output_is_a_reference_artifact_carrying_our_ref_hash_and_inputs(job: Job) -> None:
    (path,) = rec.run_files(job.dir)
    logged = {a.name: a for a in rec.of_type(path, "artifact")}
    assert set(logged) == {"tiny_ppo_policy", "tiny_ppo_critic"}
    for ours in (job.policy, job.critic):
        a = logged[ours.name]
        assert a.type == ours.type
        assert sorted(a.aliases) == ["latest", f"nemotron-v{ours.version}"]
        meta = json.loads(a.metadata)
        assert meta["nemotron.ref"] == ours.ref == f"{ours.name}:v1"
        assert (meta["sha256"], meta["path"], meta["files"]) == (ours.sha256, ours.path, ours.files)
        assert meta["nemotron.inputs"] == {"policy": "tiny_sft_policy:v1"}
        # nothing uploaded: every file of our artifact is a file:// reference into its path, beside the card
        refs = {e.path: e.ref for e in a.manifest.contents}
        card = refs.pop("nemotron-artifact.json")
        assert card == ""
        assert refs == {f["path"]: Path(ours.path, f["path"]).as_uri() for f in ours.files}


def test_an_input_built_again_has_the_digest_its_own_job_logged_and_a_new_content_another(job: Job) -> None:
    """Online, the run uses each input as reference_artifact(parent) and W&B resolves it to the version with the
    same digest: the one the parent's own job logged. So the digest must not depend on what only the output carries
    (its inputs), and must change with our content (sha256) even where the path and file names stay."""
    (path,) = rec.run_files(job.dir)
    logged = {a.name: a.digest for a in rec.of_type(path, "artifact")}
    assert reference_artifact(job.policy, inputs=[]).digest == logged["tiny_ppo_policy"]
    rewritten = job.policy._replace(sha256="0" * 64)
    assert reference_artifact(rewritten, inputs=[]).digest != logged["tiny_ppo_policy"]


def test_offline_the_lineage_is_in_the_metadata_since_wandb_cannot_mark_a_use(job: Job) -> None:
    """wandb 0.31 refuses use_artifact in offline mode (it asks the server for the artifact): no use records, and
    the input is not logged as if this run had made it."""
    (path,) = rec.run_files(job.dir)
    assert rec.of_type(path, "use_artifact") == []
    assert "tiny_sft_policy" not in {a.name for a in rec.of_type(path, "artifact")}


def test_the_api_key_is_never_written(job: Job) -> None:
    written = [p for p in job.dir.rglob("*") if p.is_file() and API_KEY.encode() in p.read_bytes()]
    assert written == []


def test_a_requeued_job_resumes_its_run_and_a_replay_adds_no_point(job: Job, tmp_path: Path) -> None:
    first = rec.run_files(job.dir)
    tracker = WandbTracker(_offline(), job.dir)
    tracker.start(RunInfo(job_id=JOB_ID, step="rl/ppo", preset="tiny", job_dir=str(job.dir), config=CONFIG))
    for step, metrics in [*ROWS, (5, {"reward/mean": 0.6}), (6, {"reward/mean": 0.7})]:
        tracker.log_metrics(step, metrics)
    tracker.log_metrics(5, {"reward/mean": -1.0})  # below the current step: W&B would refuse it; skipped here
    tracker.finish(ok=True)
    (second,) = sorted(set(rec.run_files(job.dir)) - set(first))
    (run,) = rec.of_type(second, "run")
    assert run.run_id == JOB_ID
    assert rec.history(second) == {5: {"reward/mean": 0.6}, 6: {"reward/mean": 0.7}}


def test_run_ids_keep_safe_job_ids_and_make_others_safe_and_distinct() -> None:
    assert run_id(JOB_ID) == JOB_ID
    a, b = run_id("My/Job:1"), run_id("My/Job;1")
    assert a.startswith("my-job-1-") and b.startswith("my-job-1-") and a != b
    assert all(c.isalnum() or c in "-_" for c in a) and a == a.lower()
    assert len(run_id("x" * 200)) <= 64


def test_a_server_that_is_down_fails_start_within_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port that accepts connections and never answers: wandb.init gives up after the init timeout and its error
    reaches the caller (which retries and skips the tracker)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{silent.getsockname()[1]}")
    monkeypatch.setenv("WANDB_API_KEY", API_KEY)
    tracker = WandbTracker(WandbTracking(enabled=True, mode="online"), tmp_path, init_timeout_s=2.0)
    began = time.monotonic()
    with pytest.raises(wandb.Error):
        tracker.start(RunInfo(job_id="down-1", step="rl/ppo", preset=None, job_dir=str(tmp_path), config={}))
    assert time.monotonic() - began < 10
    silent.close()
