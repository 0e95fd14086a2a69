"""The eval_report's files: one JSON line per prompt, and the summary of every metric.

Written with sorted keys and no clock, host or job directory in them, so the same inputs and settings give the
same bytes (what `artifacts compare` reads, and what the reproducibility test compares).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nemotron.policy_eval.stats import bootstrap_interval, corpus_distinct_n

FORMAT = 1  # bump when the layout below changes, so a reader can tell reports apart
# The per-prompt metrics eval/policy may write, in the order its summary and `artifacts compare` list them
# (distinct_N follow, one per scorers.distinct_n).
METRICS = (
    "reward_model",
    "baseline_reward_model",
    "task_score",
    "task_well_formed",
    "math_correct",
    "math_parsed",
    "win_rate",
    "response_length",
    "truncated",
)


def summarise(
    rows: Sequence[Mapping[str, Any]],
    metrics: Sequence[str],
    *,
    resamples: int,
    level: float,
    seed: int,
) -> dict[str, dict[str, float | int]]:
    """Each metric's mean and bootstrap interval over the rows that carry it."""
    out = {}
    for name in metrics:
        values = [float(r[name]) for r in rows if r.get(name) is not None]
        if values:
            out[name] = bootstrap_interval(values, resamples=resamples, level=level, seed=seed).as_dict()
    return out


def corpus_metrics(responses: Sequence[str], ns: Sequence[int]) -> dict[str, float]:
    return {f"distinct_{n}": corpus_distinct_n(responses, n) for n in ns}


def write_report(
    directory: Path, rows: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]
) -> dict[str, Path]:
    """responses.jsonl and summary.json in `directory`; their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    responses = directory / "responses.jsonl"
    responses.write_text("".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows))
    path = directory / "summary.json"
    path.write_text(json.dumps({"format": FORMAT, **summary}, sort_keys=True, indent=2) + "\n")
    return {"responses": responses, "summary": path}
