"""W&B end to end, offline: a real tiny rl/ppo run with `tracking.wandb.mode=offline`, its `.wandb` file read back as
wandb's own Records (wandb_records.py): the run is the job, with its config, metrics.jsonl's names at their steps
(each point once), system metrics, and the policy and critic as artifacts naming the inputs our store's lineage
shows. Then `nemotron jobs sync` of the finished job adds no point twice."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from . import wandb_records as rec
from .tiny_ppo import expected_steps

# one worker under xdist: the session's run (conftest.py) is shared with test_mlflow.py, whose group this is
pytestmark = pytest.mark.xdist_group("mlflow")


@pytest.fixture(scope="module")
def offline_run(tracked_ppo_run: Any) -> Path:
    """The job dir of the tiny rl/ppo run with tracking.wandb.mode=offline (it logged to mlflow as well)."""
    job_dir: Path = tracked_ppo_run.job_dir
    return job_dir


def expected_points(job_dir: Path) -> set[tuple[int, str]]:
    return {(step, name) for name, steps in expected_steps(job_dir).items() for step in steps}


def lineage_inputs(ref: str, env: dict[str, str], run_cli: Any) -> dict[str, str]:
    """input name -> parent ref of `ref`, as `nemotron artifacts lineage --json` shows them."""
    r = run_cli("artifacts", "lineage", ref, "--json", "--depth", "1", env=env)
    assert r.code == 0, r.err
    return {e["input"]: e["parent"] for e in json.loads(r.out)["edges"] if e["child"] == ref}


def test_a_tiny_ppo_run_leaves_an_offline_run_with_our_metrics_and_lineage(
    offline_run: Path, tracked_ppo_run: Any, tracked_home: dict[str, str], run_cli: Any
) -> None:
    # the run's own offline W&B run (conftest.py asserts it was the only one when the run ended)
    path = tracked_ppo_run.wandb_file
    assert path in rec.run_files(offline_run)
    (run,) = rec.of_type(path, "run")
    assert (run.run_id, run.project, run.job_type) == (offline_run.name, "ppo-tracking", "rl/ppo")
    assert [e.exit_code for e in rec.of_type(path, "exit")] == [0]
    config = rec.config(path)
    assert config["trainer"]["max_steps"] == 4 and config["tracking"]["wandb"]["mode"] == "offline"

    # metrics.jsonl's names, every row's step, each point once
    points = rec.points(path)
    assert [p for p, n in Counter(points).items() if n > 1] == []
    want = expected_points(offline_run)
    assert set(points) == want
    assert {"rewards", "critic_loss", "eval_rm_after"} <= {name for _, name in want}
    assert {step for step, _ in want} == {0, 1, 2, 3, 4}

    stats = {i.key for s in rec.of_type(path, "stats") for i in s.item}
    assert {"memory_percent", "cpu"} <= stats, sorted(stats)

    # the policy and critic, each our ref and hash, naming the inputs our store's lineage has for it
    logged = {a.name: a for a in rec.of_type(path, "artifact")}
    assert set(logged) == {"tiny_ppo_policy", "tiny_ppo_critic"}
    for name, kind in (("tiny_ppo_policy", "checkpoint_hf"), ("tiny_ppo_critic", "critic_hf")):
        shown = run_cli("artifacts", "show", f"{name}:v1", "--json", env=tracked_home)
        assert shown.code == 0, shown.err
        ours = json.loads(shown.out)
        meta = json.loads(logged[name].metadata)
        assert logged[name].type == kind == ours["type"]
        assert meta["nemotron.ref"] == f"{name}:v1" and meta["sha256"] == ours["sha256"]
        assert sorted(logged[name].aliases) == ["latest", "nemotron-v1"]
        inputs = lineage_inputs(f"{name}:v1", tracked_home, run_cli)
        assert meta["nemotron.inputs"] == inputs
        assert inputs["policy"] == "external.sft_policy:v1"
        assert inputs["reward_model"] == "external.reward_model:v1"


def test_sync_of_the_finished_job_adds_no_point_twice(
    offline_run: Path, tracked_ppo_run: Any, tracked_home: dict[str, str], run_cli: Any
) -> None:
    live = tracked_ppo_run.wandb_file
    # the live run's file, and a replay test_mlflow.py's `jobs sync` of this job may have added
    before = set(rec.run_files(offline_run))
    r = run_cli("jobs", "sync", offline_run.name, "--to", "wandb", env=tracked_home, timeout=300)
    assert r.code == 0, r.err[-3000:]
    (replay,) = sorted(set(rec.run_files(offline_run)) - before)
    (run,) = rec.of_type(replay, "run")
    assert run.run_id == offline_run.name
    assert [e.exit_code for e in rec.of_type(replay, "exit")] == [0]

    # the two offline runs, synced to W&B one after the other, fill one run with each point once
    points = rec.points(live) + rec.points(replay)
    assert [p for p, n in Counter(points).items() if n > 1] == []
    assert set(points) == expected_points(offline_run)
    # what it says it sent is what the replay's file holds: one row per step it added
    said = re.search(r"synced to wandb \((\d+)(?: of \d+)? metric rows sent", r.out)
    assert said and int(said[1]) == len({step for step, _ in rec.points(replay)}), r.out

    # the replay's outputs have the live run's digests: W&B takes them as the same versions, not new ones
    first = {a.name: a.digest for a in rec.of_type(live, "artifact")}
    assert {a.name: a.digest for a in rec.of_type(replay, "artifact")} == first
