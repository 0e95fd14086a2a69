"""`nemotron jobs plot`: reward, KL and loss curves of a job as one PNG (matplotlib, no display needed)."""

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
