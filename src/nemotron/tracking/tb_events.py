"""A NeMo-RL job's metrics for `nemotron jobs sync`: NeMo-RL v0.7.0 writes no metrics.jsonl, its TensorboardLogger
writes them as TensorBoard scalars (`SummaryWriter(log_dir=<logger.log_dir>/tensorboard)`, `add_scalar(name, value,
step)` with names like `train/loss`), and our NeMo-RL engine sets logger.log_dir to `<job_dir>/logs/nemo_rl`. They
are read back with TensorBoard's own reader, under NeMo-RL's names."""

from __future__ import annotations

import math
from pathlib import Path

# Where NeMo-RL's TensorboardLogger writes, under the job dir (engines/nemo_rl/sections.py sets logger.log_dir).
NEMO_RL_EVENTS = Path("logs") / "nemo_rl" / "tensorboard"


def tensorboard_rows(root: Path) -> list[tuple[int, dict[str, float]]]:
    """(step, {name: value}) of every scalar in the event files under `root`, by step. Each directory holding
    event files is one writer's run (a requeued job's attempts write their own files in the same directory, read
    in order); where a step of a name was written twice, the later value stands, as TensorBoard draws it."""
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.util import tensor_util

    dirs = sorted({p.parent for p in root.rglob("events.out.tfevents.*")}) if root.is_dir() else []
    by_step: dict[int, dict[str, float]] = {}
    for d in dirs:
        acc = ea.EventAccumulator(str(d), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
        acc.Reload()
        tags = acc.Tags()
        points = [(tag, e.step, float(e.value)) for tag in tags["scalars"] for e in acc.Scalars(tag)]
        # a writer in TensorBoard's newer format keeps scalars as rank-0 tensors
        for tag in tags["tensors"]:
            for t in acc.Tensors(tag):
                value = tensor_util.make_ndarray(t.tensor_proto)
                if value.size == 1 and value.dtype.kind in "fiub":
                    points.append((tag, t.step, float(value.reshape(()))))
        for tag, step, value in points:
            if math.isfinite(value):  # MLflow takes no inf or nan; metrics.jsonl writes them as null
                by_step.setdefault(int(step), {})[tag] = value
    return sorted(by_step.items())
