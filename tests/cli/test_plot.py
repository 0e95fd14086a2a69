"""`nemotron jobs plot` writes a real PNG of reward, KL and loss curves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nemotron.cli.plotting import plot_metrics
from nemotron.errors import UserError


def test_plot_writes_a_png_with_the_curves(tmp_path: Path) -> None:
    rows = [
        {"step": s, "rewards": s * 0.1, "init_policy_kl": s * 0.01, "actor_loss": 1 / s} for s in range(1, 21)
    ]
    out = plot_metrics(rows, tmp_path / "m.png", title="job")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_plot_refuses_metrics_it_cannot_draw(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no plottable metrics"):
        plot_metrics([{"step": 1, "value": 3.0}], tmp_path / "m.png")
    assert not (tmp_path / "m.png").exists()


def test_jobs_plot_command(home: Path, fixture_steps: Path, run_cli: Any) -> None:
    assert run_cli("steps", "run", "test/count", "-c", "tiny").code == 0
    (job_dir,) = (home / "jobs").iterdir()
    with (job_dir / "metrics.jsonl").open("a") as f:
        for s in range(1, 4):
            f.write(json.dumps({"step": s, "rewards": float(s)}) + "\n")
    r = run_cli("jobs", "plot", job_dir.name)
    assert r.code == 0, r.err
    assert (job_dir / "metrics.png").stat().st_size > 1000
