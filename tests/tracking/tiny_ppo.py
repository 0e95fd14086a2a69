"""The tiny rl/ppo run the tracking end-to-end tests make (test_mlflow.py, test_wandb_run.py), and how its job dir
is read back: the metric names and steps a tracker must hold are metrics.jsonl's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# A short rl/ppo: four steps and a small eval keep it to seconds on a busy CPU.
SHORT = ["trainer.max_steps=4", "eval.num_prompts=8", "checkpoint.save_interval=0"]
MLFLOW_EXPERIMENT = "ppo-tracking-test"
WANDB_OFFLINE = [
    "tracking.wandb.enabled=true",
    "tracking.wandb.mode=offline",
    "tracking.wandb.project=ppo-tracking",
]


def job_dirs(env: dict[str, str]) -> list[Path]:
    """The jobs of the home in `env`, oldest first."""
    return sorted((Path(env["NEMOTRON_HOME"]) / "jobs").iterdir(), key=lambda p: p.stat().st_mtime)


def metrics_rows(job_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]


def expected_steps(job_dir: Path) -> dict[str, list[int]]:
    """metric name -> the steps metrics.jsonl has a value for it at."""
    out: dict[str, list[int]] = {}
    for row in metrics_rows(job_dir):
        for k, v in row.items():
            if k not in ("step", "time") and v is not None:
                out.setdefault(k, []).append(row["step"])
    return out
