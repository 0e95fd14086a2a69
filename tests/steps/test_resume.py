"""Checkpoints and exact resume: a run killed after a checkpoint and resumed logs the same metrics as an
uninterrupted run with the same seed; a checkpoint from another config is refused unless forced."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

# in_process rewards: the comparison below is exact to 1e-6, and a server's dynamic batches could group rows
# differently from run to run. The server path is covered by the tiny preset tests.
ARGS = (
    "steps run rl/reinforce -c tiny trainer.max_steps=6 checkpoint.save_interval=3 "
    "reward.source=in_process trainer.num_prompts_per_step=8 eval.num_prompts=0"
).split()
TIMERS = {"time", "generate", "reward", "logprobs", "train", "step_time", "peak_memory_mb"}


def _steps(job_dir: Path) -> dict[int, dict[str, float]]:
    rows = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if k not in TIMERS} for r in rows if "rewards" in r}


def _job(home: Path, before: set[str]) -> Path:
    (new,) = [p for p in (home / "jobs").iterdir() if p.name not in before]
    return new


@pytest.mark.slow
def test_killed_then_resumed_run_matches_an_uninterrupted_one(home: Path, run_cli: Any) -> None:
    r = run_cli(*ARGS, timeout=600)
    assert r.code == 0, r.err[-2000:]
    first = _job(home, set())
    full = _steps(first)
    assert sorted(full) == [1, 2, 3, 4, 5, 6]
    # training checkpoints are Hugging Face checkpoints too
    from transformers import AutoModelForCausalLM

    assert (first / "checkpoints" / "latest").read_text() == "step_000006"
    AutoModelForCausalLM.from_pretrained(
        first / "checkpoints" / "step_000006" / "policy", use_safetensors=True
    )
    assert not list((first / "checkpoints").glob(".*tmp*")), "a temporary checkpoint dir was left behind"

    # Start the same run and kill -9 it once step 4 is logged (the checkpoint of step 3 is on disk).
    seen = {p.name for p in (home / "jobs").iterdir()}
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "nemotron", *ARGS],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    killed = None
    while time.monotonic() < deadline and proc.poll() is None:
        new = [p for p in (home / "jobs").iterdir() if p.name not in seen]
        if new and (new[0] / "metrics.jsonl").is_file() and 4 in _steps(new[0]):
            os.killpg(proc.pid, signal.SIGKILL)
            killed = new[0]
            break
        time.sleep(0.05)
    proc.wait()
    assert killed is not None, "the run finished before it could be killed"
    assert (killed / "checkpoints" / "latest").read_text() == "step_000003"
    assert (
        not (killed / "outputs" / "policy").exists()
        or json.loads(run_cli("jobs", "show", killed.name, "--json").out)["produced"] == []
    )

    seen = {p.name for p in (home / "jobs").iterdir()}
    r = run_cli(*ARGS, f"checkpoint.resume_from={killed.name}", timeout=600)
    assert r.code == 0, r.err[-2000:]
    resumed = _steps(_job(home, seen))
    assert sorted(resumed) == [4, 5, 6]
    stitched = {**{s: m for s, m in _steps(killed).items() if s <= 3}, **resumed}
    for step in range(1, 7):
        for key, value in full[step].items():
            assert stitched[step][key] == pytest.approx(value, rel=1e-5, abs=1e-6), f"step {step} {key}"


@pytest.mark.slow
def test_resume_refuses_a_checkpoint_of_another_config(home: Path, run_cli: Any) -> None:
    r = run_cli(
        *ARGS[:-4],
        "trainer.max_steps=3",
        "checkpoint.save_interval=3",
        "reward.source=in_process",
        "trainer.num_prompts_per_step=4",
        "eval.num_prompts=0",
        timeout=600,
    )
    assert r.code == 0, r.err[-2000:]
    (first,) = (home / "jobs").iterdir()
    base = [
        *"steps run rl/reinforce -c tiny reward.source=in_process trainer.num_prompts_per_step=4".split(),
        *["eval.num_prompts=0", "trainer.max_steps=4", f"checkpoint.resume_from={first.name}"],
    ]
    r = run_cli(*base, "optim.lr=0.1", timeout=600)
    assert r.code == 2, r.err[-2000:]
    assert "refusing to resume" in r.err and "Traceback" not in r.err
    assert len(list((home / "jobs").iterdir())) == 1  # refused before a job was written
    r = run_cli(*base, "optim.lr=0.1", "checkpoint.force=true", timeout=600)
    assert r.code == 0, r.err[-2000:]


@pytest.mark.slow
def test_sft_killed_then_run_again_resumes_and_ends_on_the_uninterrupted_bytes(
    home: Path, run_cli: Any
) -> None:
    """sft checkpoints like the RL steps: kill -9 in step 3 after the step-2 checkpoint, the same command again
    continues from it (checkpoint.resume=auto), and its batches pick up where they were."""
    args = "steps run sft -c tiny trainer.max_steps=4 checkpoint.save_interval=2".split()
    r = run_cli(*args, timeout=600)
    assert r.code == 0, r.err[-2000:]
    (whole,) = (home / "jobs").iterdir()
    r = run_cli(*args, env={**os.environ, "NEMOTRON_FAULT": "optimizer@3"}, timeout=600)
    assert r.code != 0, "the fault did not fire"
    seen = {p.name for p in (home / "jobs").iterdir()}
    r = run_cli(*args, timeout=600)
    assert r.code == 0 and "resuming" in r.err, r.err[-2000:]
    again = _job(home, seen)
    assert [json.loads(x)["step"] for x in (again / "metrics.jsonl").read_text().splitlines()] == [3, 4]
    weights = [(job / "outputs" / "policy" / "model.safetensors").read_bytes() for job in (whole, again)]
    assert weights[0] == weights[1]
