"""The resource plan against measured memory (issue 30): for each configuration, one real `nemotron steps run sft`
on the CPU from a checkpoint directory, its `peak_memory_mb` (the step process's peak resident set, as every
step reports it) against the plan's predicted peak for the policy's training process (`plan.json` in the same
job directory). Every sequence is max_length tokens long, so the plan's upper bound is the real shape.

Run: python bench/memory_plan.py                      (3 families x tiny/small x fp32/bf16 x checkpointing off/on:
                                                       24 runs, ~10 min on 2 cores; writes the table in
                                                       docs/benchmarks.md between its markers)
     python bench/memory_plan.py --families llama --sizes small --json out.json   (a subset, no docs edit)
     python bench/memory_plan.py --families llama --sizes small --device cuda --json out.json   (on a GPU: the
                                                       measured peak is torch.cuda.max_memory_allocated; scripts/gpu-check.sh)
     python bench/memory_plan.py --rl                 (the RL table: rl/reinforce on a 76M Llama with prompts of
                                                       2,201, 241 and 4 tokens, ~9 min on 2 cores)
     python bench/memory_plan.py --table-from out.json [--replan]                 (the docs table from a run;
                                                       --replan: the plan of this code against those measurements)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"
BEGIN, END = "<!-- memory-plan:begin -->", "<!-- memory-plan:end -->"
RL_BEGIN, RL_END = "<!-- memory-plan-rl:begin -->", "<!-- memory-plan-rl:end -->"
# (layers, hidden, heads): tiny is the tiny preset's shape; small is >= 50M parameters in every family
SIZES = {"tiny": (2, 64, 4), "small": (16, 512, 8)}
FAMILIES = ("gpt2", "llama", "qwen2")
PRECISIONS = ("fp32", "bf16")
MAX_LENGTH, BATCH = 128, 16  # 2,048 tokens per step, in one forward/backward (sft has no micro-batches)
TOLERANCE = 0.25


def write_data(root: Path) -> Path:
    """SFT records whose prompt + response exceed MAX_LENGTH tokens of the shipped tokenizer (cut to it)."""
    tiny = [
        json.loads(line) for line in (REPO / "src/nemotron/shipped/tiny/sft.jsonl").read_text().splitlines()
    ]
    words = " ".join(r["response"] for r in tiny).split()
    path = root / "long_sft.jsonl"
    with path.open("w") as f:
        for i in range(64):
            response = " ".join(words[(i * 7 + j) % len(words)] for j in range(2 * MAX_LENGTH))
            f.write(json.dumps({"prompt": tiny[i % len(tiny)]["prompt"], "response": response}) + "\n")
    return path


def write_checkpoint(root: Path, family: str, size: str) -> Path:
    return write_model(root / f"{family}-{size}", family, SIZES[size], MAX_LENGTH)


def write_model(out: Path, family: str, shape: tuple[int, int, int], positions: int) -> Path:
    """A random model of (layers, hidden, heads) with the shipped tokenizer at `out`, made once."""
    layers, hidden, heads = shape
    if not out.exists():
        subprocess.run(
            [sys.executable, "-m", "nemotron.models.tiny", str(out), "--family", family, "--layers", str(layers),
             "--hidden", str(hidden), "--heads", str(heads), "--positions", str(positions)],
            check=True, capture_output=True,
        )  # fmt: skip
    return out


def write_rl_prompts(root: Path, words: int) -> Path:
    """Prompts of `words` words of the tiny task (one token each in the shipped tokenizer, `=>` one more)."""
    tiny = [
        json.loads(line) for line in (REPO / "src/nemotron/shipped/tiny/sft.jsonl").read_text().splitlines()
    ]
    vocabulary = " ".join(r["response"] for r in tiny).split()
    path = root / f"prompts_{words}.jsonl"
    with path.open("w") as f:
        for i in range(8):
            f.write(
                json.dumps(
                    {"prompt": " ".join(vocabulary[(i * 7 + j) % len(vocabulary)] for j in range(words))}
                )
            )
            f.write("\n")
    return path


@dataclass(frozen=True)
class Case:
    """One configuration of the table: a model, how it trains, and where."""

    family: str
    size: str  # a key of SIZES
    precision: str
    checkpointing: bool
    device: str = "cpu"
    max_length: int = MAX_LENGTH

    def sft_args(self, root: Path) -> list[str]:
        """The `nemotron` arguments of its sft run (2 steps, from a checkpoint written under `root`)."""
        return [
            "steps", "run", "sft", "-c", "tiny", f"inputs.init_from={write_checkpoint(root, self.family, self.size)}",
            f"inputs.data={root / 'long_sft.jsonl'}", "trainer.max_steps=2", "trainer.log_interval=2",
            f"trainer.global_batch_size={BATCH}", f"trainer.max_length={self.max_length}",
            "trainer.validation_fraction=0.02", f"runtime.precision={self.precision}",
            f"runtime.gradient_checkpointing={str(self.checkpointing).lower()}", f"runtime.device={self.device}",
        ]  # fmt: skip


# The RL table (issue 43): a Llama with its real 2,048-token context trained by rl/reinforce on prompts that fill it
# (cut to 2,048 - max_new_tokens, as the step cuts them) and on prompts of about 256 tokens; 2 responses of 16 new
# tokens to one prompt a step, one micro-batch of both, the reward model in the trainer (one process to measure).
RL_SIZES = {"76m": (18, 512, 8), "small": (6, 256, 4)}
RL_MAX_NEW = 16


@dataclass(frozen=True)
class RLCase:
    """One rl/reinforce configuration: a Llama of RL_SIZES[size] with `positions` positions, prompts of `words`."""

    size: str
    positions: int
    words: int

    def args(self, root: Path) -> list[str]:
        out = write_model(
            root / f"llama-{self.size}-{self.positions}", "llama", RL_SIZES[self.size], self.positions
        )
        return [
            "steps", "run", "rl/reinforce", "-c", "tiny", f"inputs.policy={out}",
            f"inputs.prompts={write_rl_prompts(root, self.words)}", "reward.source=in_process", "trainer.max_steps=2",
            "trainer.num_prompts_per_step=1", "reinforce.num_rollouts_per_prompt=2", "trainer.micro_batch_size=2",
            f"generation.max_new_tokens={RL_MAX_NEW}", "eval.num_prompts=0", "checkpoint.save_interval=100",
        ]  # fmt: skip


def measure_rl(root: Path, case: RLCase) -> dict[str, object]:
    """One rl/reinforce run of 2 steps: the measured peak against the plan's policy training group."""
    job = _run(root, case.args(root))
    rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    group = next(
        g for g in json.loads((job / "plan.json").read_text())["groups"] if g["name"] == "policy training"
    )
    return {
        "size": case.size,
        "parameters": group["models"][0]["parameters"],
        "positions": case.positions,
        "words": case.words,
        "sequence": group["notes"][0],
        "predicted_mb": round(group["peak_mb"], 1),
        "measured_mb": round(max(r["peak_memory_mb"] for r in rows if "peak_memory_mb" in r), 1),
        "terms_mb": {k: round(v, 1) for k, v in group["terms_mb"].items()},
    }


def rl_table(results: list[dict[str, object]]) -> str:
    lines = ["| model | parameters | positions | longest prompt | sequence | predicted MiB | measured MiB | error |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in results:
        error = float(r["predicted_mb"]) / float(r["measured_mb"]) - 1  # type: ignore[arg-type]
        note = str(
            r["sequence"]
        )  # the plan's note: "prompts: N tokens (...) + M new tokens...: S-token sequences"
        prompt = note.removeprefix("prompts: ").split(" ", 1)[0]
        sequence = note.rsplit(": ", 1)[1].split("-", 1)[0]
        lines.append(f"| llama {r['size']} | {int(r['parameters']):,} | {int(r['positions']):,} | {prompt} | "  # type: ignore[call-overload]
                     f"{sequence} | {r['predicted_mb']:,.0f} | {r['measured_mb']:,.0f} | {error:+.0%} |")  # fmt: skip
    return "\n".join(lines)


def _run(root: Path, args: list[str]) -> Path:
    """Run `nemotron ARGS` with its home under `root`; the job directory it made."""
    home = root / "home"
    before = set((home / "jobs").iterdir()) if (home / "jobs").exists() else set()
    env = {**os.environ, "NEMOTRON_HOME": str(home)}
    proc = subprocess.run([sys.executable, "-m", "nemotron", *args], capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"{' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    (job,) = set((home / "jobs").iterdir()) - before
    return job


def replan(root: Path, result: dict[str, object]) -> dict[str, object]:
    """`result` with the plan of the code here (no run): the measured peak does not depend on the plan's code."""
    from nemotron.catalog import Catalog
    from nemotron.compile import compile_job
    from nemotron.plan.groups import plan_job
    from nemotron.plan.placement import Placement

    case = Case(str(result["family"]), str(result["size"]), str(result["precision"]), bool(result["checkpointing"]),
                str(result.get("device", "cpu")))  # fmt: skip
    args = case.sft_args(root)
    job = compile_job(Catalog(), "sft", "tiny", overrides=args[5:], dry_run=True)
    group = plan_job(job, Placement("", 1, 0, here=True)).groups[0]
    terms = {k: round(v, 1) for k, v in group.terms_mb.items()}
    return {**result, "predicted_mb": comparable(group.peak_mb, group.terms_mb, str(result.get("device", "cpu"))),
            "terms_mb": terms}  # fmt: skip


def comparable(peak_mb: float, terms_mb: dict[str, float], device: str) -> float:
    """The plan's figure to set against the measured peak. On the CPU, the predicted peak resident set. On CUDA,
    the peak less its `runtime` term (the CUDA context, NCCL and the caching allocator's slack), which
    torch.cuda.max_memory_allocated does not count: the bytes the model terms put through the allocator."""
    return round(peak_mb - (terms_mb.get("runtime", 0.0) if device == "cuda" else 0.0), 1)


def measure(root: Path, case: Case) -> dict[str, object]:
    """One sft run of 2 steps: the measured peak and the plan's prediction, in MiB. A shorter `case.max_length`
    than the table's (every record is cut to it) keeps the same model at a fraction of the compute."""
    job = _run(root, case.sft_args(root))
    rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    measured = max(r["peak_memory_mb"] for r in rows if "peak_memory_mb" in r)
    plan = json.loads((job / "plan.json").read_text())
    group = plan["groups"][0]
    return {
        "family": case.family,
        "size": case.size,
        "device": case.device,
        "parameters": group["models"][0]["parameters"],
        "precision": case.precision,
        "checkpointing": case.checkpointing,
        "predicted_mb": comparable(group["peak_mb"], group["terms_mb"], case.device),
        "measured_mb": round(measured, 1),
        "terms_mb": {k: round(v, 1) for k, v in group["terms_mb"].items()},
    }


def table(results: list[dict[str, object]]) -> str:
    lines = [
        "| model | parameters | precision | activation checkpointing | predicted MiB | measured MiB | error |",
        "|---|---:|---|---|---:|---:|---:|",
    ]
    for r in results:
        error = float(r["predicted_mb"]) / float(r["measured_mb"]) - 1  # type: ignore[arg-type]
        lines.append(
            f"| {r['family']} {r['size']} | {int(r['parameters']):,} | {r['precision']} | "  # type: ignore[call-overload]
            f"{'on' if r['checkpointing'] else 'off'} | {r['predicted_mb']:,.0f} | {r['measured_mb']:,.0f} | "
            f"{error:+.0%} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    parser.add_argument("--checkpointing", nargs="+", default=["off", "on"], choices=["off", "on"])
    parser.add_argument(
        "--json", type=Path, help="write the results here instead of editing docs/benchmarks.md"
    )
    parser.add_argument(
        "--device", default="cpu", choices=["cpu", "cuda"], help="where the runs train (runtime.device)"
    )
    parser.add_argument("--table-from", type=Path, help="write docs/benchmarks.md's table from a --json file")
    parser.add_argument(
        "--replan", action="store_true", help="with --table-from: the predictions of this code"
    )
    parser.add_argument("--rl", action="store_true", help="the RL table instead: rl/reinforce on a 76M Llama with "
                        "prompts that fill its 2,048 positions, 241-token and 4-token ones (~9 min on 2 cores)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.rl:
        return run_rl(args.json)
    if args.table_from:
        results: list[dict[str, object]] = json.loads(args.table_from.read_text())
        if args.replan:
            with tempfile.TemporaryDirectory() as tmp:
                write_data(Path(tmp))
                results = [replan(Path(tmp), r) for r in results]
    else:
        results = run(args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(table(results))
    else:
        text = DOC.read_text()
        head, _, rest = text.partition(BEGIN)
        _, _, tail = rest.partition(END)
        DOC.write_text(f"{head}{BEGIN}\n{table(results)}\n{END}{tail}")
    worst = max(abs(float(r["predicted_mb"]) / float(r["measured_mb"]) - 1) for r in results)  # type: ignore[arg-type]
    print(f"worst error {worst:+.0%} (tolerance ±{TOLERANCE:.0%})")
    return 0 if worst <= TOLERANCE else 1


def run_rl(out: Path | None) -> int:
    """The RL table: the three prompt lengths on the 76M Llama, into `out` or docs/benchmarks.md."""
    with tempfile.TemporaryDirectory() as tmp:
        results = []
        for words in (
            2200,
            240,
            3,
        ):  # cut to 2,048 - 16 tokens; 241 tokens; 4 (the tiny task's prompts' length)
            results.append(measure_rl(Path(tmp), RLCase("76m", 2048, words)))
            print(json.dumps(results[-1]), flush=True)
    if out:
        out.write_text(json.dumps(results, indent=2) + "\n")
    else:
        text = DOC.read_text()
        head, _, rest = text.partition(RL_BEGIN)
        _, _, tail = rest.partition(RL_END)
        DOC.write_text(f"{head}{RL_BEGIN}\n{rl_table(results)}\n{RL_END}{tail}")
    print(rl_table(results))
    worst = max(abs(float(r["predicted_mb"]) / float(r["measured_mb"]) - 1) for r in results)  # type: ignore[arg-type]
    print(f"worst error {worst:+.0%} (tolerance ±{TOLERANCE:.0%})")
    return 0 if worst <= TOLERANCE else 1


def run(args: argparse.Namespace) -> list[dict[str, object]]:
    """Every configuration the arguments name, one sft run each."""
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_data(root)
        for family, size, precision, ckpt in itertools.product(
            args.families, args.sizes, args.precisions, args.checkpointing
        ):
            results.append(measure(root, Case(family, size, precision, ckpt == "on", args.device)))
            print(json.dumps(results[-1]), flush=True)
    return results


if __name__ == "__main__":
    raise SystemExit(main())
