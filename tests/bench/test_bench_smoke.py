"""CI runs every benchmark in bench/ at its smallest size and checks that it prints its result table.

Benchmarks are not timed tests: nothing here compares speeds, only that each script runs to the end and
reports what it promises.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"


# A bound on a hang, not a speed check (speed lives in bench/'s ratios): at 45 s, four of these timed out on a 2-core
# runner whose other worker was training beside them.
BENCH_TIMEOUT_S = 180


def run_bench(script: str, *args: str) -> str:
    """Run ``bench/<script> ARGS`` as a user would; its stdout, after checking it exited 0."""
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=BENCH_TIMEOUT_S,
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_generation_bench_prints_both_samplers() -> None:
    out = run_bench("bench_generation.py", "--size", "small")
    for line in ("transformers generate", "nemotron generate", "speed-up", "sequence_logprobs"):
        assert line in out, out


def test_reward_server_bench_prints_its_table() -> None:
    out = run_bench("bench_reward_server.py", "--small")
    assert "dynamic batching gives" in out, out
    assert "batch size 1" in out, out


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_rl_step_bench_prints_its_table_and_writes_equal_work_json(model: str, tmp_path: Path) -> None:
    args = ["--size", "small", "--model", model, "--steps", "2", "--results-dir", str(tmp_path)]
    out = run_bench("bench_rl_step.py", *args)
    assert "algorithm engine" in out, out
    assert ("random Llama 2x64" in out) == (model == "llama"), out
    for algorithm in ("rloo", "grpo"):
        assert f"{algorithm}      nemotron" in out, out

    [written] = tmp_path.glob("rl_step_small_*.json" if model == "gpt2" else "rl_step_llama_small_*.json")
    record = json.loads(written.read_text(encoding="utf-8"))
    assert record["model_family"] == model
    results = {r["algorithm"]: r for r in record["results"]}
    assert set(results) == {"rloo", "grpo"}
    for r in results.values():
        workload = r["workload"]
        assert len(r["ours_steps"]) == 2
        for step in r["ours_steps"]:
            # 64 rows x 16 tokens: no response stops early, so the work is fixed.
            assert step["generated_tokens"] == workload["prompts_per_step"] * workload["group_size"] * 16
            assert step["total"] > 0
        if record["machine"]["trl"] is None:
            assert "not installed" in out
        else:
            # With TRL installed, both sides generated the same tokens from the same prompts at every step.
            assert r["equal_work"] is True
            assert "ours/TRL" in out


@pytest.mark.slow
def test_reward_server_load_test_runs_clean(tmp_path: Path) -> None:
    out_json = tmp_path / "load.json"
    run_bench("load_reward_server.py", "--clients", "8", "--seconds", "3", "--json", str(out_json))
    result = json.loads(out_json.read_text())
    assert result["errors"] == 0 and result["requests"] > 0 and result["server_exit_code"] == 0, result


def test_cli_latency_bench_prints_each_command_against_the_peer() -> None:
    out = run_bench("cli_latency.py", "--runs", "1")
    for line in ("`nemotron --help` | ≤ 2x", "`nemotron steps list` | ≤ 2x", "`nemotron steps list --tree` | ≤ 2x",
                 "`nemotron steps show rl/rlhf` | ≤ 2x",
                 "`nemotron steps run rl/ppo -c default -b slurm_rlhf --dry-run` | ≤ 3x", "no manifest cache",
                 "import typer"):  # fmt: skip
        assert line in out, out
    assert out.count(" ms | ") == 10, out  # seven commands, the two floors and the peer
    assert "(the floor of a dry run)" in out, out


def test_wandb_tracker_costs_bench_prints_both_checksum_modes() -> None:
    out = run_bench("wandb_tracker_costs.py", "--mib", "8")
    lines = [line for line in out.splitlines() if line.startswith("add_reference")]
    assert [line.split()[1] for line in lines] == ["checksum=False", "checksum=True"] * 2, out


def async_rl_with_vllm(venv: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NEMOTRON_VLLM_VENV": str(venv)}
    return subprocess.run([sys.executable, str(BENCH / "async_rl.py"), "--generator", "vllm", "--steps", "3"],
                          capture_output=True, text=True, env=env, timeout=60)  # fmt: skip


def test_the_async_bench_names_the_missing_vllm_venv_in_one_line(tmp_path: Path) -> None:
    done = async_rl_with_vllm(tmp_path / "no-venv")
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"{tmp_path / 'no-venv' / 'bin' / 'python'} is missing" in done.stderr, done.stderr
    assert "bash scripts/bootstrap-vllm.sh" in done.stderr and "NEMOTRON_VLLM_VENV" in done.stderr


def test_the_async_bench_runs_the_vllm_generator_with_that_venvs_python(tmp_path: Path) -> None:
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/sh\necho "fake vllm python: $*" >&2\nexit 3\n')
    python.chmod(0o755)
    done = async_rl_with_vllm(tmp_path / "venv")
    # its first call writes the tiny Llama vLLM samples (vLLM's CPU attention refuses the GPT-2 policy)
    assert done.returncode != 0 and "(exit 3)" in done.stderr, done.stderr
    assert "fake vllm python: -m nemotron.models.tiny --family llama" in done.stderr, done.stderr
