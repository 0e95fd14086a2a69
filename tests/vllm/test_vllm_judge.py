"""The generative judge served by `vllm serve` (judge.server=vllm): our judge client scores a batch through it
unchanged, constrained to valid verdicts by vLLM's structured outputs; it survives a server restart; and a tiny
rl/rlhf trains against it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.vllm.runs_beside import Run, RunsBeside

from nemotron.core.procs import free_port
from nemotron.reward.judge import JudgeClient
from nemotron.reward.vllm_serve import own_vllm_server

PROMPTS = ["the movie was", "the food was", "the plot was"]
RESPONSES = ["great fun", "awful", "fine I guess"]
RLHF = "test_tiny_rlhf_with_the_judge_on_vllm_serve"


@pytest.fixture(scope="module", autouse=True)
def rlhf_run(judge_dir: Path, runs_beside: RunsBeside) -> tuple[Path, Run] | None:
    """The rl/rlhf run of test_tiny_rlhf_with_the_judge_on_vllm_serve (its root and result), started with the module,
    so it trains (and its step starts its own `vllm serve`) beside the client test's two servers; its test reads the
    result. Not started when that test is not selected."""
    if not runs_beside.selected(RLHF):
        return None
    return runs_beside.start("rlhf", "steps", "run", "rl/rlhf", "-c", "tiny", "judge.kind=generative",
                             "judge.server=vllm", "judge.guided_choice=true",
                             f"env.nemo_gym.genrm_model.responses_api_models.vllm_model.model={judge_dir}",
                             "grpo.max_num_steps=2", "grpo.num_prompts_per_step=2", "eval.num_prompts=0",
                             timeout=900)  # fmt: skip


def test_the_judge_client_scores_through_vllm_serve_and_survives_a_restart(
    judge_dir: Path, tmp_path: Path
) -> None:
    port, token = free_port(), "a-test-token"
    log = tmp_path / "judge.log"
    with own_vllm_server(judge_dir, port=port, token=token, memory=0.15, log_path=log) as (url, _):
        client = JudgeClient(url, token=token, guided_choice=True, parse_retries=0, timeout=60)
        first = client.score_many(PROMPTS, RESPONSES)
        assert all(0 <= s <= 10 for s in first)
        assert client.metrics()["judge/parse_failures"] == 0  # structured outputs: every answer is a verdict
        # a wrong token is refused by vLLM (VLLM_API_KEY), so the token really guards it
        with pytest.raises(Exception, match="401"):
            JudgeClient(url, token="wrong", http_retries=0).score_many(PROMPTS[:1], RESPONSES[:1])
    with own_vllm_server(judge_dir, port=port, token=token, memory=0.15, log_path=log):
        again = client.score_many(
            PROMPTS, RESPONSES
        )  # the same client, a new server process on the same port
    assert again == first  # greedy verdicts from the same weights
    assert client.metrics()["judge/requests"] >= 6


@pytest.mark.slow
def test_tiny_rlhf_with_the_judge_on_vllm_serve(rlhf_run: tuple[Path, Run] | None) -> None:
    assert rlhf_run is not None
    root, run = rlhf_run
    r = run.result()
    assert r.returncode == 0, r.stderr[-3000:]
    (job,) = (root / "home" / "jobs").glob("rl-rlhf-*")
    rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in rows if "rewards" in m]
    assert len(steps) == 2 and all(m["judge/fallbacks"] == 0 and m["judge/requests"] > 0 for m in steps)
    assert "vllm serve" in (job / "logs" / "step.log").read_text() or (job / "logs" / "judge.log").is_file()
