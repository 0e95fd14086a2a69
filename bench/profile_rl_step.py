"""Where one RL step's time goes, ours and TRL's, on bench_rl_step.py's workloads: torch.profiler over a few steps
of each engine, the operators grouped by kind.

Run: python bench/profile_rl_step.py --size large --algorithm grpo
     python bench/profile_rl_step.py --size large --model llama
Each engine runs one warm-up step, then ``--steps`` profiled ones, the two alternating step by step as in
bench_rl_step.py. The table gives the seconds per step inside each kind of operator (self time: a kernel's own
time, not its callees') and what is left of the step's wall time outside all operators (Python, autograd, the
trainers' bookkeeping). The last line
is the bound the matrix products set: our step can be no faster than its matmuls, so ours' matmul seconds over
TRL's whole step is the smallest ours/TRL ratio reachable without doing less float32 matmul work.
Profiling adds a little time per operator call on both sides; the ratios of bench_rl_step.py are the figures.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from bench_rl_step import SIZES, workloads
from rl_step_common import MODEL_FAMILIES, BenchModels, load_bench_models
from rl_step_ours import OurRLStep
from rl_step_trl import INSTALL_HINT, run_trl, trl_version
from torch.profiler import ProfilerActivity, profile

# Operator kinds by aten name; the first that matches wins, the rest is "other operators".
KINDS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("matmul", lambda op: op in {"aten::addmm", "aten::mm", "aten::bmm", "aten::addmm_", "aten::baddbmm"}),
    ("attention", lambda op: "scaled_dot_product" in op or "softmax" in op),
    ("activations, mul", lambda op: any(f in op for f in ("gelu", "tanh", "silu", "pow", "aten::mul"))),
    (
        "copies",
        lambda op: op in {"aten::copy_", "aten::cat", "aten::index", "aten::index_put_", "aten::clone"},
    ),
    ("norms", lambda op: "layer_norm" in op or "rms_norm" in op),
    ("optimizer", lambda op: "adam" in op),
)
OTHER, OUTSIDE = "other operators", "outside operators"


def seconds_by_kind(prof: Any) -> dict[str, float]:
    """Self seconds of the profiled aten operators, summed by `KINDS`."""
    totals = dict.fromkeys([kind for kind, _ in KINDS] + [OTHER], 0.0)
    for event in prof.key_averages():
        if not event.key.startswith("aten::"):
            continue
        kind = next((k for k, matches in KINDS if matches(event.key)), OTHER)
        totals[kind] += event.self_cpu_time_total / 1e6
    return totals


class Profiles:
    """Seconds by operator kind and wall seconds, summed over the profiled steps of one engine."""

    def __init__(self) -> None:
        self.kinds = dict.fromkeys([kind for kind, _ in KINDS] + [OTHER], 0.0)
        self.wall = 0.0
        self.running: Any = None
        self.started = 0.0

    def start(self) -> None:
        self.running = profile(activities=[ProfilerActivity.CPU])
        self.running.start()
        self.started = time.perf_counter()

    def stop(self) -> None:
        if self.running is None:
            return
        self.wall += time.perf_counter() - self.started
        self.running.stop()
        for kind, seconds in seconds_by_kind(self.running).items():
            self.kinds[kind] += seconds
        self.running = None


def profile_both(
    workload: Any, models: BenchModels, steps: int, seed: int, workdir: Path
) -> tuple[Profiles, Profiles]:
    """Ours and TRL's profiles over ``steps`` steps each after one warm-up, alternating step by step as
    bench_rl_step.py does, so that other load on the machine falls on both alike. TRL's profile runs from the
    end of one of its steps to the end of the next, so it also holds its work between steps (the next batch)."""
    ours_step = OurRLStep(workload, models, seed)
    ours, trl = Profiles(), Profiles()
    ended = 0

    def between_steps() -> None:
        nonlocal ended
        ended += 1
        trl.stop()
        if ended > 1:
            ours.start()
        ours_step.step()  # the first is the warm-up
        ours.stop()
        if ended <= steps:
            trl.start()

    run_trl(workload, models, steps + 1, seed, workdir, between_steps)
    return ours, trl


def report(ours: Profiles, trl: Profiles, steps: int) -> list[str]:
    rows = []
    for side in (ours, trl):
        kinds = side.kinds | {OUTSIDE: max(0.0, side.wall - sum(side.kinds.values()))}
        rows.append({k: v / steps for k, v in kinds.items()} | {"step": side.wall / steps})
    lines = [f"{'seconds per step':<18} {'ours':>8} {'TRL':>8} {'ours %':>7} {'TRL %':>7}"]
    for kind in rows[0]:
        o, t = rows[0][kind], rows[1][kind]
        lines.append(
            f"{kind:<18} {o:>8.3f} {t:>8.3f} {100 * o / rows[0]['step']:>6.1f}% {100 * t / rows[1]['step']:>6.1f}%"
        )
    bound = rows[0]["matmul"] / rows[1]["step"]
    lines.append(
        f"ours' matmuls alone take {bound:.2f}x TRL's whole step: the lowest ours/TRL ratio this float32 "
        f"matmul work allows (ours/TRL here: {rows[0]['step'] / rows[1]['step']:.2f}x)"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--model", choices=MODEL_FAMILIES, default="gpt2")
    parser.add_argument("--algorithm", choices=("rloo", "grpo"), default="grpo")
    parser.add_argument("--steps", type=int, default=2, help="profiled steps after one warm-up")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if trl_version() is None:
        raise SystemExit(f"this profile compares against TRL, which is not installed: {INSTALL_HINT}")
    torch.set_num_threads(1)
    size = SIZES[args.size]
    [workload] = [w for w in workloads(size) if w.algorithm == args.algorithm]
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="profile-rl-step-") as workdir:
        shape = (size.layers, size.width, size.heads, size.positions)
        models = load_bench_models(args.model, *shape, Path(workdir))
        ours, trl = profile_both(workload, models, args.steps, args.seed, Path(workdir))
    print(
        f"RL step profile, {args.algorithm}, size={args.size}: {models.description}, "
        f"{args.steps} steps each after a warm-up, alternating, 1 thread, load average {load:.2f} at the start"
    )
    print("\n".join(report(ours, trl, args.steps)))


if __name__ == "__main__":
    main()
