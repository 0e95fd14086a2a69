"""backend=nemo_rl for real on the local 2-node Slurm: nemotron brings up Ray across both nodes through NeMo-Run's
Slurm Ray API, runs the compiled driver once on the head, converts and registers the outputs with lineage.

NeMo-RL itself cannot run here (GPUs, its container), so `nemo_rl_dir` points at tests/fixtures/fake_nemo_rl: the
same entry scripts and converters at the same paths, which check the config they get, join the Ray cluster, run a
task on every node, and leave a checkpoint where NeMo-RL would. Everything else is the real launch path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.slurm.jobs import FAKE_NEMO_RL_PATH, fake_nemo_rl_profile, nemotron, wait_for

# our tiny presets score with a task NeMo-RL does not have, and put the KL per token: the engine refuses both
NEMO_RL_TINY = ["backend=nemo_rl", "eval.task=null"]
FINAL = ("succeeded", "failed", "cancelled")
# a `ray` whose `ray start --address` fails at once, as a worker node timing out during start-up does
WORKER_FAILS = Path(__file__).resolve().parents[1] / "fixtures" / "ray_worker_fails"
TINY = Path(__file__).resolve().parents[2] / "src" / "nemotron" / "shipped" / "tiny"

pytestmark = pytest.mark.slurm


@pytest.fixture
def env(home: Path, tmp_path: Path) -> dict[str, str]:
    (tmp_path / "env.toml").write_text(
        fake_nemo_rl_profile("ray2")
        + fake_nemo_rl_profile("ray2_slow", "ray2", FAKE_NEMO_RL_SLEEP_S="300")
        + fake_nemo_rl_profile("ray2_crash", "ray2", FAKE_NEMO_RL_EXIT="1")
        + fake_nemo_rl_profile(
            "ray2_no_worker",
            "ray2",
            PATH=f"{WORKER_FAILS}:{FAKE_NEMO_RL_PATH}",
            NEMOTRON_TEST_REAL_RAY=str(Path(sys.executable).parent / "ray"),
        )
    )
    return {**os.environ, "COLUMNS": "200", "NEMOTRON_ENV_FILE": str(tmp_path / "env.toml")}


def status(home: Path, job_id: str) -> dict[str, Any]:
    return dict(json.loads((home / "jobs" / job_id / "status.json").read_text()))


def sacct(slurm_id: str) -> str:
    out = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-j", slurm_id, "-o", "State"], capture_output=True, text=True
    ).stdout
    return out.split("\n")[0].split(" ")[0]


def raylets_of(slurm_id: str) -> list[str]:
    """Processes still using this job's Ray temp dirs (/tmp/ray-<slurm id>-<node>)."""
    out = subprocess.run(["pgrep", "-af", f"/tmp/ray-{slurm_id}-"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def test_reinforce_runs_once_on_a_two_node_ray_cluster_and_registers_its_policy(
    env: dict[str, str], home: Path
) -> None:
    started = time.monotonic()
    done = nemotron(
        env,
        "steps",
        "run",
        "rl/reinforce",
        "-c",
        "tiny",
        *NEMO_RL_TINY,
        "reinforce.kl_in=reward_sequence_mean",
        "-r",
        "ray2",
    )
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-4000:]
    assert "fake NeMo-RL grpo: 2 alive Ray nodes (cluster.num_nodes=2)" in done.stderr
    assert done.stderr.count("fake NeMo-RL grpo:") == 1  # the driver ran once, on the head
    seen = done.stderr.split("ran one task on each node: ")[1].splitlines()[0]
    assert ":node1:" in seen and ":node2:" in seen
    (job_dir,) = (home / "jobs").iterdir()
    st = status(home, job_dir.name)
    assert (
        st["state"] == "succeeded"
        and st["exit_code"] == 0
        and st["registered"] == ["tiny_reinforce_policy:v1"]
    )
    assert sacct(str(st["remote_id"])) == "COMPLETED" and raylets_of(str(st["remote_id"])) == []
    lineage = nemotron(env, "artifacts", "lineage", "tiny_reinforce_policy:v1")
    assert lineage.returncode == 0 and "sft_policy" in lineage.stdout and "prompts" in lineage.stdout, (
        lineage.stdout
    )
    print(f"submit to succeeded and registered: {took:.1f} s")


def test_ppo_in_batch_registers_policy_and_critic_and_its_logs_show(env: dict[str, str], home: Path) -> None:
    done = nemotron(env, "steps", "run", "rl/ppo", "-c", "tiny", *NEMO_RL_TINY, "-b", "ray2")
    assert done.returncode == 0, done.stderr[-4000:]
    job_id = done.stdout.strip().splitlines()[-1]
    wait_for(
        lambda: json.loads(nemotron(env, "jobs", "status", job_id, "--json").stdout)["state"] in FINAL,
        180,
        "the end",
    )
    assert status(home, job_id)["state"] == "succeeded", status(home, job_id)
    assert sorted(status(home, job_id)["registered"]) == ["tiny_ppo_critic:v1", "tiny_ppo_policy:v1"]
    logs = nemotron(env, "jobs", "logs", job_id)
    assert (
        "fake NeMo-RL ppo: 2 alive Ray nodes" in logs.stdout
        and ":node1:" in logs.stdout
        and ":node2:" in logs.stdout
        and "converted " in logs.stdout
    )


def test_sft_then_rm_train_run_on_two_ray_nodes_and_register_with_lineage(
    env: dict[str, str], home: Path
) -> None:
    """run_sft.py, then run_rm.py from the SFT policy it registered: each driver runs once across both nodes, reads
    its data in the columns NeMo-RL's loaders index (the reward model's pairs split into the job dir first), and
    the converted outputs are registered, the reward model as reward_model_hf (its config renamed from the causal
    LM's it was converted with)."""
    started = time.monotonic()
    sft = nemotron(env, "steps", "run", "sft", "-c", "tiny", "backend=nemo_rl",
                   "inputs.init_from=pkg://tiny/sft_policy", "trainer.max_steps=3", "-r", "ray2")  # fmt: skip
    assert sft.returncode == 0, sft.stderr[-4000:]
    assert sft.stderr.count("fake NeMo-RL sft: 2 alive Ray nodes (cluster.num_nodes=2)") == 1
    assert (
        "nemo_rl_messages_train.jsonl has 1900 rows with ['messages']" in sft.stderr
    )  # 2000, every 20th held out
    rm = nemotron(env, "steps", "run", "rm/train", "-c", "tiny", "backend=nemo_rl",
                  "inputs.init_from=tiny_sft_policy:v1", "trainer.max_steps=3", "-r", "ray2")  # fmt: skip
    took = time.monotonic() - started
    assert rm.returncode == 0, rm.stderr[-4000:]
    seen = rm.stderr.split("ran one task on each node: ")[1].splitlines()[0]
    assert ":node1:" in seen and ":node2:" in seen
    # the tiny file's pairs, every 10th held out (trainer.validation_fraction 0.1)
    pairs = sum(1 for line in (TINY / "preferences.jsonl").read_text().splitlines() if line.strip())
    assert f"nemo_rl_pairs_validation.jsonl has {pairs // 10} rows" in rm.stderr
    assert f"nemo_rl_pairs_train.jsonl has {pairs - pairs // 10} rows" in rm.stderr
    jobs = {d.name.rsplit("-", 3)[0]: d for d in (home / "jobs").iterdir()}  # <step>-<date>-<time>-<hex>
    assert status(home, jobs["sft"].name)["registered"] == ["tiny_sft_policy:v1"]
    assert status(home, jobs["rm-train"].name)["registered"] == ["tiny_reward_model:v1"]
    config = json.loads((jobs["rm-train"] / "outputs" / "reward_model" / "config.json").read_text())
    assert config["architectures"] == ["GPT2ForSequenceClassification"]
    lineage = nemotron(env, "artifacts", "lineage", "tiny_reward_model:v1")
    assert lineage.returncode == 0 and "tiny_sft_policy:v1" in lineage.stdout, lineage.stdout
    print(f"sft and rm/train, submit to registered: {took:.1f} s")


def test_dpo_runs_once_across_two_ray_nodes_and_registers_its_policy_with_lineage(
    env: dict[str, str], home: Path
) -> None:
    """rl/dpo's tiny preset on NeMo-RL (run_dpo.py): the pairs split into the job dir as BinaryPreferenceDataset's
    rows, the driver once on the head with a task on each node, checked as dpo.py's setup checks its config, the
    converted policy registered as checkpoint_hf with lineage to the SFT policy and the pairs."""
    started = time.monotonic()
    dpo = nemotron(env, "steps", "run", "rl/dpo", "-c", "tiny", "backend=nemo_rl", "dpo.max_num_steps=3",
                   "-r", "ray2")  # fmt: skip
    took = time.monotonic() - started
    assert dpo.returncode == 0, dpo.stderr[-4000:]
    assert dpo.stderr.count("fake NeMo-RL dpo: 2 alive Ray nodes (cluster.num_nodes=2)") == 1
    assert "fake NeMo-RL dpo: beta=0.1" in dpo.stderr  # the tiny preset's dpo.reference_policy_kl_penalty
    seen = dpo.stderr.split("ran one task on each node: ")[1].splitlines()[0]
    assert ":node1:" in seen and ":node2:" in seen
    pairs = sum(1 for line in (TINY / "preferences.jsonl").read_text().splitlines() if line.strip())
    held = pairs // 20  # trainer.validation_fraction unset: 0.05, every 20th pair
    assert f"nemo_rl_pairs_validation.jsonl has {held} rows" in dpo.stderr
    assert f"nemo_rl_pairs_train.jsonl has {pairs - held} rows" in dpo.stderr
    (job_dir,) = (home / "jobs").iterdir()
    st = status(home, job_dir.name)
    assert st["state"] == "succeeded" and st["registered"] == ["tiny_dpo_policy:v1"], st
    assert (job_dir / "outputs" / "policy" / "config.json").is_file()  # the converter's HF checkpoint
    lineage = nemotron(env, "artifacts", "lineage", "tiny_dpo_policy:v1")
    assert lineage.returncode == 0 and "sft_policy" in lineage.stdout and "preferences" in lineage.stdout, (
        lineage.stdout
    )
    print(f"rl/dpo, submit to registered: {took:.1f} s")


def test_cancel_stops_the_ray_cluster_and_registers_nothing(
    env: dict[str, str], home: Path, slurm_cluster: Any
) -> None:
    done = nemotron(env, "steps", "run", "rl/rlhf", "-c", "tiny", *NEMO_RL_TINY, "-b", "ray2_slow")
    assert done.returncode == 0, done.stderr[-4000:]
    job_id = done.stdout.strip().splitlines()[-1]
    slurm_cluster.wait_running(str(status(home, job_id)["remote_id"]))  # the bounds start once it has nodes
    log = lambda: "".join(p.read_text() for p in Path(status(home, job_id)["remote_dir"]).glob("log-*.out"))  # noqa: E731
    wait_for(
        lambda: Path(status(home, job_id)["remote_dir"]).is_dir() and "alive Ray nodes" in log(),
        120,
        "the driver",
    )

    cancelled = nemotron(env, "jobs", "cancel", job_id)

    assert cancelled.returncode == 0, cancelled.stderr
    st = status(home, job_id)
    assert st["state"] == "cancelled" and "registered" not in st
    slurm_id = str(st["remote_id"])
    wait_for(lambda: sacct(slurm_id).startswith("CANCELLED"), 60, "Slurm to record the cancel")
    wait_for(lambda: raylets_of(slurm_id) == [], 60, "the raylets to stop")


def test_a_crashed_driver_fails_the_job_with_its_exit_code_and_registers_nothing(
    env: dict[str, str], home: Path
) -> None:
    done = nemotron(env, "steps", "run", "rl/rlhf", "-c", "tiny", *NEMO_RL_TINY, "-r", "ray2_crash")
    assert done.returncode == 1, done.stderr[-4000:]
    assert "fake NeMo-RL: failing on purpose" in done.stderr
    (job_dir,) = (home / "jobs").iterdir()
    st = status(home, job_dir.name)
    assert st["state"] == "failed" and st["exit_code"] == 1 and "registered" not in st
    assert nemotron(env, "artifacts", "ls", "--json").stdout.count("tiny_rlhf_policy") == 0


def test_a_worker_whose_ray_start_exits_fails_the_job_at_once_with_its_log(
    env: dict[str, str], home: Path
) -> None:
    """Issue 43: a worker's `ray start` failed during start-up and the job held its allocation 13+ minutes (the
    driver waited out its 600 s bound). Its exit code, written beside its log, ends the driver's wait at once."""
    started = time.monotonic()
    done = nemotron(env, "steps", "run", "rl/rlhf", "-c", "tiny", *NEMO_RL_TINY, "-r", "ray2_no_worker")
    took = time.monotonic() - started
    assert done.returncode == 1, done.stderr[-4000:]
    said = done.stdout + done.stderr
    assert (
        "a Ray worker node left before the cluster was ready: its `ray start` exited with code 1" in said
    ), said[-4000:]
    assert "The current node timed out during startup." in said  # the end of the node's own log
    assert took < 60, took  # submit, the head's start, the worker's failure: not the 600 s bound
    (job_dir,) = (home / "jobs").iterdir()
    st = status(home, job_dir.name)
    assert st["state"] == "failed" and "registered" not in st
    slurm_id = str(st["remote_id"])
    wait_for(lambda: sacct(slurm_id).startswith("FAILED"), 60, "Slurm to end the allocation")
    wait_for(lambda: raylets_of(slurm_id) == [], 60, "the raylets to stop")
    assert nemotron(env, "artifacts", "ls", "--json").stdout.count("tiny_rlhf_policy") == 0


def test_eval_policy_runs_nemo_rls_eval_entry_and_registers_an_eval_report(
    env: dict[str, str], home: Path, tmp_path: Path
) -> None:
    """NeMo-RL's eval samples (the fake answers right on even rows) become our eval_report: per-prompt math_correct
    with the prompts' own line numbers, our bootstrap interval, lineage to the policy and the prompts."""
    prompts = tmp_path / "math prompts.jsonl"
    answers = ["\\frac{1}{2}", "4", "x+1", "7", "9"]
    lines = [json.dumps({"prompt": f"question {i}", "answer": a}) for i, a in enumerate(answers)]
    prompts.write_text(lines[0] + "\n\n" + "\n".join(lines[1:]) + "\n")  # a blank line: line numbers skip it
    done = nemotron(
        env,
        "steps",
        "run",
        "eval/policy",
        "-c",
        "nemo_rl",
        "inputs.policy=pkg://tiny/sft_policy",
        f"inputs.prompts={prompts}",
        "max_prompts=4",
        "-r",
        "ray2",
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "fake NeMo-RL eval: 2 alive Ray nodes (cluster.num_nodes=2)" in done.stderr
    assert "fake NeMo-RL eval: score=0.5000 (2.0/4)" in done.stderr
    (job_dir,) = (home / "jobs").iterdir()
    st = status(home, job_dir.name)
    assert st["state"] == "succeeded" and st["registered"] == ["eval_report:v1"], st
    shown = json.loads(nemotron(env, "artifacts", "show", "eval_report:v1", "--json").stdout)
    report = Path(shown["path"])
    rows = [json.loads(line) for line in (report / "responses.jsonl").read_text().splitlines()]
    assert [(r["line"], r["prompt"], r["answer"], r["math_correct"]) for r in rows] == [
        (1, "question 0", "\\frac{1}{2}", 1.0),
        (3, "question 1", "4", 0.0),
        (4, "question 2", "x+1", 1.0),
        (5, "question 3", "7", 0.0),
    ]
    summary = json.loads((report / "summary.json").read_text())
    m = summary["metrics"]["math_correct"]
    assert summary["format"] == 1 and summary["backend"] == "nemo_rl" and summary["num_prompts"] == 4
    assert m["mean"] == 0.5 == summary["nemo_rl"]["pass@1"] and 0.0 <= m["low"] < 0.5 < m["high"] <= 1.0
    assert (report / "evaluation_data.json").is_file()  # NeMo-RL's own samples stay beside ours
    lineage = nemotron(env, "artifacts", "lineage", "eval_report:v1")
    assert "sft_policy" in lineage.stdout and "math prompts" in lineage.stdout, lineage.stdout
