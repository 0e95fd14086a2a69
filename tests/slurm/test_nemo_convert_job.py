"""The converter steps' Slurm job is one the local Slurm accepts: the dry-run's script, as the user sees it, passes
`sbatch --test-only` (NeMo's converters themselves need its container and a GPU, which this cluster lacks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slurm(group="single")  # one job of one or two one-CPU tasks at a time


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


FAKE = Path(__file__).resolve().parents[1] / "fixtures" / "fake_nemo"


def test_a_round_trip_on_the_local_slurm_registers_both_with_lineage(
    home: Path, tmp_path: Path, make_tiny_model: Any
) -> None:
    """The real launch path with tests/fixtures/fake_nemo as NeMo's checkout: each job runs the script, the .nemo
    and then the Hugging Face directory (the template's tokenizer copied in) are registered with lineage."""
    llama = make_tiny_model(tmp_path / "llama", "llama")
    path = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
    (tmp_path / "env.toml").write_text(f"""
[convert]
extends = "local_slurm"
nemo_aligner_image = ""
nemo_dir = "{FAKE}"
env_vars = {{ PATH = "{path}" }}
""")
    env = {**os.environ, "COLUMNS": "200", "NEMOTRON_ENV_FILE": str(tmp_path / "env.toml")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "nemotron", *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)

    done = run("steps", "run", "convert/hf_to_nemo", "-c", "default", f"inputs.checkpoint={llama}",
               "convert.llama31=false", "-r", "convert")  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert "fake NeMo hf_to_nemo: llama31=False precision=bf16" in done.stderr
    done = run("steps", "run", "convert/nemo_to_hf", "-c", "default", "inputs.checkpoint=policy_nemo:latest",
               f"inputs.hf_template={llama}", "-r", "convert")  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    shown = json.loads(run("artifacts", "show", "policy_hf:v1", "--json").stdout)
    assert shown["type"] == "checkpoint_hf"
    out = Path(shown["path"])
    assert (out / "tokenizer.json").read_bytes() == (llama / "tokenizer.json").read_bytes()
    lineage = run("artifacts", "lineage", "policy_hf:v1")
    assert lineage.returncode == 0 and "policy_nemo:v1" in lineage.stdout, lineage.stdout
