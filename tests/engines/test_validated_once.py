"""A compiled job carries its config validated once: the external engines compile `Job.step_model` and never run
the step's schema over the config again on the way to a dry run (or a submit, which renders the same launch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from nemotron.catalog import Catalog
from nemotron.compile import compile_job
from nemotron.launch import submit


class CountedValidate:
    """Stands in for a schema's `model_validate` classmethod: calls the real one and counts the calls."""

    def __init__(self, schema: type[BaseModel]) -> None:
        self.validate = schema.model_validate  # the real classmethod, bound to the schema
        self.calls = 0

    def __call__(self, obj: Any, *args: Any, **kwargs: Any) -> BaseModel:
        self.calls += 1
        return self.validate(obj, *args, **kwargs)


INPUTS = ["inputs.policy=/models/policy", "inputs.prompts=/data/prompts.jsonl"]  # bound as paths on a dry run


@pytest.mark.parametrize(
    ("step", "preset", "overrides"),
    [
        ("rl/ppo", "default", ["backend=nemo_rl"]),
        ("eval/policy", "nemo_rl", INPUTS),
        ("rl/ppo", "nemo_aligner", []),
    ],
)
def test_a_dry_run_on_an_external_engine_validates_the_config_once(
    home: Path, monkeypatch: pytest.MonkeyPatch, step: str, preset: str, overrides: list[str]
) -> None:
    catalog = Catalog()
    schema = catalog.get(step).config_schema()  # the class compile validates with (the catalog loads it once)
    counted = CountedValidate(schema)
    monkeypatch.setattr(schema, "model_validate", counted)
    job = compile_job(catalog, step, preset, overrides, profile_name="slurm_rlhf", mode="batch", dry_run=True)
    assert counted.calls == 1  # compile's, of the composed config
    text = submit.dry_run(job)
    assert (
        f"# backend={job.backend}:" in text
    )  # the engine compiled the job: preflight, plan, engine, render ran
    assert job.backend != "builtin" and counted.calls == 1
