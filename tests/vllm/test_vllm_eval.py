"""eval/policy with generation.backend=vllm, on vLLM's CPU build: the same report bitwise twice when sampled (each
request samples from its own seed), and greedy answers that are our torch sampler's."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# the policy and 8 prompts only: no reward model, baseline or judge
ARGS = ("steps", "run", "eval/policy", "-c", "tiny", "scorers.win_rate=false", "scorers.reward_model=false",
        "inputs.baseline=null", "inputs.judge=null", "inputs.reward_model=null", "max_prompts=8",
        "generation.batch_size=4")  # fmt: skip


def _responses(home: Path) -> list[Path]:
    return sorted((home / "jobs").glob("*/outputs/report/responses.jsonl"))


@pytest.mark.slow
def test_eval_on_vllm_is_the_same_bytes_twice_and_greedy_is_our_samplers(
    home: Path, run_cli: Any, tiny_llama: Callable[[str, int, int], Path]
) -> None:
    policy = tiny_llama("eval", 128, 1)
    on_vllm = (
        *ARGS,
        f"inputs.policy={policy}",
        "generation.backend=vllm",
        "generation.vllm_gpu_memory_utilization=0.15",
    )
    for _ in range(2):
        r = run_cli(*on_vllm, timeout=600)
        assert r.code == 0, r.err[-3000:]
        assert "vLLM" in r.err and "engine started from" in r.err, r.err[
            -2000:
        ]  # vLLM answered, not our sampler
    first, second = _responses(home)
    assert first.read_bytes() == second.read_bytes(), "two sampled runs on vLLM wrote different responses"
    sampled = [json.loads(line)["response"] for line in first.read_text().splitlines()]
    assert len(sampled) == 8 and len(set(sampled)) > 1

    for backend in ("vllm", "torch"):
        extra = ("generation.vllm_gpu_memory_utilization=0.15",) if backend == "vllm" else ()
        r = run_cli(*ARGS, f"inputs.policy={policy}", f"generation.backend={backend}", "generation.greedy=true",
                    *extra, timeout=600)  # fmt: skip
        assert r.code == 0, r.err[-3000:]
    *_, greedy_vllm, greedy_torch = _responses(home)
    assert greedy_vllm.read_bytes() == greedy_torch.read_bytes(), (
        "greedy answers differ between vLLM and torch"
    )
    assert [json.loads(line)["response"] for line in greedy_vllm.read_text().splitlines()] != sampled
