"""bench/bench_generation_vllm.py runs and reports both samplers (its figures live in docs/benchmarks.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_generation_benchmark_runs_and_compares() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_generation_vllm.py"), "--size", "small"],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line.strip()}
    assert float(lines["torch"][-1]) > 0 and float(lines["vllm"][-1]) > 0
    assert lines["vllm/torch"][-1].endswith("x")
