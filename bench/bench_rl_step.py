"""One rollout + update step of our REINFORCE/RLOO and GRPO against TRL's RLOOTrainer and GRPOTrainer.

Run: python bench/bench_rl_step.py --size small    (CI runs this; under a minute)
     python bench/bench_rl_step.py --size large --steps 5
     python bench/bench_rl_step.py --size small --model llama   (a random Llama of the same shape)
Equal work on both sides: the same policy checkpoint, prompts (in the same order), group size, response
length (every response runs to max_new_tokens), reward (the shipped tiny reward model, called in process
by both) and one optimizer step over the whole batch. The two step alternately, one each, in one process,
so other load on the machine skews both alike. Reports the median of each phase over the measured steps
after warm-up, ours/TRL time ratios, tokens/s, and the achieved fraction of the machine's matmul FLOP/s.
Without trl installed, ours is still measured and the command that installs trl is printed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# TRL rebuilds its reference model from the policy's directory; a local path must never turn into a hub call.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import transformers
from rl_step_common import (
    MODEL_FAMILIES,
    BenchModels,
    StepTiming,
    Workload,
    load_bench_models,
    matmul_parameters,
    median_phases,
)
from rl_step_ours import OurRLStep
from rl_step_trl import INSTALL_HINT, run_trl, trl_version

RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class BenchSize:
    """``layers=None`` is the shipped tiny SFT policy (2 layers, 64 wide, 32 positions), or with
    ``--model llama`` a random Llama of that shape."""

    layers: int | None
    width: int
    heads: int
    positions: int
    max_new_tokens: int
    steps: int
    warmup: int


SIZES = {
    "small": BenchSize(layers=None, width=64, heads=4, positions=32, max_new_tokens=16, steps=5, warmup=1),
    "large": BenchSize(layers=4, width=256, heads=4, positions=128, max_new_tokens=64, steps=3, warmup=1),
}


def workloads(size: BenchSize) -> list[Workload]:
    """The tiny presets' shapes: rl/reinforce 16 prompts x 4, rl/rlhf 8 prompts x 8; 64 rows either way."""
    n = size.max_new_tokens
    return [
        Workload("rloo", prompts_per_step=16, group_size=4, max_new_tokens=n, lr=1e-3, kl_coef=0.05),
        Workload("grpo", prompts_per_step=8, group_size=8, max_new_tokens=n, lr=5e-4, kl_coef=0.2),
    ]


def peak_matmul_flops(n: int = 1024, repeats: int = 8) -> float:
    """Best FLOP/s of an ``n x n`` float32 matmul on the current thread count (2 n^3 FLOPs each)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = max(best, 2 * n**3 / (time.perf_counter() - start))
    return best


@dataclass(frozen=True)
class SideSummary:
    """Medians over the measured steps of one engine."""

    engine: str
    seconds: dict[str, float]
    generate_tokens_per_s: float
    train_tokens_per_s: float
    fraction_of_peak: dict[str, float]
    generated_tokens: int
    batch_tokens: int


def summarise(
    engine: str, steps: list[StepTiming], matmul_params: int, peak: float, threads: int
) -> SideSummary:
    """Medians of the phases, tokens/s, and fractions of the matmul peak.

    FLOPs are the model FLOPs of the work itself, ~2 x matmul params per token forward and ~6 forward +
    backward: generation 2, reference logprobs 2, training 6, so a step is 10 (TRL's extra no-grad forward
    of RLOO is overhead, not counted). ``step`` divides by the step's CPU seconds per thread, the time it
    really ran; the wall-time fractions (``step_wall``, ``generate``, ``train``) also count time spent
    waiting for other jobs' processes.
    """

    def median(values: list[float]) -> float:
        return statistics.median(values)

    per_token = matmul_params / peak
    return SideSummary(
        engine=engine,
        seconds=median_phases(steps),
        generate_tokens_per_s=median([s.generated_tokens / s.generate for s in steps]),
        train_tokens_per_s=median([s.batch_tokens / max(s.train, 1e-9) for s in steps]),
        fraction_of_peak={
            "step": median([10 * per_token * s.batch_tokens / (s.cpu / threads) for s in steps]),
            "step_wall": median([10 * per_token * s.batch_tokens / s.total for s in steps]),
            "generate": median([2 * per_token * s.batch_tokens / s.generate for s in steps]),
            "train": median([6 * per_token * s.batch_tokens / max(s.train, 1e-9) for s in steps]),
        },
        generated_tokens=int(median([float(s.generated_tokens) for s in steps])),
        batch_tokens=int(median([float(s.batch_tokens) for s in steps])),
    )


def measure(
    workload: Workload, models: BenchModels, size: BenchSize, steps: int, seed: int, workdir: Path
) -> tuple[list[StepTiming], list[StepTiming] | None]:
    """Ours and TRL's per-step timings (warm-up steps dropped); TRL's is None when trl is not installed."""
    ours = OurRLStep(workload, models, seed)
    our_steps: list[StepTiming] = []
    total = size.warmup + steps
    if trl_version() is None:
        our_steps = [ours.step() for _ in range(total)]
        return our_steps[size.warmup :], None
    trl_steps = run_trl(workload, models, total, seed, workdir, lambda: our_steps.append(ours.step()))
    return our_steps[size.warmup :], trl_steps[size.warmup :]


def equal_work(ours: list[StepTiming], trl: list[StepTiming], workload: Workload) -> bool:
    """Every step on both sides generated rows x max_new_tokens tokens from the same prompt tokens."""
    expected = workload.rows * workload.max_new_tokens
    return all(
        o.generated_tokens == t.generated_tokens == expected and o.prompt_tokens == t.prompt_tokens
        for o, t in zip(ours, trl, strict=True)
    )


def table(rows: list[dict[str, Any]]) -> str:
    header = (
        f"{'algorithm':<9} {'engine':<14} {'step s':>8} {'cpu s':>7} {'generate s':>10} {'logprobs s':>10} "
        f"{'reward s':>8} {'train s':>8} {'gen tok/s':>10} {'train tok/s':>11} {'% peak':>7}"
    )
    # % peak: model FLOPs of the step over its CPU time per thread (see summarise).
    lines = [header]
    for row in rows:
        for side in ("ours", "trl"):
            s: SideSummary | None = row[side]
            if s is None:
                lines.append(f"{row['algorithm']:<9} {'trl':<14} not installed: {INSTALL_HINT}")
                continue
            sec = s.seconds
            lines.append(
                f"{row['algorithm']:<9} {s.engine:<14} {sec['total']:>8.3f} {sec['cpu']:>7.3f} {sec['generate']:>10.3f} "
                f"{sec['logprobs']:>10.3f} {sec['reward']:>8.3f} {sec['train']:>8.3f} "
                f"{s.generate_tokens_per_s:>10.0f} {s.train_tokens_per_s:>11.0f} "
                f"{100 * s.fraction_of_peak['step']:>6.2f}%"
            )
        if row["ratio"] is not None:
            r = row["ratio"]
            lines.append(
                f"{row['algorithm']:<9} {'ours/TRL':<14} {r['total']:>7.2f}x {r['cpu']:>6.2f}x {r['generate']:>9.2f}x "
                f"{r['logprobs']:>9.2f}x {r['reward']:>7.2f}x {r['train']:>7.2f}x"
            )
    return "\n".join(lines)


def compare(
    workload: Workload,
    ours: list[StepTiming],
    trl_steps: list[StepTiming] | None,
    trl: str | None,
    matmul_params: int,
    peak: float,
    threads: int,
) -> dict[str, Any]:
    """One table entry: both sides' summaries, the ours/TRL ratio of each phase, and the raw steps."""
    ours_summary = summarise("nemotron", ours, matmul_params, peak, threads)
    trl_summary = (
        None if trl_steps is None else summarise(f"trl {trl}", trl_steps, matmul_params, peak, threads)
    )
    ratio = None
    if trl_summary is not None:
        ratio = {k: ours_summary.seconds[k] / max(trl_summary.seconds[k], 1e-9) for k in ours_summary.seconds}
    return {
        "algorithm": workload.algorithm,
        "workload": asdict(workload),
        "ours": ours_summary,
        "trl": trl_summary,
        "ratio": ratio,
        "equal_work": None if trl_steps is None else equal_work(ours, trl_steps, workload),
        "ours_steps": [asdict(s) for s in ours],
        "trl_steps": None if trl_steps is None else [asdict(s) for s in trl_steps],
    }


def verdicts(rows: list[dict[str, Any]], trl: str | None) -> list[str]:
    lines = []
    for row in rows:
        if row["equal_work"] is False:
            lines.append(
                f"WARNING {row['algorithm']}: the two sides did different work (token counts differ)"
            )
        if row["ratio"] is not None:
            r, cpu = row["ratio"]["total"], row["ratio"]["cpu"]
            verdict = "met" if r <= 0.5 else f"missed by {r / 0.5:.2f}x"
            lines.append(
                f"{row['algorithm']}: ours takes {r:.2f}x TRL's step time, {cpu:.2f}x its CPU time "
                f"(target <= 0.50x: {verdict})"
            )
    if trl is None:
        lines.append(f"trl is not installed, so only ours was measured. Install it with: {INSTALL_HINT}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--model", choices=MODEL_FAMILIES, default="gpt2", help="gpt2 or a random llama")
    parser.add_argument(
        "--steps", type=int, default=None, help="measured steps after warm-up (default per size)"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads, for both engines and the peak"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where the JSON goes")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    size = SIZES[args.size]
    steps = args.steps or size.steps
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    # transformers 5 renamed gradient_checkpointing; TRL 1.16 still uses the old name internally.
    warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*deprecated", category=FutureWarning)
    # transformers 5.24 renamed forward's past_key_values to cache; a caller that still passes the old name
    # warns (it works until 5.40). Our rollout runs GPT-2 and Llama through its lean forwards, which take neither.
    warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated", category=FutureWarning)
    load_before = os.getloadavg()
    peaks = [peak_matmul_flops()]
    trl = trl_version()

    measured = []
    with tempfile.TemporaryDirectory(prefix="bench-rl-step-") as workdir:
        shape = (size.layers, size.width, size.heads, size.positions)
        models = load_bench_models(args.model, *shape, Path(workdir))
        probe = models.load_policy()
        matmul_params = matmul_parameters([(n, p.dim(), p.numel()) for n, p in probe.named_parameters()])
        params = sum(p.numel() for p in probe.parameters())
        print(
            f"RL step, size={args.size}: {models.description} ({params / 1e6:.2f}M params, "
            f"{matmul_params / 1e6:.2f}M in matmuls), {size.max_new_tokens} new tokens per response, "
            f"threads={args.threads}, median of {steps} steps after {size.warmup} warm-up"
            + (", alternating with TRL step by step" if trl else "")
        )
        for workload in workloads(size):
            measured.append((workload, *measure(workload, models, size, steps, args.seed, Path(workdir))))
    # Other jobs can slow one peak measurement down; the best of two, before and after, is the machine's.
    peaks.append(peak_matmul_flops())
    peak = max(peaks)
    load_after = os.getloadavg()
    rows = [
        compare(w, ours, trl_steps, trl, matmul_params, peak, args.threads) for w, ours, trl_steps in measured
    ]
    print(
        f"peak matmul {peak / 1e9:.1f} GFLOP/s on {args.threads} thread(s); load average {load_before[0]:.2f} "
        f"before, {load_after[0]:.2f} after ({os.cpu_count()} CPUs); trl {trl or 'not installed'}"
    )
    print(table(rows))
    print("\n".join(verdicts(rows, trl)))
    if max(load_before[0], load_after[0]) + args.threads > (os.cpu_count() or 1):
        print(
            f"note: other jobs share the {os.cpu_count()} CPUs (load average above); wall times stretch with "
            "them, the CPU-time ratio is the steadier one"
        )

    args.results_dir.mkdir(parents=True, exist_ok=True)
    family = "" if args.model == "gpt2" else f"{args.model}_"
    out = args.results_dir / f"rl_step_{family}{args.size}_{time.strftime('%Y%m%d-%H%M%S')}.json"
    record = {
        "size": args.size,
        "config": asdict(size),
        "steps": steps,
        "threads": args.threads,
        "peak_matmul_flops": peak,
        "peak_measurements": peaks,
        "params": params,
        "matmul_params": matmul_params,
        "model": models.description,
        "model_family": args.model,
        "machine": {
            "cpus": os.cpu_count(),
            "load_average_before": load_before,
            "load_average_after": load_after,
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": trl,
        },
        "results": [
            {**row, "ours": asdict(row["ours"]), "trl": None if row["trl"] is None else asdict(row["trl"])}
            for row in rows
        ],
    }
    out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
