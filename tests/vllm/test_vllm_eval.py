"""eval/policy with generation.backend=vllm, on vLLM's CPU build: the same report bitwise twice when sampled (each
request samples from its own seed), and greedy answers that are our torch sampler's."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

# the policy and 8 prompts only: no reward model, baseline or judge
ARGS = ("steps", "run", "eval/policy", "-c", "tiny", "scorers.win_rate=false", "scorers.reward_model=false",
        "inputs.baseline=null", "inputs.judge=null", "inputs.reward_model=null", "max_prompts=8",
        "generation.batch_size=4")  # fmt: skip


@pytest.mark.slow
def test_eval_on_vllm_is_the_same_bytes_twice_and_greedy_is_our_samplers(
    tmp_path: Path,
    cli_in: Callable[..., subprocess.CompletedProcess[str]],
    beside: Callable[[int], ThreadPoolExecutor],
    tiny_llama: Callable[[str, int, int], Path],
) -> None:
    """Four independent runs, two at a time (each computes on one core), each in a home of its own."""
    policy = tiny_llama("eval", 128, 1)
    on_vllm = (
        f"inputs.policy={policy}",
        "generation.backend=vllm",
        "generation.vllm_gpu_memory_utilization=0.15",
    )
    runs = {
        "sampled-1": (*ARGS, *on_vllm),
        "sampled-2": (*ARGS, *on_vllm),
        "greedy-vllm": (*ARGS, *on_vllm, "generation.greedy=true"),
        "greedy-torch": (
            *ARGS,
            f"inputs.policy={policy}",
            "generation.backend=torch",
            "generation.greedy=true",
        ),
    }
    pool = beside(2)
    started = {name: pool.submit(cli_in, tmp_path / name, *args, timeout=600) for name, args in runs.items()}
    done = {name: run.result() for name, run in started.items()}
    responses: dict[str, Path] = {}
    for name, r in done.items():
        assert r.returncode == 0, (name, r.stderr[-3000:])
        (responses[name],) = (tmp_path / name / "home" / "jobs").glob("*/outputs/report/responses.jsonl")
        if name != "greedy-torch":  # vLLM answered, not our sampler
            assert "vLLM" in r.stderr and "engine started from" in r.stderr, (name, r.stderr[-2000:])
    first, second = responses["sampled-1"], responses["sampled-2"]
    assert first.read_bytes() == second.read_bytes(), "two sampled runs on vLLM wrote different responses"
    sampled = [json.loads(line)["response"] for line in first.read_text().splitlines()]
    assert len(sampled) == 8 and len(set(sampled)) > 1

    greedy_vllm, greedy_torch = responses["greedy-vllm"], responses["greedy-torch"]
    assert greedy_vllm.read_bytes() == greedy_torch.read_bytes(), (
        "greedy answers differ between vLLM and torch"
    )
    assert [json.loads(line)["response"] for line in greedy_vllm.read_text().splitlines()] != sampled
