"""Plots as image files (matplotlib, no display needed): `nemotron jobs plot` (reward, KL and loss curves of a job)
and `nemotron artifacts compare --plot` (the per-prompt score distributions of eval reports)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PANELS = (
    ("reward", ("rewards", "rewards_with_kl", "loss", "accuracy")),
    ("KL to the initial policy", ("init_policy_kl", "kl_loss", "val_loss", "val_accuracy")),
    ("loss", ("actor_loss", "critic_loss", "reward_margin")),
)


def plot_metrics(rows: list[dict[str, Any]], path: Path, title: str = "") -> Path:
    """Draw every known metric present in `rows` (metrics.jsonl) on three panels; write `path` atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 3.6), constrained_layout=True)
    drawn = 0
    for ax, (name, keys) in zip(axes, PANELS, strict=True):
        for key in keys:
            points = [
                (r["step"], r[key])
                for r in rows
                if isinstance(r.get(key), int | float) and r.get("step") is not None
            ]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, label=key, marker="." if len(points) < 40 else None)
                drawn += 1
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    if drawn == 0:
        tmp.unlink(missing_ok=True)
        from nemotron.errors import UserError

        raise UserError("no plottable metrics (rewards, init_policy_kl, actor_loss, loss, ...) in this job")
    tmp.replace(path)
    return path


def plot_distributions(series: list[tuple[str, list[float]]], metric: str, path: Path) -> Path:
    """`nemotron artifacts compare --plot`: each report's per-prompt `metric` as a histogram (shared bins) and an
    empirical CDF, one colour per report; write `path` atomically, in the format its suffix names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from nemotron.errors import UserError

    fig, (hist, ecdf) = plt.subplots(1, 2, figsize=(10, 3.8), constrained_layout=True)
    formats = fig.canvas.get_supported_filetypes()
    suffix = path.suffix.lstrip(".").lower()
    if suffix not in formats:
        plt.close(fig)
        raise UserError(f"--plot {path}: name a file ending in one of .{', .'.join(sorted(formats))}")
    values = [np.asarray(v, dtype=np.float64) for _, v in series]
    everything = np.concatenate(values)
    bins = np.histogram_bin_edges(
        everything, bins=min(30, max(5, len(everything) // max(1, len(series)) // 2))
    )
    for (label, _), v in zip(series, values, strict=True):
        hist.hist(v, bins=bins, histtype="step", linewidth=1.5, label=f"{label} (n={len(v)})")
        xs = np.sort(v)
        ecdf.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", label=label)
    hist.set_title(f"{metric} per prompt")
    hist.set_xlabel(metric)
    hist.set_ylabel("prompts")
    ecdf.set_title("empirical CDF")
    ecdf.set_xlabel(metric)
    ecdf.set_ylabel("fraction of prompts ≤ x")
    for ax in (hist, ecdf):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    tmp = path.with_name(f".{path.name}.tmp{path.suffix}")
    try:
        fig.savefig(tmp, dpi=110)
    finally:
        plt.close(fig)
    tmp.replace(path)
    return path
