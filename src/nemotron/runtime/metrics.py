"""Per-step metrics: one JSON object per line in metrics.jsonl (with a `step` key), mirrored to TensorBoard."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("nemotron")


class MetricsLogger:
    def __init__(self, job_dir: Path, tensorboard: bool = True) -> None:
        self.path = job_dir / "metrics.jsonl"
        self._tb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(job_dir / "tensorboard"))
            except ImportError:  # tensorboard is optional at run time
                log.warning("tensorboard is not installed; metrics go to metrics.jsonl only")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row: dict[str, float | int | None] = {"step": step, "time": round(time.time(), 3)}
        row.update({k: (float(v) if math.isfinite(float(v)) else None) for k, v in metrics.items()})
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k, v in metrics.items():
                self._tb.add_scalar(k, float(v), step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def summary_line(step: int, total: int, metrics: dict[str, float], keys: tuple[str, ...]) -> str:
    """`step 3/30 rewards=0.412 init_policy_kl=0.0031`: what the step prints, and what attached runs parse."""
    parts = [f"{k}={metrics[k]:.4g}" for k in keys if k in metrics]
    return f"step {step}/{total} " + " ".join(parts)
