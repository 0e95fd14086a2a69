"""The Ray sbatch script for any node count: one head, a worker per other node, one driver on the head, the
NeMo-RL config sized to the allocation; bash accepts it; dry-run and submit render it from the same plan."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from nemotron.catalog import Catalog
from nemotron.compile import compile_job
from nemotron.launch import ray_slurm, submit

PROFILES = "".join(f'[slurm_{n}]\nextends = "slurm_rlhf"\nnodes = {n}\n' for n in (1, 2, 8))


# rl/rlhf's NeMo-Gym judge takes a node of its own beside the policy's: one node runs a reward model judge instead
RM_JUDGE = ["judge.kind=reward_model", "env.should_use_nemo_gym=false",
            "env.nemo_gym.genrm_model.responses_api_models.vllm_model.model=/models/rm"]  # fmt: skip


@pytest.mark.parametrize("nodes", [1, 2, 8])
def test_one_head_workers_and_one_driver(nodes: int, home: Path, tmp_path: Path) -> None:
    (tmp_path / "env.toml").write_text(PROFILES)
    # prompts a step whose 8 responses each split evenly over the policy's ranks (nemotron.engines.nemo_rl.batches):
    # 7 on one node beside the reward model's GPU, 8 or 56 beside the GenRM's node
    overrides = (
        [*RM_JUDGE, "grpo.num_prompts_per_step=28"] if nodes == 1 else ["grpo.num_prompts_per_step=56"]
    )
    job = compile_job(Catalog(), "rl/rlhf", "default", overrides, profile_name=f"slurm_{nodes}", mode="batch")
    _, where, launch, text = submit.plan(job)
    plan = ray_slurm.plan_for(job, where, launch)  # type: ignore[arg-type]
    script = ray_slurm.render_sbatch(plan)

    assert script in text  # --dry-run shows the very script submit sends
    assert f"#SBATCH --nodes={nodes}" in script and "#SBATCH --ntasks-per-node=1" in script
    assert (
        "#SBATCH --gpus-per-node=8" in script and "#SBATCH --cpus-per-task=128" in script
    )  # 8 tasks x 16 CPUs
    assert len(re.findall(r"ray start --head", script)) == 1
    assert (
        len(re.findall(r"ray \"\$@\".* start --address", script)) == 1
        and "for ((i = 1; i < ${#nodes[@]}; i++))" in script
    )
    assert len(re.findall(r"srun --overlap .* bash .*ray_driver\.sh", script)) == 1
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    entry = "examples/run_grpo.py" if nodes == 1 else "examples/nemo_gym/run_grpo_nemo_gym.py"
    assert plan.driver_script.count(f"uv run python {entry}") == 1
    # every node joins the Ray cluster; NeMo-RL's own cluster is the policy's share, less the judge's node
    assert "NEMOTRON_RAY_NODES" in plan.driver_script and f"export NEMOTRON_RAY_NODES={nodes}" in script
    config = yaml.safe_load(dict(launch.files)["nemo_rl_config.yaml"])  # type: ignore[union-attr]
    assert config["cluster"] == {"num_nodes": nodes if nodes == 1 else nodes - 1, "gpus_per_node": 8}


def test_port_blocks_never_overlap_between_the_raylets_of_one_host() -> None:
    def block(job: int, node: int) -> range:
        base = (
            ray_slurm.PORT_BASE
            + (job % ray_slurm.PORT_JOBS) * ray_slurm.PORT_JOB_STRIDE
            + (node % ray_slurm.PORT_NODES) * ray_slurm.PORT_NODE_STRIDE
        )
        return range(base, base + ray_slurm.MAX_WORKER_OFFSET + 1)

    blocks = [block(job, node) for job in range(ray_slurm.PORT_JOBS) for node in range(ray_slurm.PORT_NODES)]
    taken = [port for b in blocks for port in b]
    assert len(taken) == len(set(taken))  # 12 jobs x 8 raylets on one host, no port twice
    assert max(taken) < 32768  # below the kernel's ephemeral range


FAKE_RAY = """#!/bin/bash
echo call >> {calls}
sleep {delay}
echo Active:
echo ' 1 node_head'
for f in {logs}/ray-worker-*; do [ -e "$f" ] && echo " 1 node_$(basename $f)"; done
echo Pending:
"""


def _run_driver(
    tmp_path: Path,
    want: int,
    timeout_s: int,
    delay: float,
    message: str = "Ray runtime started.",
    hint_s: int = 30,
    worker_exits: int | None = None,
) -> tuple[int, str, int, float]:
    """ray_driver.sh run by bash with a `ray` whose status (after `delay` s) counts the head and each worker whose log
    exists as active; one worker's log appears after 1 s. The exit code, the output, how many times it asked Ray,
    and how long it took."""
    import os
    import time

    bin_dir, logs = tmp_path / "bin", tmp_path / "logs"
    bin_dir.mkdir()
    logs.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "ray").write_text(FAKE_RAY.format(calls=calls, delay=delay, logs=logs))
    (bin_dir / "ray").chmod(0o755)
    script = tmp_path / "ray_driver.sh"
    started = f'{logs}/ray-worker-*_"$SLURM_JOB_ID".out'
    exited = f"{logs}/ray-worker-*{ray_slurm.EXITED}"
    script.write_text(
        ray_slurm.driver_script(
            "echo the driver ran", "", timeout_s, started=started, hint_s=hint_s, exited=exited
        )
    )
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "NEMOTRON_RAY_NODES": str(want),
           "SLURM_JOB_ID": "77", "RAY_ADDRESS": "127.0.0.1:6379"}  # fmt: skip
    begun = time.monotonic()
    then = (
        f"; echo '{message}' > {logs}/ray-worker-1_77.out"
        if worker_exits is None  # else its `ray start` fails: a log line, its exit code in its .exit file
        else f"; echo 'The current node timed out during startup.' > {logs}/ray-worker-1_77.out"
        f"; echo {worker_exits} > {logs}/ray-worker-1{ray_slurm.EXITED}"
    )
    worker = subprocess.Popen(["bash", "-c", f"sleep 1{then}"])
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - begun
    worker.wait()
    count = len(calls.read_text().splitlines()) if calls.exists() else 0
    return done.returncode, done.stdout + done.stderr, count, took


def test_the_driver_asks_ray_once_every_worker_said_it_started(tmp_path: Path) -> None:
    """Each `ray status` is a Python process of about 4 CPU-seconds: the driver reads the workers' `ray start`
    logs first (no process started), then asks Ray once, where it used to ask every 2 s from the start (here: at
    0 s, one node; at 2 s, both)."""
    code, out, calls, _ = _run_driver(tmp_path, want=2, timeout_s=30, delay=0)
    assert code == 0 and "Ray cluster ready: 2 node(s)" in out and "the driver ran" in out, out
    assert calls == 1


def test_the_driver_s_bound_is_the_clock_s_however_long_ray_takes_to_answer(tmp_path: Path) -> None:
    """Three nodes wanted, two ever join, each `ray status` takes 4 s: it gives up at its bound (6 s) plus one
    answer, not after `bound / 2` rounds of a call and a 2 s sleep as the counted loop did (3 x 6 s here)."""
    code, out, calls, took = _run_driver(tmp_path, want=3, timeout_s=6, delay=4)
    assert code == 1 and "only 2 of 3 Ray nodes joined within 6 s" in out, out
    assert calls == 1 and took < 15, (took, calls)


def test_a_ray_whose_start_says_it_otherwise_is_still_asked_every_hint_s(tmp_path: Path) -> None:
    """The logs are a hint: a worker whose `ray start` never prints the line the driver looks for (another Ray
    version's wording) delays the first question by `hint_s`, not by the whole 600 s bound."""
    code, out, calls, took = _run_driver(
        tmp_path, want=2, timeout_s=600, delay=0, message="started", hint_s=3
    )
    assert code == 0 and "Ray cluster ready: 2 node(s)" in out, out
    assert calls == 1 and took < 30, (took, calls)


def test_a_worker_whose_ray_start_exits_fails_the_driver_at_once_with_its_log(tmp_path: Path) -> None:
    """Issue 43: a worker's `ray start` failed ("timed out during startup"), its srun exited, and the job sat in
    the queue for 13 minutes. Its exit code file (written by the worker's srun line) ends the wait within a second
    of it, however far the 600 s bound is, with the code and the node's log."""
    code, out, calls, took = _run_driver(tmp_path, want=2, timeout_s=600, delay=0, worker_exits=1)
    assert code == 1 and calls == 0 and took < 10, (code, calls, took, out)
    assert "a Ray worker node left before the cluster was ready: its `ray start` exited with code 1" in out, (
        out
    )
    assert "The current node timed out during startup." in out and "the driver ran" not in out, out


def test_each_worker_line_records_its_ray_start_exit_code(home: Path, tmp_path: Path) -> None:
    """The sbatch line of a worker runs `ray start` through a shell that writes its exit code beside its log, and
    the script clears an earlier attempt's codes before any node starts."""
    (tmp_path / "env.toml").write_text(PROFILES)
    job = compile_job(Catalog(), "rl/rlhf", "default", [], profile_name="slurm_2", mode="batch")
    _, where, launch, _ = submit.plan(job)
    plan = ray_slurm.plan_for(job, where, launch)  # type: ignore[arg-type]
    script = ray_slurm.render_sbatch(plan)
    (line,) = [x for x in script.splitlines() if "--address=" in x]
    logs = plan.cluster.logs
    assert f"""bash -c 'ray "$@"; echo $? > "$0"' {logs}/ray-worker-"$i".exit start --address=""" in line
    assert script.index(f"rm -f {logs}/ray-worker-*.exit") < script.index("ray start --head")
    assert f"gone=$(ls {logs}/ray-worker-*.exit" in plan.driver_script
