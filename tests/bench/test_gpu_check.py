"""scripts/gpu-check.sh cannot run without a GPU; here: it parses, it refuses a CPU machine in one clear line
(exit 2, nothing written), and its pieces that run on any machine do: the CUDA copy of the tiny pipeline loads
and reaches every trainer step, and bench/memory_plan.py's --device reaches the run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-check.sh"
sys.path.insert(0, str(REPO / "scripts"))

from cuda_pipeline import CUDA, cuda_pipeline  # noqa: E402

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")


def test_the_script_parses() -> None:
    done = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_header_lists_every_check_the_script_runs() -> None:
    text = SCRIPT.read_text()
    listed = [int(n) for n in re.findall(r"^#   (\d+)\. ", text, re.M)]
    run: list[int] = []
    for first, last in re.findall(r'^echo "== (\d+)(?:-(\d+))?\. ', text, re.M):
        run += range(int(first), int(last or first) + 1)
    assert listed == run == list(range(1, len(run) + 1)), (listed, run)


@no_gpu
def test_it_refuses_a_machine_without_cuda(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out)}
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("gpu-check: no CUDA device") and len(done.stderr.splitlines()) == 1
    assert list(out.iterdir()) == []


def test_the_cuda_pipeline_trains_every_step_on_cuda(tmp_path: Path) -> None:
    from nemotron.catalog import Catalog
    from nemotron.launch.pipeline import load_pipeline

    dst = tmp_path / "tiny-cuda.toml"
    cuda_pipeline(REPO / "manifests" / "pipelines" / "tiny.toml", dst)
    pipe = load_pipeline(str(dst), Catalog())
    original = load_pipeline("tiny", Catalog())
    assert [(s.id, s.step, s.inputs) for s in pipe.steps] == [
        (s.id, s.step, s.inputs) for s in original.steps
    ]
    assert (
        pipe.pipeline.report == original.pipeline.report
        and pipe.pipeline.compare == original.pipeline.compare
    )
    for step, before in zip(pipe.steps, original.steps, strict=True):
        # each step's own overrides (the eval stages' judge and prompts), then CUDA's
        assert step.overrides == [*before.overrides, *([] if step.step.startswith("data/") else CUDA)], step


@no_gpu
def test_the_memory_bench_trains_on_the_device_it_is_given(tmp_path: Path) -> None:
    args = ["--families", "llama", "--sizes", "tiny", "--precisions", "fp32", "--checkpointing", "off"]
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "memory_plan.py"), *args, "--device", "cuda", "--json", str(tmp_path / "x.json")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode != 0 and "runtime.device=cuda" in done.stdout + done.stderr
    assert "no CUDA device" in done.stdout + done.stderr
