"""Tiny rl/rlhf with generation.backend=vllm trains like the torch backend (the margins of tests/steps/test_rl_steps.py):
a tiny Llama (head_dim 32: vLLM's CPU attention refuses GPT-2's 16) is SFT-trained first, then GRPO samples every
rollout with vLLM, whose weights are synced in memory after each optimizer step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


def _job(home: Path, prefix: str) -> Path:
    return max((home / "jobs").glob(f"{prefix}-*"), key=lambda p: p.stat().st_mtime)


@pytest.mark.slow
def test_tiny_rlhf_on_vllm_raises_reward_and_ground_truth(home: Path, run_cli: Any) -> None:
    r = run_cli("steps", "run", "sft", "-c", "tiny", "model.family=llama", "model.n_head=2", timeout=600)
    assert r.code == 0, r.err[-2000:]
    sft = _job(home, "sft") / "outputs" / "policy"
    r = run_cli("steps", "run", "rl/rlhf", "-c", "tiny", f"policy.model_name={sft}", "policy.generation.backend=vllm",
                timeout=900)  # fmt: skip
    assert r.code == 0, r.err[-3000:]
    rows = [json.loads(line) for line in (_job(home, "rl-rlhf") / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in rows if "rewards" in m]
    q = len(steps) // 4
    first = sum(m["rewards"] for m in steps[:q]) / q
    last = sum(m["rewards"] for m in steps[-q:]) / q
    assert last > first + 0.5, f"reward did not rise: first quarter {first:.3f}, last quarter {last:.3f}"
    evals = {k: v for m in rows for k, v in m.items() if k.startswith("eval_")}
    assert evals["eval_rm_after"] > evals["eval_rm_before"] + 0.5
    assert evals["eval_gt_after"] > evals["eval_gt_before"] + 0.05, evals
    # vLLM's logprobs and the trainer's agree at every step: the engine always had the trainer's weights
    errors = [m["token_mult_prob_error"] for m in steps]
    assert len(errors) == len(steps) and max(errors) < 1.001, max(errors)
