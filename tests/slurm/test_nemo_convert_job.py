"""The converter steps' Slurm job is one the local Slurm accepts: the dry-run's script, as the user sees it, passes
`sbatch --test-only` (NeMo's converters themselves need its container and a GPU, which this cluster lacks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm


@pytest.mark.parametrize(
    ("step", "script"),
    [
        ("convert/hf_to_nemo", "convert_llama_hf_to_nemo.py"),
        ("convert/nemo_to_hf", "convert_llama_nemo_to_hf.py"),
    ],
)
def test_the_local_slurm_accepts_the_converter_job(
    home: Path, tmp_path: Path, step: str, script: str
) -> None:
    cmd = [
        sys.executable,
        "-m",
        "nemotron",
        "steps",
        "run",
        step,
        "-c",
        "default",
        "-b",
        "local_slurm",
        "--dry-run",
    ]
    done = subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}, timeout=120
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout[done.stdout.index("#!/bin/bash") :]
    sruns = [line for line in text.splitlines() if line.startswith("srun ")]
    assert len(sruns) == 1 and f"/opt/NeMo/scripts/checkpoint_converters/{script} " in sruns[0]
    assert "#SBATCH hetjob" not in text and "#SBATCH --ntasks-per-node=1" in text  # one task converts
    (tmp_path / "job.sh").write_text(text)
    test = subprocess.run(["sbatch", "--test-only", str(tmp_path / "job.sh")], capture_output=True, text=True)
    assert test.returncode == 0 and "to start" in test.stderr, test.stderr
