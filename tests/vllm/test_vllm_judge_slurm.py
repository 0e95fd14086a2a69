"""`judge.server: vllm` on Slurm: `vllm serve` runs the judge as group 0 of a heterogeneous job on its own node, the
step in group 1 waits for its ready file and scores through it, on the real local cluster (scripts/slurm-up.sh).

Submitted as a user would: from the main venv (nemo-run, which vLLM's pins exclude), with a profile whose `python` is
the vLLM venv's interpreter on the compute nodes (docs/vllm.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"}


REPO = Path(__file__).resolve().parents[2]
# the main venv (it holds nemo-run): scripts/test-vllm.sh names it; else the one scripts/bootstrap.sh builds
MAIN_PYTHON = Path(
    os.environ.get("NEMOTRON_MAIN_PYTHON")
    or REPO / os.environ.get("NEMOTRON_VENV", ".venv") / "bin" / "python"
)
PROFILE = """
[vllm_slurm]
extends = "local_slurm"
python = "{python}"
cpus_per_task = 2
"""


def nemotron(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The CLI of the main venv, which holds nemo-run."""
    assert MAIN_PYTHON.is_file(), (
        f"{MAIN_PYTHON} missing: run scripts/bootstrap.sh (or set NEMOTRON_MAIN_PYTHON)"
    )
    return subprocess.run(
        [str(MAIN_PYTHON), "-m", "nemotron", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def finished(slurm_id: str, timeout_s: float) -> dict[str, tuple[str, str]]:
    """Each het component's (state, node) once all are final: {"<id>+0": ..., "<id>+1": ...}."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = subprocess.run(["sacct", "-n", "-P", "-X", "-j", slurm_id, "-o", "JobID,State,NodeList"],
                             capture_output=True, text=True).stdout  # fmt: skip
        rows = {
            r[0]: (r[1].split()[0], r[2])
            for r in (line.split("|") for line in out.splitlines() if line.strip())
        }
        if len(rows) == 2 and all(state in FINAL for state, _ in rows.values()):
            return rows
        time.sleep(1)
    raise AssertionError(f"slurm job {slurm_id} not finished after {timeout_s} s")


def test_the_vllm_judge_is_its_own_hetjob_group_and_the_step_scores_through_it(
    judge_dir: Path, home: Path, tmp_path: Path, slurm_cluster: object
) -> None:
    (tmp_path / "env.toml").write_text(
        PROFILE.format(python=sys.executable)
    )  # this venv's python runs both groups
    env = {**os.environ, "COLUMNS": "200", "NEMOTRON_ENV_FILE": str(tmp_path / "env.toml")}
    key = "env.nemo_gym.genrm_model.responses_api_models.vllm_model.model"
    done = nemotron(env, "steps", "run", "rl/rlhf", "-c", "tiny", "-b", "vllm_slurm", "judge.kind=generative",
                    "judge.server=vllm", "judge.guided_choice=true", f"{key}={judge_dir}", "grpo.max_num_steps=2",
                    "grpo.num_prompts_per_step=2", "eval.num_prompts=0")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    job_id = done.stdout.strip().splitlines()[-1]
    job = home / "jobs" / job_id
    slurm_id = str(json.loads((job / "status.json").read_text())["remote_id"])
    groups = finished(slurm_id, timeout_s=900)
    logs = nemotron(env, "jobs", "logs", job_id).stdout
    assert groups[f"{slurm_id}+1"][0] == "COMPLETED", logs[-4000:]
    # two groups on two nodes: vllm serve on one, the trainer on the other
    assert {groups[f"{slurm_id}+0"][1], groups[f"{slurm_id}+1"][1]} == {"node1", "node2"}
    ready = json.loads((job / "logs" / "reward_server.json").read_text())
    assert ready["server"] == "vllm" and groups[f"{slurm_id}+0"][1] in ready["url"]
    # the step scored every rollout through it: no fallback scores, no local judge of its own
    rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in rows if "rewards" in m]
    assert len(steps) == 2 and all(m["judge/fallbacks"] == 0 and m["judge/requests"] > 0 for m in steps)
    assert not (job / "logs" / "judge.log").exists()
    assert json.loads(nemotron(env, "jobs", "status", job_id, "--json").stdout)["state"] == "succeeded"
