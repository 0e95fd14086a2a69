"""data/prep: the tiny task's data, generated from word lists we ship and labelled by a ground-truth scorer.

Every file is a pure function of (task, counts, seed); each gets its own seed so held-out prompts and
preference pairs never repeat training ones by construction of the stream.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from nemotron.data.jsonl import write_jsonl_atomic
from nemotron.runtime.step import StepRun
from nemotron.tasks import get_task

if TYPE_CHECKING:  # mypy reads steps/ as a package root; at run time StepRun loads schema.py beside this file
    from data.prep.schema import Config

log = logging.getLogger("nemotron")


def main() -> None:
    # ---- setup
    run: StepRun[Config] = StepRun.start(__file__)
    cfg = run.config
    run.progress.unwatched("preparing")  # no training steps to time: progress is not watched
    task = get_task(cfg.task.name)
    seed = cfg.runtime.seed

    # ---- generate, write, register
    files: dict[str, Sequence[BaseModel]] = {
        "prompts": task.prompt_records(cfg.task.num_prompts, seed),
        "validation_prompts": task.prompt_records(cfg.task.num_validation_prompts, seed + 1),
        "sft": task.sft_records(cfg.task.num_sft, seed + 2),
        "preferences": task.preference_records(cfg.task.num_preferences, seed + 3),
    }
    paths: dict[str, Path] = {}
    for i, (name, records) in enumerate(files.items(), start=1):
        paths[name] = run.output_dir(name).with_suffix(".jsonl")
        count = write_jsonl_atomic(paths[name], records)
        print(f"step {i}/{len(files)} {name}={count}", flush=True)

    run.log_metrics(1, {f"num_{name}": float(len(records)) for name, records in files.items()})
    run.register_outputs(paths, {"task": task.name, "seed": seed})


if __name__ == "__main__":
    main()
