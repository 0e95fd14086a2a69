"""tests/vllm run in vLLM's own environment (`bash scripts/test-vllm.sh` builds .venv-vllm and runs them). In the main
venv, which has no vllm, they are not collected at all; with NEMOTRON_REQUIRE_VLLM=1 (test-vllm.sh, CI) a missing
vllm is an error, never a skip."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tests.vllm.runs_beside import RunsBeside

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("NEMOTRON_REQUIRE_VLLM") == "1":
        raise RuntimeError(
            "NEMOTRON_REQUIRE_VLLM=1 but vllm is not importable: run `bash scripts/bootstrap-vllm.sh`"
        )
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, int, int], Path]:
    """Saves a random tiny Llama (head_dim 32: vLLM's CPU attention refuses 16) with the shipped tokenizer, which
    has no chat template: `tiny_llama(name, positions, seed)` -> its directory."""
    from nemotron.core.paths import shipped_root
    from nemotron.models.checkpoint import load_tokenizer, save_checkpoint
    from nemotron.models.tiny import build_policy

    def save(name: str, positions: int, seed: int) -> Path:
        tokenizer = load_tokenizer(shipped_root() / "tiny" / "sft_policy")
        model = build_policy(len(tokenizer), 2, 64, 2, positions, seed=seed, family="llama",
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)  # fmt: skip
        return save_checkpoint(model, tmp_path_factory.mktemp(name) / "llama", tokenizer)

    return save


@pytest.fixture(scope="session")
def judge_dir(tiny_llama: Callable[[str, int, int], Path]) -> Path:
    """The tiny judge of the judge tests (tests/vllm/test_vllm_judge*.py)."""
    return tiny_llama("judge", 256, 5)


@pytest.fixture(scope="session")
def beside() -> Iterator[Callable[[int], ThreadPoolExecutor]]:
    """`beside(workers)`: a thread pool that runs step processes (`cli_in`) beside the test. These processes compute
    on one core each (vLLM's CPU engine serves on one thread, the tiny presets train on one), so a run in the
    background keeps the machine's second core busy. Pools are joined at the end of the session."""
    pools: list[ThreadPoolExecutor] = []

    def make(workers: int) -> ThreadPoolExecutor:
        pools.append(ThreadPoolExecutor(max_workers=workers, thread_name_prefix="beside"))
        return pools[-1]

    yield make
    for pool in pools:
        pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def runs_beside(
    cli_in: Callable[..., subprocess.CompletedProcess[str]],
    beside: Callable[[int], ThreadPoolExecutor],
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> RunsBeside:
    """The step runs this module starts with itself, one after another on a thread `beside` its tests."""
    return RunsBeside(cli_in, beside(1), tmp_path_factory, request.session.items)
