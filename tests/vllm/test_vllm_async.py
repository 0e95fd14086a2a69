"""Asynchronous RL with vLLM's CPU build as the generator (issue 46): the generator process holds the vLLM engine and
takes the trainer's weights through shared memory after every update."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.mark.slow
def test_the_vllm_generator_samples_with_the_trainers_weights_after_every_update(
    home: Path, run_cli: Any, tiny_llama: Callable[[str, int, int], Path]
) -> None:
    llama = tiny_llama("async", 64, 0)
    r = run_cli("steps", "run", "rl/reinforce", "-c", "tiny", f"inputs.policy={llama}", "generation.backend=vllm",
                "trainer.max_steps=3", "eval.num_prompts=0", "reward.source=in_process",
                "reinforce.async_grpo.enabled=true", "reinforce.async_grpo.max_trajectory_age_steps=0",
                "reinforce.use_importance_sampling_correction=true", timeout=900)  # fmt: skip
    assert r.code == 0, r.err[-3000:]
    (job,) = (home / "jobs").glob("rl-reinforce-*")
    steps = [m for m in map(json.loads, (job / "metrics.jsonl").read_text().splitlines()) if "rewards" in m]
    assert [m["max_trajectory_age"] for m in steps] == [0.0, 0.0, 0.0]
    # at age 0 every step's rollouts come from the weights the trainer holds: vLLM's logprobs agree with the
    # trainer's at each step (they would not after the first update had the weights stayed in the trainer)
    errors = [m["token_mult_prob_error"] for m in steps]
    assert max(errors) < 1.001, errors
    assert all(abs(m["sampling_importance_ratio"] - 1) < 1e-3 for m in steps), steps


def test_building_the_vllm_backend_imports_no_vllm() -> None:
    """An asynchronous trainer builds its generation backend only to read what it needs (recomputes_logprobs): vLLM
    is imported where it samples, at the first generate (4 CPU-s, and vLLM takes over torch's thread count)."""
    import subprocess
    import sys

    code = (
        "import sys; from nemotron.rl.generation_backends import get_backend; "
        "b = get_backend('vllm'); assert b.recomputes_logprobs; print('vllm' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
