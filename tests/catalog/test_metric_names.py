"""Metric names have one source: each RL step's manifest lists `metrics`, a tiny run of the step logs exactly
those, and a manifest or doc may name as a metric only a listed name (a manifest once sent users looking for
`judge_parse_failures`, which no step logs; the step logs `judge/parse_failures`).

A doc names metrics in two ways, both checked: "the `name` metric", and the paragraph that starts "Metric names",
where every name in backticks is a metric (`eval_rm_*` stands for the names it matches)."""

from __future__ import annotations

import json
import re
import tomllib
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import pytest

from nemotron.reward.judge import JudgeClient

ROOT = Path(__file__).resolve().parents[2]
NAMED_METRIC = re.compile(r"`([^`\s]+)` metric")
RL_STEPS = ("rl/ppo", "rl/reinforce", "rl/rlhf", "rl/dpo")


def declared() -> dict[str, list[str]]:
    """Step id -> the metrics its manifest lists."""
    steps = [
        tomllib.loads(p.read_text()).get("step", {}) for p in sorted((ROOT / "manifests").rglob("*.toml"))
    ]
    return {s["id"]: s.get("metrics", []) for s in steps if "id" in s}


def doc_claims() -> list[tuple[str, str]]:
    """(where, name) for every metric name the docs and README name."""
    claims = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        where = str(path.relative_to(ROOT))
        for paragraph in path.read_text().split("\n\n"):
            if paragraph.lstrip().startswith("Metric names"):
                claims += [(where, name) for name in re.findall(r"`([^`\s]+)`", paragraph)]
            claims += [(where, name) for name in NAMED_METRIC.findall(paragraph)]
    return claims


def test_every_rl_step_lists_its_metrics() -> None:
    listed = declared()
    assert all(listed[step] for step in RL_STEPS), {step: listed.get(step) for step in RL_STEPS}


def test_a_manifest_names_only_metrics_its_step_lists() -> None:
    listed = declared()
    claims = []
    for path in sorted((ROOT / "manifests").rglob("*.toml")):
        step = tomllib.loads(path.read_text()).get("step", {}).get("id")
        claims += [(step, name) for name in NAMED_METRIC.findall(path.read_text())]
    assert ("rl/rlhf", "judge/parse_failures") in claims  # the pattern still finds the known mention
    unknown = [(step, name) for step, name in claims if name not in listed.get(step, [])]
    assert unknown == [], f"metrics no step's manifest lists: {unknown}"


def test_docs_name_only_metrics_a_step_lists() -> None:
    every = {name for names in declared().values() for name in names}
    claims = doc_claims()
    assert (
        "docs/rl-engine.md",
        "fraction_of_samples_properly_ended",
    ) in claims  # the paragraph is still found
    unknown = [(where, name) for where, name in claims if not any(fnmatchcase(m, name) for m in every)]
    assert unknown == [], f"metric names no step logs: {unknown}"


def test_the_judge_metrics_rlhf_lists_are_the_judge_clients() -> None:
    judge = {name for name in declared()["rl/rlhf"] if name.startswith("judge/")}
    assert judge == set(JudgeClient("http://127.0.0.1:9").metrics())


@pytest.mark.slow
@pytest.mark.parametrize("step_id", RL_STEPS)
def test_a_tiny_run_logs_exactly_the_listed_metrics(
    step_id: str, tiny_rl_run: Any, request: pytest.FixtureRequest
) -> None:
    """The runs tests/steps/test_rl_steps.py checks, made once for both (tests/conftest.py): the tiny preset of
    rl/reinforce, rl/ppo and rl/dpo, and rl/rlhf in brief with validation at every step (its val_* names)."""
    if step_id == "rl/rlhf":
        done = request.getfixturevalue("brief_rlhf_validated_run")
    else:
        done = tiny_rl_run(step_id)
    assert done.code == 0, done.err[-3000:]
    logged = {
        key for line in (done.job_dir / "metrics.jsonl").read_text().splitlines() for key in json.loads(line)
    }
    # The tiny presets score with the reward model; the judge's names are checked against its client above.
    # token_mult_prob_error compares vLLM's logprobs with the trainer's: logged with generation.backend=vllm only
    # (tests/vllm checks it).
    listed = {name for name in declared()[step_id] if not name.startswith("judge/")} - {
        "token_mult_prob_error"
    }
    assert logged - {"step", "time"} == listed
