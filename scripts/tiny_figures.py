"""Run the tiny pipeline in a fresh home and record its figures: docs/figures/tiny_pipeline.json (with the date, the
CPU, the thread count and the command) and the README's tables between their markers: each RL step's own
before/after evaluation, and the pipeline's verdict (its eval/policy reports side by side, as `pipeline run` prints
them). The pipeline test checks that every run, on any CPU, lands within the tolerances written here.

    python scripts/tiny_figures.py            # about 2 minutes on 2 cores
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from nemotron.docs.generate import measured_on, splice, write_figures

REPO = Path(__file__).resolve().parents[1]
FIGURES = REPO / "docs" / "figures" / "tiny_pipeline.json"
PAGE = README = REPO / "README.md"
RL_STEPS = {"rl-reinforce": "rl/reinforce (RLOO)", "rl-ppo": "rl/ppo", "rl-rlhf": "rl/rlhf (GRPO)"}
METRICS = ("rm", "gt", "well_formed")
# rl/dpo's own validation on its held-out preference pairs (val_* at step 0 and at its last step).
DPO_STEP, DPO_METRICS = "rl-dpo", ("accuracy", "loss")
# Across CPUs torch promises no bitwise equality (kernels differ by ISA); these bounds held on the CPUs we ran.
TOLERANCE = {"rm": 1.0, "gt": 0.15, "well_formed": 0.35, "accuracy": 0.1, "loss": 0.15}
BEGIN, END = "<!-- tiny-figures:begin -->", "<!-- tiny-figures:end -->"


def collect(home: Path) -> dict[str, dict[str, float]]:
    """Each RL step's eval figures from its metrics.jsonl: {step: {rm_before, rm_after, ...}}."""
    out: dict[str, dict[str, float]] = {}
    for job in sorted((home / "jobs").iterdir()):
        step = job.name.rsplit("-", 3)[0]
        if step not in RL_STEPS:
            continue
        merged: dict[str, float] = {}
        for line in (job / "metrics.jsonl").read_text().splitlines():
            merged.update(json.loads(line))
        out[step] = {
            f"{m}_{when}": round(float(merged[f"eval_{m}_{when}"]), 3)
            for m in METRICS
            for when in ("before", "after")
        }
    return out


def collect_dpo(home: Path) -> dict[str, float]:
    """rl/dpo's validation before its first step and after its last: {accuracy_before, ..., loss_after}."""
    (job,) = (home / "jobs").glob(f"{DPO_STEP}-*")
    rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    validated = [r for r in rows if "val_accuracy" in r]
    first, last = validated[0], validated[-1]
    return {
        f"{m}_{when}": round(float(row[f"val_{m}"]), 3)
        for m in DPO_METRICS
        for when, row in (("before", first), ("after", last))
    }


def collect_verdict(home: Path) -> dict[str, Any]:
    """The pipeline's final table as `pipeline run` computes it (the pipeline once more, every step skipped as
    done): nemotron.launch.pipeline.verdict's record, `artifacts compare` of the eval reports."""
    os.environ["NEMOTRON_HOME"] = str(home)
    from nemotron.artifacts.store import ArtifactStore
    from nemotron.catalog import Catalog
    from nemotron.launch.pipeline import eval_reports, load_pipeline, run_pipeline, verdict

    catalog = Catalog()
    pipe = load_pipeline("tiny", catalog)
    store = ArtifactStore(home / "artifacts")

    def ran_already(job: Any) -> int:
        raise RuntimeError(f"{job.step_id} had not run: the pipeline run above left it undone")

    results = run_pipeline(pipe, catalog, store, ran_already)
    return verdict(eval_reports(pipe, results), pipe.pipeline.compare, store, home / "jobs")


def eval_seconds(home: Path) -> int:
    """Wall seconds of the pipeline's eval/policy jobs, from their status records."""
    total = 0.0
    for job in (home / "jobs").glob("eval-policy-*"):
        status = json.loads((job / "status.json").read_text())
        start, end = (datetime.fromisoformat(status[k]) for k in ("started_at", "ended_at"))
        total += (end - start).total_seconds()
    return round(total)


def table(figures: dict[str, dict[str, float]]) -> str:
    rows = [
        "| step | RM before → after | GT before → after | well-formed before → after |",
        "|---|---|---|---|",
    ]
    for step, label in RL_STEPS.items():
        f = figures[step]
        rows.append(
            f"| {label} | "
            + " | ".join(f"{f[m + '_before']:.2f} → {f[m + '_after']:.2f}" for m in METRICS)
            + " |"
        )
    return "\n".join(rows)


def dpo_table(figures: dict[str, float]) -> str:
    return "\n".join(
        [
            "| step | val_accuracy before → after | val_loss before → after |",
            "|---|---|---|",
            "| rl/dpo | "
            + " | ".join(f"{figures[m + '_before']:.3f} → {figures[m + '_after']:.3f}" for m in DPO_METRICS)
            + " |",
        ]
    )


def verdict_table(verdict: dict[str, Any]) -> str:
    """The verdict as Markdown, its cells from the same function as `pipeline run`'s final table."""
    from nemotron.launch.pipeline import verdict_cells

    header, rows = verdict_cells(verdict)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def render(record: dict[str, Any]) -> str:
    note = (
        f"Measured {record['date']} on {record['cpu']} ({record['cores']} cores, load average {record['load']} "
        f"at the start), pipeline {record['pipeline_seconds']} s (its eval/policy stages "
        f"{record['eval_seconds']} s), by "
        "`python scripts/tiny_figures.py`. Each RL step's own evaluation, before and after training (64 "
        "prompts, sampled):"
    )
    dpo = (
        "rl/dpo learns from the preference pairs alone (no reward model, no sampling); its own validation on the "
        "pairs it holds out, before its first step and after its last (val_accuracy: the share of pairs whose "
        "chosen response gets the higher reward, the policy's log-ratio to its reference; before training the "
        "policy is its reference, so every pair ties and none counts):"
    )
    verdict = (
        "The pipeline's verdict, its last table: `eval/policy` on each policy, on the 64 held-out validation "
        "prompts, greedy. `win_rate` is against the SFT policy with the tiny reward model as the judge (SFT "
        "against itself is 0.5 exactly), `reward_model` the same model's score, `task_score` and "
        "`task_well_formed` the task's ground truth; each a mean with its bootstrap 95% interval, and Δ the difference "
        "from SFT over the same prompts (`nemotron artifacts compare`'s paired bootstrap), higher or lower when its "
        "95% interval excludes 0:"
    )
    return (
        f"{note}\n\n{table(record['steps'])}\n\n{dpo}\n\n{dpo_table(record['dpo'])}\n\n{verdict}\n\n"
        f"{verdict_table(record['verdict'])}\n"
    )


def update_page(page: str, record: dict[str, Any]) -> str:
    return splice(page, BEGIN, END, render(record), str(PAGE))


def main() -> int:
    machine = measured_on()
    command = [sys.executable, "-m", "nemotron", "pipeline", "run", "tiny"]
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        env = {**os.environ, "NEMOTRON_HOME": str(home)}
        started = time.monotonic()
        subprocess.run(command, env=env, check=True, cwd=tmp)
        seconds = round(time.monotonic() - started)
        figures = collect(home)
        dpo = collect_dpo(home)
        verdict = collect_verdict(home)
        evals = eval_seconds(home)
    record = {
        **machine,
        "pipeline_seconds": seconds,
        "eval_seconds": evals,
        "command": "nemotron pipeline run tiny",
        "tolerance": TOLERANCE,
        "steps": figures,
        "dpo": dpo,
        "verdict": verdict,
    }
    write_figures(FIGURES, record, PAGE, update_page(PAGE.read_text(), record))
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
