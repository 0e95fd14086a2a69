"""bench/profile_rl_step.py at its smallest size: it profiles both engines and prints every kind of time and the
matmul bound (not a speed check)."""

from __future__ import annotations

import importlib.util

import pytest
from tests.bench.test_bench_smoke import run_bench


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="the profile compares against TRL")
def test_rl_step_profile_prints_each_kind_for_both_engines() -> None:
    out = run_bench("profile_rl_step.py", "--size", "small", "--steps", "1")
    lines = {line.split("  ")[0].strip(): line for line in out.splitlines()}
    for kind in ("matmul", "attention", "copies", "other operators", "outside operators", "step"):
        ours, trl = lines[kind].split()[-4:-2]
        assert float(ours) >= 0 and float(trl) >= 0, lines[kind]
    # Both engines did work: each multiplied matrices, and each step took time.
    assert all(float(v) > 0 for v in lines["matmul"].split()[-4:-2]), out
    assert "ours' matmuls alone take" in out, out
